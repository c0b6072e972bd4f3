"""The "cp" entry of a plan's report, from the stats columns of a CP plan."""

from __future__ import annotations

import numpy as np
import pytest

from mds.planner.plan.cp import CP_STAT_COLUMNS
from mds.planner.report.cp import cp_report


def _col(**values) -> dict[str, np.ndarray]:
    base = {name: np.zeros(2, dtype=np.int64) for name in CP_STAT_COLUMNS}
    base["samples"] = np.array([4, 6])
    base["tokens"] = np.array([1000, 1000])
    base.update({k: np.asarray(v, dtype=np.int64) for k, v in values.items()})
    return base


def _footer(cp: int) -> dict:
    train = {"cp_size": cp, "cp_split_from": 64, "cp_linear": 10} if cp > 1 else {}
    return {"config": {"train": train}}


def test_no_entry_without_cp() -> None:
    assert cp_report(_col(), _footer(1)) is None
    assert cp_report({"samples": np.zeros(1)}, _footer(4)) is None  # stats without CP columns


def test_ratios_shares_and_layouts() -> None:
    col = _col(
        cp_max_rank_work=[110, 200],
        cp_lower_bound=[100, 0],  # an empty step's bound: ratio 1
        cp_headtail_max_rank_work=[105, 220],
        cp_contiguous_max_rank_work=[150, 300],
        cp_imbalance_ppm=[1_100_000, 1_000_000],
        cp_headtail_imbalance_ppm=[1_000_000, 1_000_000],
        cp_contiguous_imbalance_ppm=[1_500_000, 1_300_000],
        cp_split_samples=[1, 2],
        cp_padding=[5, 15],
    )
    r = cp_report(col, _footer(4))
    assert (r["cp_size"], r["split_from"], r["linear"]) == (4, 64, 10)
    assert r["samples_split"] == 3 and r["split_share"] == pytest.approx(0.3)
    assert r["padding_tokens"] == 20 and r["padding_share"] == pytest.approx(0.01)
    mds, ht, contig = (r["layouts"][k] for k in ("mds", "headtail", "contiguous"))
    assert mds["step_over_lower_bound"]["max"] == pytest.approx(1.1)
    assert mds["step_over_lower_bound"]["min"] == 1.0
    assert mds["imbalance"]["mean"] == pytest.approx(1.05)
    assert contig["imbalance"]["max"] == pytest.approx(1.5)
    assert mds["step_time_over_mds"] == 1.0
    assert ht["step_time_over_mds"] == pytest.approx(325 / 310)
    assert contig["step_time_over_mds"] == pytest.approx(450 / 310)
