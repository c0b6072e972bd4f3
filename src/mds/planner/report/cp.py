"""The context-parallel part of a plan's report: the CP settings, the samples split and
their padding, and per layout (mds, head-tail everywhere, contiguous) the CP-rank imbalance
(busiest / mean per micro-batch) and the DP x CP step time over its lower bound
(src/mds/planner/plan/cp.py, docs/context-parallel.md)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mds.planner.report.common import ratio, summary

__all__ = ["cp_report"]

LAYOUT_COLUMNS = {
    "mds": ("cp_max_rank_work", "cp_imbalance_ppm"),
    "headtail": ("cp_headtail_max_rank_work", "cp_headtail_imbalance_ppm"),
    "contiguous": ("cp_contiguous_max_rank_work", "cp_contiguous_imbalance_ppm"),
}


def cp_report(col: dict[str, np.ndarray], footer: dict[str, Any]) -> dict[str, Any] | None:
    """The report's "cp" entry; None for a plan made without cp_size > 1."""
    train = footer["config"]["train"]
    if train.get("cp_size", 1) <= 1 or "cp_max_rank_work" not in col:
        return None
    bound = col["cp_lower_bound"]
    samples, tokens = int(col["samples"].sum()), int(col["tokens"].sum())
    split, padding = int(col["cp_split_samples"].sum()), int(col["cp_padding"].sum())
    return {
        "cp_size": train["cp_size"],
        "split_from": train["cp_split_from"],
        "linear": train["cp_linear"],
        "samples_split": split,
        "split_share": split / samples if samples else 0.0,
        "padding_tokens": padding,
        "padding_share": padding / tokens if tokens else 0.0,
        "layouts": {
            name: {
                "imbalance": summary(col[ppm] / 1e6),
                "step_over_lower_bound": summary(ratio(col[top], bound)),
                "step_time_over_mds": float(col[top].sum() / col["cp_max_rank_work"].sum())
                if col["cp_max_rank_work"].sum()
                else 1.0,
            }
            for name, (top, ppm) in LAYOUT_COLUMNS.items()
        },
    }
