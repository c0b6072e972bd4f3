"""Images of vision-language samples into what the model's vision encoder takes: decoded to
RGB, resized to the plan's geometry, rescaled, normalised and cut into patches, in exactly
the layout of transformers' Qwen2-VL image processor (`Qwen2VLImageProcessorPil`).

Per image, the processor does: convert to RGB (an image with an alpha channel, or a
palette with a transparent colour, composited onto white), resize to
`VisionGeometry.resized(h, w)` with Pillow's BICUBIC filter on uint8, `x.astype(float64) *
(1/255)` cast to float32, `(x - mean) / std` in float32, and patchify: rows of
(grid_h/merge, grid_w/merge, merge, merge) patches, each row (channel, temporal, patch_y,
patch_x) with the frame repeated `temporal_patch_size` times. Rescale and normalise depend
on a pixel's value and channel alone, so they are one float32 table of 3 x 256 entries
computed with the same operations: the result is the processor's, bit for bit.

JPEGs are decoded with simplejpeg (libjpeg-turbo) when it is installed, everything else
(and JPEGs simplejpeg does not take, such as CMYK) with Pillow. `MDS_IMAGE_DECODER`
(`auto`, the default; `pillow`; `simplejpeg`) chooses, read at each decode. Pillow and
simplejpeg are imported on first use, so `import mds.executor` does not load them.
EXIF orientation is not applied: the image is used as stored, the size its header gives
(the size the index read and the plan was made with).
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

from mds.core.vision import VisionGeometry
from mds.errors import ConfigError, SourceDataError, install_hint

__all__ = ["DECODERS", "decode", "decoder", "patchify", "process"]

DECODERS = ("auto", "pillow", "simplejpeg")
_JPEG = b"\xff\xd8\xff"

_simplejpeg: Any = None  # the module, False when not installed, None before the first try


def decoder() -> str:
    """`MDS_IMAGE_DECODER`, checked."""
    value = os.environ.get("MDS_IMAGE_DECODER", "auto").strip().lower() or "auto"
    if value not in DECODERS:
        raise ConfigError(f"MDS_IMAGE_DECODER={value!r}: use one of {', '.join(DECODERS)}")
    return value


def _load_simplejpeg() -> Any:
    global _simplejpeg
    if _simplejpeg is None:
        try:
            import simplejpeg

            _simplejpeg = simplejpeg
        except ImportError:
            _simplejpeg = False
    return _simplejpeg


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise ConfigError(
            f"decoding images needs Pillow (and simplejpeg): {install_hint('vision')}"
        ) from None
    return Image


def _with_simplejpeg(data: bytes, where: str) -> np.ndarray | None:
    """RGB uint8 (H, W, 3) of a JPEG by simplejpeg, or None where Pillow should decode it
    (not installed, a colour space it does not convert to RGB as Pillow does)."""
    sj = _load_simplejpeg()
    if not sj:
        if decoder() == "simplejpeg":
            raise ConfigError("MDS_IMAGE_DECODER=simplejpeg, but simplejpeg is not installed")
        return None
    try:
        _h, _w, space, _sub = sj.decode_jpeg_header(data)
        if space not in ("Gray", "YCbCr", "RGB"):
            return None  # CMYK, YCCK: Pillow's conversion
        return sj.decode_jpeg(data, colorspace="RGB")
    except (ValueError, RuntimeError, OSError):
        return None  # Pillow decodes it, or names what is wrong


def decode(data: bytes, where: str) -> np.ndarray:
    """An encoded image as RGB uint8 `(H, W, 3)`, converted as the Qwen2-VL processor
    converts a PIL image; SourceDataError naming `where` if it cannot be decoded."""
    use = decoder()
    if use != "pillow" and data[:3] == _JPEG:
        rgb = _with_simplejpeg(data, where)
        if rgb is not None:
            return rgb
    Image = _pillow()
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return np.asarray(to_rgb(image))
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SourceDataError(f"{where}: cannot decode the image ({reason})") from None


def to_rgb(image: Any) -> Any:
    """A PIL image as RGB, as transformers' `convert_to_rgb` does it: an alpha channel or a
    transparent palette colour composited onto white."""
    Image = _pillow()
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        image = image.convert("RGBA")
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image).convert("RGB")
    return image.convert("RGB")


_TABLES: dict[tuple, np.ndarray] = {}


def _table(geometry: VisionGeometry) -> np.ndarray:
    """float32 [3 * 256]: entry c * 256 + v is pixel value v of channel c rescaled and
    normalised with the processor's operations and dtypes."""
    key = (geometry.image_mean, geometry.image_std)
    table = _TABLES.get(key)
    if table is None:
        v = (np.arange(256, dtype=np.uint8).astype(np.float64) * (1 / 255)).astype(np.float32)
        mean = np.array(geometry.image_mean, dtype=np.float32)
        std = np.array(geometry.image_std, dtype=np.float32)
        table = ((v[None, :] - mean[:, None]) / std[:, None]).astype(np.float32).ravel()
        table.flags.writeable = False
        _TABLES[key] = table
    return table


def patchify(rgb: np.ndarray, geometry: VisionGeometry, out: np.ndarray | None = None) -> np.ndarray:
    """Patch rows float32 `[grid_h * grid_w, 3 * T * p * p]` of an RGB uint8 image already at
    its resized size (multiples of patch_size x merge_size), written into `out` if given
    (a slice of the micro-batch's pixel_values: no copy of the rows afterwards)."""
    p, m, t = geometry.patch_size, geometry.merge_size, geometry.temporal_patch_size
    h, w, _c = rgb.shape
    gh, gw = h // p, w // p
    n = gh * gw
    if out is None:
        out = np.empty((n, 3 * t * p * p), dtype=np.float32)
    # (gh/m, m, p, gw/m, m, p, C) -> (gh/m, gw/m, m, m, C, p, p): the processor's order,
    # reordered as bytes (a quarter of the float rows' size) before the table lookup
    x = rgb.reshape(gh // m, m, p, gw // m, m, p, 3).transpose(0, 3, 1, 4, 6, 2, 5)
    pixels = np.ascontiguousarray(x).reshape(n, 3, p * p)
    rows = out.reshape(n, 3, t, p * p)
    table = _table(geometry).reshape(3, 256)
    for c in range(3):
        np.take(table[c], pixels[:, c], out=rows[:, c, 0])
    if t > 1:  # the frame repeated to temporal_patch_size
        rows[:, :, 1:] = rows[:, :, :1]
    return out


def resized_rgb(data: bytes, geometry: VisionGeometry, where: str) -> np.ndarray:
    """An encoded image decoded and resized to its planned size, RGB uint8 `[h, w, 3]`."""
    rgb = decode(data, where)
    h, w = rgb.shape[:2]
    try:
        rh, rw = geometry.resized(h, w)
    except ValueError as exc:
        raise SourceDataError(f"{where}: {exc}") from None
    if (rh, rw) != (h, w):  # Pillow returns a copy at the same size: no resize needed
        Image = _pillow()
        rgb = np.asarray(Image.fromarray(rgb).resize((rw, rh), resample=Image.Resampling.BICUBIC))
    return rgb


def process(data: bytes, geometry: VisionGeometry, where: str) -> tuple[np.ndarray, int, int]:
    """(patch rows, grid_h, grid_w) of one encoded image (`resized_rgb`, `patchify`)."""
    rgb = resized_rgb(data, geometry, where)
    p = geometry.patch_size
    return patchify(rgb, geometry), rgb.shape[0] // p, rgb.shape[1] // p
