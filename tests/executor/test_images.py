"""Images into patches (`mds.executor.images`) against transformers' Qwen2-VL image processor:
the same pixel_values and grid for images of several sizes, aspect ratios and modes."""

from __future__ import annotations

import io

import numpy as np
import pytest

from mds.core.vision import VisionGeometry
from mds.errors import ConfigError, SourceDataError
from mds.executor import images

Image = pytest.importorskip("PIL.Image")


def encode(image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kwargs)
    return buf.getvalue()


def picture(h: int, w: int, mode: str, seed: int = 0):
    """A noisy gradient of (h, w) pixels in `mode` (noise alone makes JPEG's job unreal)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) * 3 % 256], -1)
    rgb = np.clip(rgb + rng.integers(-30, 30, rgb.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(rgb)
    if mode == "RGBA":
        image = image.convert("RGBA")
        image.putalpha(Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8)))
    elif mode == "P+transparency":
        image = image.convert("P")
        image.info["transparency"] = 3
    elif mode != "RGB":
        image = image.convert(mode)
    return image


CASES = [
    (100, 150, "RGB", "PNG"),
    (33, 500, "L", "PNG"),  # thin: the min_pixels side of smart_resize
    (640, 480, "RGBA", "PNG"),  # alpha onto white
    (77, 91, "P", "PNG"),
    (60, 70, "P+transparency", "PNG"),
    (90, 90, "LA", "PNG"),
    (300, 200, "RGB", "JPEG"),
    (201, 333, "L", "JPEG"),
    (56, 56, "RGB", "PNG"),  # already a multiple of 28: no resize
    (1000, 30, "RGB", "WEBP"),
    (900, 1200, "RGB", "JPEG"),  # above max_pixels: scaled down
]


@pytest.fixture(scope="module")
def reference():
    mod = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    geometry = VisionGeometry(min_pixels=56 * 56, max_pixels=28 * 28 * 256)
    processor = mod.Qwen2VLImageProcessorPil(
        min_pixels=geometry.min_pixels,
        max_pixels=geometry.max_pixels,
        patch_size=geometry.patch_size,
        merge_size=geometry.merge_size,
        temporal_patch_size=geometry.temporal_patch_size,
    )
    return geometry, processor


@pytest.mark.parametrize(("h", "w", "mode", "fmt"), CASES)
def test_same_as_qwen2_vl_processor(reference, monkeypatch, h, w, mode, fmt):
    """Bit for bit (tolerance 0): the same Pillow resize on the same uint8 pixels, then the
    processor's own float64-then-float32 rescale and float32 normalise, tabulated."""
    monkeypatch.setenv("MDS_IMAGE_DECODER", "pillow")
    geometry, processor = reference
    data = encode(picture(h, w, mode), fmt)
    with Image.open(io.BytesIO(data)) as image:
        want = processor(image, return_tensors="np")
    got, gh, gw = images.process(data, geometry, "x")
    assert got.dtype == np.float32
    assert got.shape == want["pixel_values"].shape == (gh * gw, geometry.patch_dim)
    assert [[1, gh, gw]] == want["image_grid_thw"].tolist()
    assert (1, gh, gw) == geometry.grid(h, w)
    np.testing.assert_array_equal(got, want["pixel_values"])


def test_other_geometry(monkeypatch):
    """Patch 16, merge 1, temporal 1, other mean and std, and a fixed size."""
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    monkeypatch.setenv("MDS_IMAGE_DECODER", "pillow")
    geometry = VisionGeometry(
        patch_size=16,
        merge_size=1,
        temporal_patch_size=1,
        min_pixels=32 * 32,
        max_pixels=160 * 160,
        image_mean=(0.5, 0.5, 0.5),
        image_std=(0.5, 0.5, 0.5),
    )
    processor = Qwen2VLImageProcessorPil(
        min_pixels=geometry.min_pixels,
        max_pixels=geometry.max_pixels,
        patch_size=16,
        merge_size=1,
        temporal_patch_size=1,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    data = encode(picture(123, 321, "RGB"), "PNG")
    with Image.open(io.BytesIO(data)) as image:
        want = processor(image, return_tensors="np")
    got, gh, gw = images.process(data, geometry, "x")
    np.testing.assert_array_equal(got, want["pixel_values"])
    assert [[1, gh, gw]] == want["image_grid_thw"].tolist()

    fixed = VisionGeometry(resize="fixed", image_size=(56, 84))
    got, gh, gw = images.process(data, fixed, "x")
    assert (gh, gw) == (4, 6) and got.shape == (24, fixed.patch_dim)


@pytest.mark.parametrize("subsampling", ["4:2:0", "4:2:2", "4:4:4"])
def test_simplejpeg_matches_pillow(monkeypatch, subsampling):
    """Both are libjpeg-turbo with the accurate DCT and fancy upsampling: measured identical
    here; allowed to differ by a rounding step of the IDCT across library versions."""
    pytest.importorskip("simplejpeg")
    data = encode(picture(257, 381, "RGB", seed=3), "JPEG", quality=85, subsampling=subsampling)
    monkeypatch.setenv("MDS_IMAGE_DECODER", "pillow")
    a = images.decode(data, "x").astype(np.int16)
    monkeypatch.setenv("MDS_IMAGE_DECODER", "simplejpeg")
    b = images.decode(data, "x").astype(np.int16)
    assert a.shape == b.shape == (257, 381, 3)
    assert np.abs(a - b).max() <= 1


def test_gray_and_png_through_auto(monkeypatch):
    """auto: a grayscale JPEG comes out RGB from simplejpeg as from Pillow; a PNG goes to
    Pillow."""
    monkeypatch.setenv("MDS_IMAGE_DECODER", "auto")
    gray = encode(picture(40, 50, "L"), "JPEG")
    assert images.decode(gray, "x").shape == (40, 50, 3)
    assert images.decode(encode(picture(40, 50, "RGBA"), "PNG"), "x").shape == (40, 50, 3)


def test_errors(monkeypatch):
    with pytest.raises(SourceDataError, match=r"^shard.tar sample 'k' jpg: cannot decode"):
        images.decode(b"\xff\xd8\xff\xe0 not really a jpeg", "shard.tar sample 'k' jpg")
    with pytest.raises(SourceDataError, match="cannot decode"):
        images.decode(b"GIF89a", "x")
    monkeypatch.setenv("MDS_IMAGE_DECODER", "turbo")
    with pytest.raises(ConfigError, match="MDS_IMAGE_DECODER='turbo'"):
        images.decode(b"", "x")
