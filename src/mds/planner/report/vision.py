"""The image-text part of a plan's report: encoder and backbone balance side by side (each
against its own lower bound and against naive sharding), patches per step and per
micro-batch, and per image-text source its images and their patch counts, histogrammed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mds.core.vision import VisionGeometry
from mds.errors import MdsError
from mds.planner.index.tables import source_table
from mds.planner.plan.vision import IMAGE_COLUMNS, is_image_text
from mds.planner.report.common import plan_index, ratio, summary

__all__ = ["PATCH_BINS", "patch_histogram", "vision_report"]

# Histogram edges of patches per image: powers of 4 from 1 to 16384, then anything above.
PATCH_BINS = [4**k for k in range(8)]


def patch_histogram(patches: np.ndarray) -> list[dict[str, int]]:
    """Images per bin [lo, hi) of PATCH_BINS (the last bin is open above)."""
    edges = np.array(PATCH_BINS + [np.iinfo(np.int64).max], dtype=np.int64)
    counts = np.histogram(patches, bins=edges)[0] if len(patches) else np.zeros(len(PATCH_BINS), int)
    return [
        {"from": int(lo), "to": int(hi) if i + 1 < len(PATCH_BINS) else None, "images": int(c)}
        for i, (lo, hi, c) in enumerate(zip(edges[:-1], edges[1:], counts, strict=True))
    ]


def _parts(col: dict[str, np.ndarray]) -> dict[str, Any]:
    enc, cost = col["encoder_cost"], col["cost"]
    parts = {
        "encoder": ("max_rank_encoder", "encoder_lower_bound", "naive_max_rank_encoder"),
        "backbone": ("max_rank_backbone", "backbone_lower_bound", "naive_max_rank_backbone"),
        "sum": ("max_rank_cost", "lower_bound", "naive_max_rank_cost"),
    }
    out: dict[str, Any] = {}
    for name, (top, bound, naive) in parts.items():
        out[name] = {
            "max_over_lower_bound": summary(ratio(col[top], col[bound])),
            "naive_over_lower_bound": summary(ratio(col[naive], col[bound])),
        }
    out["encoder_share"] = float(enc.sum() / cost.sum()) if cost.sum() else 0.0
    return out


def _sources(plan: Path, footer: dict[str, Any], geometry: VisionGeometry, index: str | Path | None):
    """Per planned image-text source: samples, images, images per sample, patch histogram;
    from the index (None where it cannot be found: the rest of the report does not need it)."""
    try:
        manifest = plan_index(plan, footer, index)
    except MdsError:
        return None
    out = []
    for s in footer["config"]["sources"]:
        entry = next((e for e in manifest.sources if e["name"] == s["name"]), None)
        if entry is None or not is_image_text(entry):
            continue
        table = source_table(manifest, s["name"], lambda schema: list(IMAGE_COLUMNS))
        counts = table["n_images"].to_numpy()
        widths = table["image_width"].explode().drop_nulls().to_numpy()
        heights = table["image_height"].explode().drop_nulls().to_numpy()
        gh, gw = geometry.grids(heights, widths)
        patches = gh * gw
        out.append(
            {
                "name": s["name"],
                "samples": int(table.height),
                "images": int(counts.sum()),
                "without_images": int((counts == 0).sum()),
                "images_per_sample": float(counts.mean()) if table.height else 0.0,
                "patches_per_image": summary(patches),
                "patch_histogram": patch_histogram(patches),
            }
        )
    return out


def vision_report(
    plan: Path, col: dict[str, np.ndarray], footer: dict[str, Any], index: str | Path | None
) -> dict[str, Any] | None:
    """The report's "vision" entry; None for a plan made without [vision]."""
    vision = footer["config"].get("vision")
    if vision is None or "encoder_cost" not in col:
        return None
    geometry = VisionGeometry.from_json(vision, "plan footer: vision")
    capacity = footer["config"]["train"].get("max_patches_per_micro_batch")
    return {
        "geometry": vision,
        "encoder_cost": footer["config"]["cost"].get("encoder"),
        "balance": _parts(col),
        "patches": {
            "per_step": summary(col["patches"]),
            "capacity": capacity,
            "max_micro_batch": summary(col["max_micro_patches"]),
            "max_micro_batch_fill": summary(ratio(col["max_micro_patches"], capacity))
            if capacity
            else None,
        },
        "sources": _sources(plan, footer, geometry, index),
    }
