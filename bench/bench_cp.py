"""Context parallelism on a long-context mix: per micro-batch the CP-rank imbalance (busiest
CP rank / mean) and per step the DP x CP step time over its lower bound, for three layouts
of the same planned samples:

- contiguous: every sample cut into cp contiguous pieces (the last CP rank does the most),
- head-tail everywhere: every sample split head-tail over every CP rank,
- mds: src/mds/core/cp_layout.py (long samples split head-tail, short ones whole unless
  that makes the busiest CP rank more than 2^-7 busier than head-tail everywhere).

The mix: 60% of documents log-uniform in [1k, 4k) tokens, 40% log-uniform in [1k, 128k];
D = 8 DP ranks, 4 micro-batches of 128k tokens, 256 documents a step, a 7B-like causal cost
(a/b = 12 x 4096). Samples are drawn in memory and balanced over DP ranks and micro-batches
by the planner's balancer (src/mds/planner/plan/balance.py), then laid out over CP ranks by
the planner's own functions (src/mds/planner/plan/cp.py). Work in cp_layout's units; the
model counts compute only (no K/V exchange, no kernel efficiency per chunk size).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import write_report  # noqa: E402

from mds.planner.plan.balance import balance
from mds.planner.plan.config import DEFAULT_CP_SPLIT_FROM
from mds.planner.plan.cp import cell_work, cp_lower_bound, cp_stats, plan_cells

SEED = 20261207
STEPS = 48
D, MICRO, CAPACITY, PER_STEP = 8, 4, 131072, 256
HIDDEN, LAYERS = 4096, 32
A, B = 72.0 * LAYERS * HIDDEN**2, 6.0 * LAYERS * HIDDEN
LINEAR = round(A / B)
LAYOUTS = ("contiguous", "headtail", "mds")
NAMES = {
    "contiguous": "contiguous",
    "headtail": "head-tail everywhere",
    "mds": "mds (cp_layout)",
}


def lengths(rng: np.random.Generator, shape) -> np.ndarray:
    short = rng.random(shape) < 0.6
    hi = np.where(short, math.log(4096), math.log(131072))
    return np.exp(rng.uniform(math.log(1024), hi)).astype(np.int64)


def plan(rng: np.random.Generator, steps: int, per_step: int):
    """Lengths, validity and the balancer's assignment of `steps` steps."""
    L = lengths(rng, (steps, per_step))
    raw = A * L + B * L.astype(np.float64) ** 2
    cost = np.maximum(1, np.rint(raw * (float(1 << 40) / raw.max()))).astype(np.int64)
    valid = np.ones_like(L, dtype=bool)
    assign = balance(cost, L, valid, np.arange(steps), D, MICRO, CAPACITY)
    return L, valid, assign


def run(cp: int, L, valid, assign) -> dict:
    T = L.shape[0]
    (t, j), cell = plan_cells(assign.rank, assign.micro, valid, D, MICRO)
    cells = T * D * MICRO
    t0 = time.perf_counter()
    work = cell_work(L[t, j], cell, cells, cp, DEFAULT_CP_SPLIT_FROM, LINEAR)
    seconds = time.perf_counter() - t0
    busiest, total = work.busiest, work.total
    bound = cp_lower_bound(L, valid, D, cp, LINEAR)
    used = work.total["headtail"] > 0
    out: dict = {"cp": cp, "layout_seconds": round(seconds, 3)}
    for name in LAYOUTS:
        step = busiest[name].reshape(T, D, MICRO).sum(axis=2).max(axis=1)
        ratio = step / bound
        imbalance = busiest[name][used] * cp / total[name][used]
        out[name] = {
            "imbalance_mean": float(imbalance.mean()),
            "imbalance_p99": float(np.quantile(imbalance, 0.99)),
            "step_over_bound_mean": float(ratio.mean()),
            "step_over_bound_median": float(np.median(ratio)),
            "step_over_bound_max": float(ratio.max()),
            "step_time_sum": int(step.sum()),
        }
    out["split_share"] = float(work.split.sum() / used.size) if used.size else 0.0
    out["samples_split_per_step"] = float(work.split.sum() / T)
    out["padding_share"] = float(work.padding.sum() / L.sum())
    # the DP balance alone: the most-loaded DP rank's work / cp over the bound
    dp_only = np.zeros((T, D), dtype=np.int64)
    w = LINEAR * L + L * (L + 1)
    np.add.at(dp_only, (np.repeat(np.arange(T), L.shape[1]), assign.rank.ravel()), w.ravel())
    out["dp_only_over_bound_mean"] = float((-(-dp_only.max(axis=1) // cp) / bound).mean())
    return out


def stats_timing(rng: np.random.Generator) -> dict:
    """cp_stats (what `mds plan` adds per chunk) on 1000 steps, D = 8, 4 micro-batches."""
    steps, per_step = 1000, 64
    L, valid, assign = plan(rng, steps, per_step)
    out = {"steps": steps, "samples_per_step": per_step}
    for cp in (2, 8):
        t0 = time.perf_counter()
        cp_stats(assign.rank, assign.micro, L, valid, D, MICRO, cp, DEFAULT_CP_SPLIT_FROM, LINEAR)
        out[f"cp{cp}_seconds"] = round(time.perf_counter() - t0, 3)
    return out


def table(results: list[dict], timing: dict) -> str:
    lines = [
        "| cp | layout | CP busiest/mean (mean, p99) | DP x CP step / lower bound (mean, median, max) | step time vs mds |",
        "|---:|---|---:|---:|---:|",
    ]
    for r in results:
        for name in LAYOUTS:
            q = r[name]
            rel = q["step_time_sum"] / r["mds"]["step_time_sum"]
            lines.append(
                f"| {r['cp']} | {NAMES[name]} | {q['imbalance_mean']:.4f}, {q['imbalance_p99']:.4f} | "
                f"{q['step_over_bound_mean']:.4f}, {q['step_over_bound_median']:.4f}, "
                f"{q['step_over_bound_max']:.4f} | {rel:.4f} |"
            )
    lines.append("")
    lines.append(
        f"{STEPS} steps of {PER_STEP} documents (60% in [1k, 4k), 40% log-uniform to 128k), D = {D}, "
        f"{MICRO} micro-batches of {CAPACITY:,} tokens, split_from {DEFAULT_CP_SPLIT_FROM}, "
        f"linear {LINEAR}. DP balance alone (most-loaded DP rank's work / cp over the bound): "
        + ", ".join(f"cp {r['cp']} {r['dp_only_over_bound_mean']:.4f}" for r in results)
        + ". Samples mds splits per step: "
        + ", ".join(f"cp {r['cp']} {r['samples_split_per_step']:.1f}" for r in results)
        + f" of {PER_STEP}; padding "
        + ", ".join(f"{100 * r['padding_share']:.3f}%" for r in results)
        + " of the tokens. CP stats of a 1000-step plan (D = 8, 4 micro-batches, 64 samples a step): "
        f"{timing['cp2_seconds']} s at cp 2, {timing['cp8_seconds']} s at cp 8."
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    parser.add_argument("--cp", type=int, nargs="*", default=[2, 4, 8])
    a = parser.parse_args()
    rng = np.random.default_rng(SEED)
    L, valid, assign = plan(rng, STEPS, PER_STEP)
    results = [run(cp, L, valid, assign) for cp in a.cp]
    timing = stats_timing(np.random.default_rng(SEED + 1))
    write_report(a.out, "cp", table(results, timing), {"results": results, "stats_timing": timing})


if __name__ == "__main__":
    main()
