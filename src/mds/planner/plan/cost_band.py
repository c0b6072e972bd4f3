"""How far a plan's predicted speedup leans on the built-in default cost.

Without `[cost]` the planner balances a*L + b*L^2 with a = 1, b = 1/24576 (the a:b of a
causal model with hidden size 4096). A real model's quadratic weight can be several times
larger or smaller (bench/README.md, bench_real_model.py: 8x larger for a small Llama on
CPU), so for such plans `mds plan` also evaluates the plan it made, and the naive deal of
the same samples, under b x BAND_FACTORS: per step, each rank's load from its samples'
lengths, the most-loaded rank, summed over steps. The footer's `cost_band` holds the
predicted speedup vs naive under each factor; `mds plan` and `mds inspect` show their range
next to the speedup. Plans with any other cost, with [vision] or with cp_size > 1 have no
band (their step time model is not a*L + b*L^2 per rank).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mds.planner.plan.bounds import naive_ranks

__all__ = ["BAND_FACTORS", "band_applies", "band_loads", "band_range", "cost_band"]

BAND_FACTORS = (0.25, 0.5, 2.0, 4.0)


def band_applies(config: Any) -> bool:
    """Whether a plan of `config` records the band: the built-in default cost, no [vision],
    no context parallelism."""
    return (
        config.cost.origin == "default" and config.vision is None and config.train.cp_size == 1
    )


def band_loads(
    rank: np.ndarray, length: np.ndarray, valid: np.ndarray, steps: np.ndarray, D: int, cost: Any
) -> np.ndarray:
    """[steps, 2 x len(BAND_FACTORS)] float64: per step, for each factor f, the most-loaded
    rank's a*L + f*b*L^2 of the plan (`rank`) and then of the naive deal (naive_ranks)."""
    T = length.shape[0]
    rows = np.arange(T)[:, None]
    naive = naive_ranks(valid, D, steps)
    L = length.astype(np.float64)
    out = np.zeros((T, 2 * len(BAND_FACTORS)))
    for k, f in enumerate(BAND_FACTORS):
        c = np.where(valid, cost.a * L + f * cost.b * L * L, 0.0)
        for j, ranks in enumerate((rank, naive)):
            cell = rows * (D + 1) + np.where(valid & (ranks >= 0), ranks, D)
            load = np.bincount(cell.ravel(), c.ravel(), T * (D + 1)).reshape(T, D + 1)
            out[:, 2 * k + j] = load[:, :D].max(axis=1)
    return out


def cost_band(loads: np.ndarray) -> dict[str, Any]:
    """The footer's `cost_band`: per factor of b, the predicted speedup vs naive (the naive
    deal's summed most-loaded ranks over the plan's)."""
    totals = loads.sum(axis=0)
    speedups = []
    for k in range(len(BAND_FACTORS)):
        planned, naive = totals[2 * k], totals[2 * k + 1]
        speedups.append(round(float(naive / planned), 6) if planned > 0 else 1.0)
    return {"b_factors": list(BAND_FACTORS), "speedup_vs_naive": speedups}


def band_range(band: dict[str, Any] | None, speedup: float) -> dict[str, Any] | None:
    """{low, high, b_factors} of the footer's band, the plan's own speedup included."""
    if not band:
        return None
    values = [float(x) for x in band["speedup_vs_naive"]] + [float(speedup)]
    return {
        "low": min(values),
        "high": max(values),
        "b_factors": [min(band["b_factors"]), max(band["b_factors"])],
        "speedup_vs_naive": dict(
            zip((str(f) for f in band["b_factors"]), band["speedup_vs_naive"], strict=True)
        ),
    }
