"""The balance table of bench_plan.py: mds against greedy LPT and Karmarkar-Karp on the
same synthetic steps, and the balancer's time and memory against samples per rank.

Steps are drawn directly (no index): `long-context` (25% of samples 24,576-32,768 tokens,
the rest log-normal, median 2,500, values past 24,575 redrawn uniform in 4,096-24,575) and
`lognormal` (median ~400, capped at 16,384). Cost L + L^2/24576, as the integer
24576 L + L^2. Micro-batch capacity: a multiple of 32,768 (long-context) or 16,384 tokens,
the smallest that gives every rank 1.5x its mean tokens (32,768 at 8 per rank and 4
micro-batches in long-context).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from mds.planner.plan.balance import balance
from mds.planner.plan.bounds import greedy_lpt, lower_bound, pigeonhole_bound
from mds.planner.plan.kk import karmarkar_karp

SEED = 20261203
BALANCE_PROFILES = ("long-context", "lognormal")


def step_lengths(rng: np.random.Generator, profile: str, shape: tuple[int, int]) -> np.ndarray:
    if profile == "long-context":
        short = np.maximum(rng.lognormal(np.log(2500), 1.0, shape), 64)
        short = np.where(short > 24575, rng.integers(4096, 24576, shape), short)
        long_ = rng.integers(24576, 32769, shape)
        return np.where(rng.random(shape) < 0.25, long_, short).astype(np.int64)
    return np.clip(rng.lognormal(6.0, 0.8, shape), 16, 16384).astype(np.int64)


def make_steps(profile: str, dp: int, per_rank: int, micro: int, steps: int):
    """(cost, length, capacity) of `steps` synthetic steps of dp x per_rank samples."""
    rng = np.random.default_rng([SEED, BALANCE_PROFILES.index(profile), dp, per_rank, micro])
    length = step_lengths(rng, profile, (steps, dp * per_rank))
    unit = 32768 if profile == "long-context" else 16384
    mean = float(length.mean())
    capacity = unit * max(1, int(np.ceil(1.5 * per_rank * mean / (micro * unit))))
    return 24576 * length + length * length, length, capacity


def _ratios(rank: np.ndarray, cost: np.ndarray, dp: int) -> np.ndarray:
    T, N = cost.shape
    cell = np.arange(T)[:, None] * dp + rank
    load = np.bincount(cell.ravel(), weights=cost.ravel(), minlength=T * dp).reshape(T, dp)
    return load.max(axis=1) / lower_bound(cost, dp)


def _summary(x: np.ndarray) -> dict[str, float]:
    return {"mean": float(x.mean()), "p99": float(np.quantile(x, 0.99)), "max": float(x.max())}


def balance_cases(samples: int) -> list[dict]:
    """Ratios of greedy LPT, KK and mds on each case; ~`samples` samples per case."""
    out = []
    for profile in BALANCE_PROFILES:
        for dp in (8, 64, 512):
            for per_rank in (8, 64):
                for micro in (1, 4):
                    n = dp * per_rank
                    steps = max(16, min(512, samples // n))
                    cost, length, cap = make_steps(profile, dp, per_rank, micro, steps)
                    valid = np.ones(cost.shape, bool)
                    row = {
                        "profile": profile,
                        "dp": dp,
                        "per_rank": per_rank,
                        "micro_batches": micro,
                        "capacity": cap,
                        "steps": steps,
                    }
                    kk = karmarkar_karp(cost, valid, dp)
                    t0 = time.perf_counter()
                    ours = balance(cost, length, valid, np.arange(steps), dp, micro, cap)
                    row["mds_samples_per_s"] = steps * n / (time.perf_counter() - t0)
                    row["greedy_lpt"] = _summary(_ratios(greedy_lpt(cost, valid, dp), cost, dp))
                    row["kk"] = _summary(_ratios(kk, cost, dp))
                    row["mds"] = _summary(_ratios(ours.rank, cost, dp))
                    # The same against the pigeonhole bound (never below lower_bound), and
                    # how far it is above max(total/D, largest sample): the part of the gap no
                    # assignment can close.
                    strict = pigeonhole_bound(cost, dp)
                    row["mds_pigeonhole"] = _summary(ours.load.max(axis=1) / strict)
                    row["pigeonhole_over_lower_bound"] = _summary(strict / lower_bound(cost, dp))
                    tok = np.zeros((steps, dp), np.int64)
                    np.add.at(tok, (np.arange(steps)[:, None], kk), length)
                    row["kk_fits_capacity"] = float((tok.max(axis=1) <= micro * cap).mean())
                    out.append(row)
                    print(json.dumps(row), flush=True)
    return out


def render_balance(rows: list[dict]) -> str:
    lines = [
        "## Balance: ratio of the slowest rank to the lower bound, same steps for every method",
        "",
        "| profile | D | per rank | micro | steps | LPT mean | LPT p99 | KK mean | KK p99 | "
        "mds mean | mds p99 | bound p99 | mds mean (PH) | mds p99 (PH) | KK fits cap | "
        "mds samples/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['profile']} | {r['dp']} | {r['per_rank']} | {r['micro_batches']} | "
            f"{r['steps']} | {r['greedy_lpt']['mean']:.4f} | {r['greedy_lpt']['p99']:.4f} | "
            f"{r['kk']['mean']:.4f} | {r['kk']['p99']:.4f} | {r['mds']['mean']:.4f} | "
            f"{r['mds']['p99']:.4f} | {r['pigeonhole_over_lower_bound']['p99']:.4f} | "
            f"{r['mds_pigeonhole']['mean']:.4f} | {r['mds_pigeonhole']['p99']:.4f} | "
            f"{r['kk_fits_capacity']:.0%} | "
            f"{r['mds_samples_per_s']:,.0f} |"
        )
    lines += [
        "",
        "LPT and KK (Karmarkar-Karp largest differencing, src/mds/planner/plan/kk.py) ignore token capacity;",
        "mds respects it. `KK fits cap`: share of steps where KK's ranks fit every rank's room.",
        "Targets (long-context): mean <= 1.005, p99 <= 1.02, against the lower bound",
        "max(total/D, largest sample). `PH`: the same ratio against the pigeonhole bound",
        "(src/mds/planner/plan/bounds.py, pigeonhole_bound: some rank holds k + 1 of the kD + 1 costliest",
        "samples), which is never lower; `bound p99`: p99 of pigeonhole bound / lower bound,",
        "the part of the ratio no assignment can remove.",
        "",
    ]
    return "\n".join(lines)


def per_rank_child(per_rank: int, items: int) -> dict:
    """In a fresh process: balance() on `items` lognormal samples at D=8, `per_rank` per rank."""
    from report import proc_status_mb

    dp, micro = 8, 4
    steps = max(1, items // (dp * per_rank))
    cost, length, cap = make_steps("lognormal", dp, per_rank, micro, steps)
    valid = np.ones(cost.shape, bool)
    base = proc_status_mb("VmRSS")
    t0 = time.perf_counter()
    balance(cost, length, valid, np.arange(steps), dp, micro, cap)
    seconds = time.perf_counter() - t0
    return {
        "per_rank": per_rank,
        "steps": steps,
        "samples": steps * dp * per_rank,
        "us_per_sample": 1e6 * seconds / (steps * dp * per_rank),
        "peak_rss_mb": proc_status_mb("VmHWM"),
        "rss_before_mb": base,
    }


def per_rank_scaling(items: int) -> list[dict]:
    """One fresh process per samples-per-rank value, the same samples per chunk in each."""
    out = []
    for per_rank in (8, 64, 256, 1024):
        code = (
            "import json, sys; sys.path.insert(0, 'bench'); import balance_table as b; "
            f"print(json.dumps(b.per_rank_child({per_rank}, {items})))"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(out[-1]), flush=True)
    return out


def render_scaling(rows: list[dict]) -> str:
    lines = [
        "## Balancer cost against samples per rank (D=8, 4 micro-batches, lognormal, "
        f"{rows[0]['samples']:,} samples in one call)",
        "",
        "| per rank | steps | us/sample | x of P=8 | peak RSS MB | RSS before MB |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    first = rows[0]["us_per_sample"]
    for r in rows:
        lines.append(
            f"| {r['per_rank']} | {r['steps']} | {r['us_per_sample']:.3f} | "
            f"{r['us_per_sample'] / first:.2f} | {r['peak_rss_mb']} | {r['rss_before_mb']} |"
        )
    lines += ["", "Targets: time per sample at P=1024 within 2x of P=8; peak RSS flat.", ""]
    return "\n".join(lines)
