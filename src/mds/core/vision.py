"""Image geometry of the model being trained: how an image of (height, width) pixels is
resized, into how many encoder patches it is cut, and how many backbone (LLM) tokens it
becomes. Shared by the planner (costs, capacities) and the executor (decode to the planned
grid), so both compute the same numbers from the same config.

The "smart" rule is Qwen2-VL's `smart_resize` (also Qwen2.5-VL's and their successors'):
each side rounded to a multiple of patch_size x merge_size, the area clamped to
[min_pixels, max_pixels] keeping the aspect ratio. The "fixed" rule resizes every image to
one size (LLaVA / SigLIP style). An image is one temporal frame repeated to
temporal_patch_size, so its grid is (1, h, w) in patches; it feeds the backbone
h * w / merge_size^2 tokens, plus one vision-start and one vision-end token when the
model has them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from mds.errors import ConfigError

__all__ = ["MAX_ASPECT", "RESIZE_RULES", "VisionGeometry", "smart_resize", "split_segments"]

RESIZE_RULES = ("smart", "fixed")
MAX_ASPECT = 200  # Qwen2-VL refuses images more elongated than this
# CLIP's normalisation, the default of Qwen2-VL's image processor
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's smart_resize: (height, width) rounded to multiples of `factor`, the area
    clamped to [min_pixels, max_pixels], aspect ratio kept as closely as possible."""
    if min(height, width) <= 0 or max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(f"image of {width}x{height} pixels: aspect ratio above {MAX_ASPECT}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _smart_resize_arrays(
    height: np.ndarray, width: np.ndarray, factor: int, min_pixels: int, max_pixels: int
) -> tuple[np.ndarray, np.ndarray]:
    """smart_resize over arrays, the same float64 operations in the same order (numpy rounds
    half to even, as Python's round does), so every element equals the scalar result."""
    h = height.astype(np.float64)
    w = width.astype(np.float64)
    h_bar = np.round(h / factor).astype(np.int64) * factor
    w_bar = np.round(w / factor).astype(np.int64) * factor
    big = h_bar * w_bar > max_pixels
    small = ~big & (h_bar * w_bar < min_pixels)
    beta = np.sqrt((h * w) / max_pixels)
    big_h = np.maximum(factor, np.floor(h / beta / factor).astype(np.int64) * factor)
    big_w = np.maximum(factor, np.floor(w / beta / factor).astype(np.int64) * factor)
    beta = np.sqrt(min_pixels / (h * w))
    small_h = np.ceil(h * beta / factor).astype(np.int64) * factor
    small_w = np.ceil(w * beta / factor).astype(np.int64) * factor
    h_out = np.where(big, big_h, np.where(small, small_h, h_bar))
    w_out = np.where(big, big_w, np.where(small, small_w, w_bar))
    return h_out, w_out


@dataclass(frozen=True)
class VisionGeometry:
    """The `[vision]` config: what the model's image processor and encoder do to an image."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 14 * 14 * 4 * 1280
    resize: str = "smart"
    image_size: tuple[int, int] | None = None  # (height, width), the "fixed" rule's
    image_token_id: int = 151655  # Qwen2-VL's <|image_pad|>
    vision_start_id: int | None = 151652
    vision_end_id: int | None = 151653
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD
    marker: str = "<image>"  # where in a sample's text its images go, in order
    extras: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @property
    def wrap_tokens(self) -> int:
        """Backbone tokens around each image's placeholders (vision start and end)."""
        return int(self.vision_start_id is not None) + int(self.vision_end_id is not None)

    @property
    def patch_dim(self) -> int:
        """Values per patch row of pixel_values: channels x temporal x patch x patch."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """Pixels (height, width) the image is resized to."""
        if self.resize == "fixed":
            assert self.image_size is not None
            return self.image_size
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)

    def grid(self, height: int, width: int) -> tuple[int, int, int]:
        """(t, h, w) in patches for an image of (height, width) pixels."""
        rh, rw = self.resized(height, width)
        return 1, rh // self.patch_size, rw // self.patch_size

    def grids(self, height: np.ndarray, width: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Patch grids (h, w) of many images at once (t is 1 for an image)."""
        if self.resize == "fixed":
            assert self.image_size is not None
            n = len(height)
            return (
                np.full(n, self.image_size[0] // self.patch_size, np.int64),
                np.full(n, self.image_size[1] // self.patch_size, np.int64),
            )
        rh, rw = _smart_resize_arrays(
            np.asarray(height), np.asarray(width), self.factor, self.min_pixels, self.max_pixels
        )
        return rh // self.patch_size, rw // self.patch_size

    def image_tokens(self, grid_h: np.ndarray | int, grid_w: np.ndarray | int):
        """Backbone tokens of an image of that patch grid: its merged patches plus the wrap."""
        return grid_h * grid_w // (self.merge_size * self.merge_size) + self.wrap_tokens

    def to_json(self) -> dict[str, Any]:
        """The canonical form the plan footer records (the executor rebuilds it from this)."""
        out = asdict(self)
        out.pop("extras")
        out["image_mean"] = list(self.image_mean)
        out["image_std"] = list(self.image_std)
        out["image_size"] = list(self.image_size) if self.image_size is not None else None
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "[vision]") -> VisionGeometry:
        """Build and validate from a `[vision]` table or a plan footer's copy of one; every
        error names the key."""
        known = {f for f in cls.__dataclass_fields__ if f != "extras"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(sorted(known))}")
        values = dict(data)
        for key in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels", "max_pixels"):
            if key in values:
                v = values[key]
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ConfigError(f"{where}.{key}: {v!r} is not a positive integer")
        for key in ("image_token_id", "vision_start_id", "vision_end_id"):
            v = values.get(key, 0)
            if key != "image_token_id" and v == -1:
                values[key] = v = None  # TOML has no null: -1 says the model has no such token
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ConfigError(f"{where}.{key}: {v!r} is not a token id (an integer >= 0)")
        resize = values.get("resize", "smart")
        if resize not in RESIZE_RULES:
            raise ConfigError(f"{where}.resize: {resize!r}; use one of {', '.join(RESIZE_RULES)}")
        for key in ("image_mean", "image_std"):
            if key in values:
                v = values[key]
                if not isinstance(v, list | tuple) or len(v) != 3 or not all(
                    isinstance(x, int | float) and not isinstance(x, bool) for x in v
                ):
                    raise ConfigError(f"{where}.{key}: {v!r} is not a list of 3 numbers")
                if key == "image_std" and any(x <= 0 for x in v):
                    raise ConfigError(f"{where}.image_std: {v!r} has a value <= 0")
                values[key] = tuple(float(x) for x in v)
        size = values.get("image_size")
        if size is not None:
            if (
                not isinstance(size, list | tuple)
                or len(size) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in size)
            ):
                raise ConfigError(f"{where}.image_size: {size!r} is not [height, width] in pixels")
            values["image_size"] = (int(size[0]), int(size[1]))
        if "marker" in values and (not isinstance(values["marker"], str) or not values["marker"]):
            raise ConfigError(f"{where}.marker: {values['marker']!r} is not a non-empty string")
        geometry = cls(**values)
        if geometry.resize == "fixed":
            if geometry.image_size is None:
                raise ConfigError(f'{where}.image_size: required with resize = "fixed"')
            if any(x % geometry.factor for x in geometry.image_size):
                raise ConfigError(
                    f"{where}.image_size: {list(geometry.image_size)} is not a multiple of "
                    f"patch_size x merge_size = {geometry.factor}"
                )
        elif geometry.min_pixels > geometry.max_pixels:
            raise ConfigError(
                f"{where}.min_pixels: {geometry.min_pixels} is above max_pixels ({geometry.max_pixels})"
            )
        return geometry


def split_segments(text: str, marker: str) -> list[str]:
    """A sample's text cut at its image markers: images go between the pieces, in order.
    Both sides count and tokenize the pieces one by one, so their token counts agree."""
    return text.split(marker)
