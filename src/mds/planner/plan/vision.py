"""Image-text samples in the plan: from the index's image sizes and the model's geometry,
each sample's backbone length (text + image tokens), its encoder patches and the two parts
of its cost.

An image of H x W pixels becomes a grid of gh x gw patches (src/mds/core/vision.py); its
P = gh*gw patches cost the encoder a*P + b*P^2 (full attention inside the image) and give
the backbone P / merge^2 tokens plus the vision start and end tokens. A sample's backbone
length L is what packing, the token capacity and the backbone cost (a*L + b*L^2 of [cost])
use; its patches are what the patch capacity uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from mds.core.vision import MAX_ASPECT, VisionGeometry
from mds.errors import PlanError

__all__ = ["IMAGE_COLUMNS", "ImageParts", "image_parts", "is_image_text"]

IMAGE_COLUMNS = ("n_images", "image_width", "image_height")


def is_image_text(entry: dict) -> bool:
    """Whether a manifest source holds image-text samples."""
    return (entry.get("payload") or {}).get("kind") == "image_text"


@dataclass
class ImageParts:
    """Per index row of one source: backbone tokens of its images, and its encoder patches
    (sum of P, sum of P^2 over its images)."""

    image_tokens: np.ndarray  # int64
    patches: np.ndarray  # int64
    patches_sq: np.ndarray  # int64

    def encoder_cost(self, a: float, b: float, pos=slice(None)) -> np.ndarray:
        """a * sum(P) + b * sum(P^2) per sample, float64 (exact integer sums first)."""
        return a * self.patches[pos].astype(np.float64) + b * self.patches_sq[pos].astype(np.float64)


def _flat(column: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """A list<int> column as (values, offsets), nulls as empty lists."""
    arr = column.to_arrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    counts = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    values = pc.list_flatten(arr).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return values, offsets


def _per_sample(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    cs = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=cs[1:])
    return cs[offsets[1:]] - cs[offsets[:-1]]


def image_parts(table: pl.DataFrame, geometry: VisionGeometry, name: str) -> ImageParts:
    """Every row's image tokens and patches, from its `image_width` / `image_height` lists."""
    widths, offsets = _flat(table["image_width"])
    heights, check = _flat(table["image_height"])
    if not np.array_equal(offsets, check):
        row = int(np.flatnonzero(np.diff(offsets) != np.diff(check))[0])
        raise PlanError(f"source '{name}' row {row}: image_width and image_height differ in length")
    if len(widths):
        small, large = np.minimum(widths, heights), np.maximum(widths, heights)
        bad = (small <= 0) | (large > MAX_ASPECT * np.maximum(small, 1))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            row = int(np.searchsorted(offsets, i, side="right") - 1)
            raise PlanError(
                f"source '{name}' row {row}: an image of {widths[i]}x{heights[i]} pixels cannot "
                f"be resized (a side of 0, or an aspect ratio above {MAX_ASPECT}); filter it out"
            )
    gh, gw = geometry.grids(heights, widths)
    p = gh * gw
    tokens = geometry.image_tokens(gh, gw)
    return ImageParts(_per_sample(tokens, offsets), _per_sample(p, offsets), _per_sample(p * p, offsets))
