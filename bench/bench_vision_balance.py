"""Two-part balance on a mixed image-text profile: per step, the most-loaded rank's encoder
load, backbone load and their sum, each over its lower bound, for three assignments of the
same samples:

- mds two-part balance (src/mds/planner/plan/balance_parts.py),
- balance by backbone cost only (src/mds/planner/plan/balance.py on the backbone part: what
  a text-only balancer does), its ranks then charged both parts,
- naive sharding (the step's samples in a seeded random order, dealt round-robin).

The profile: many small images with short captions, a few very large images (clamped to
max_pixels), multi-image samples, and long text-only samples; Qwen2-VL's geometry, a 7B
backbone's FLOP coefficients and a 600M ViT's. Samples are drawn in memory (no files): the
balancers see only costs, tokens and patches. Steps: STEPS per D; medians and maxima.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import write_report  # noqa: E402

from mds.core.vision import VisionGeometry
from mds.planner.plan.balance import balance
from mds.planner.plan.balance_parts import balance_parts, part_bounds
from mds.planner.plan.bounds import naive_ranks

SEED = 20261206
STEPS = 24
PER_RANK = 16  # samples per rank per step
MICRO = 4
CAPACITY = 32768  # tokens per micro-batch
# Qwen2-7B-like backbone (28 layers, hidden 3584) and Qwen2-VL's ViT (32 layers, 1280)
BB_A, BB_B = 72.0 * 28 * 3584**2, 6.0 * 28 * 3584
ENC_A, ENC_B = 72.0 * 32 * 1280**2, 12.0 * 32 * 1280


def profile(n: int, rng: np.random.Generator, geometry: VisionGeometry):
    """Per sample: text tokens, backbone length, patches, sum of patches squared."""
    kind = rng.choice(4, size=n, p=[0.62, 0.05, 0.08, 0.25])  # small, large, multi, text
    text = np.where(
        kind == 3,
        rng.lognormal(7.3, 0.8, n).astype(np.int64).clip(64, 12000),
        rng.lognormal(4.2, 0.9, n).astype(np.int64).clip(4, 2000),
    )
    images = np.select([kind == 0, kind == 1, kind == 2], [1, 1, rng.integers(2, 5, n)], 0)
    total = int(images.sum())
    owner = np.repeat(np.arange(n), images)
    large = kind[owner] == 1
    side = np.where(large, rng.integers(1400, 3000, total), rng.integers(96, 640, total))
    aspect = np.exp(rng.uniform(-0.7, 0.7, total))
    h = np.maximum(28, (side * aspect).astype(np.int64))
    w = np.maximum(28, (side / aspect).astype(np.int64))
    gh, gw = geometry.grids(h, w)
    p = gh * gw
    tokens = np.bincount(owner, weights=geometry.image_tokens(gh, gw), minlength=n).astype(np.int64)
    patches = np.bincount(owner, weights=p, minlength=n).astype(np.int64)
    patches_sq = np.bincount(owner, weights=p * p, minlength=n).astype(np.int64)
    return text + tokens, patches, patches_sq


def run(D: int, rng: np.random.Generator, geometry: VisionGeometry) -> dict:
    N = D * PER_RANK
    L, P, P2 = (np.stack(x) for x in zip(*(profile(N, rng, geometry) for _ in range(STEPS)), strict=True))
    bb_raw = BB_A * L + BB_B * L.astype(np.float64) ** 2
    enc_raw = ENC_A * P + ENC_B * P2.astype(np.float64)
    scale = float(1 << 40) / float((bb_raw + enc_raw).max())
    bb = np.maximum(1, np.rint(bb_raw * scale)).astype(np.int64)
    enc = np.rint(enc_raw * scale).astype(np.int64)
    valid = np.ones_like(L, dtype=bool)
    steps = np.arange(STEPS)
    t0 = time.perf_counter()
    two = balance_parts(enc, bb, L, P, valid, steps, D, MICRO, CAPACITY, None).rank
    seconds = time.perf_counter() - t0
    bbonly = balance(bb, L, valid, steps, D, MICRO, CAPACITY).rank
    naive = naive_ranks(valid, D, steps)
    lb = {
        "encoder": part_bounds(enc, valid, D),
        "backbone": part_bounds(bb, valid, D),
        "sum": part_bounds(enc + bb, valid, D),
    }
    out: dict = {"D": D, "samples_per_step": N, "two_part_seconds": round(seconds, 3)}
    for name, ranks in (("mds two-part", two), ("backbone only", bbonly), ("naive", naive)):
        row = {}
        for part, values in (("encoder", enc), ("backbone", bb), ("sum", enc + bb)):
            loads = np.zeros((STEPS, D), dtype=np.int64)
            for t in range(STEPS):
                np.add.at(loads[t], ranks[t], values[t])
            ratio = loads.max(axis=1) / lb[part]
            row[part] = {"median": statistics.median(ratio), "max": float(ratio.max())}
        out[name] = row
    return out


def table(results: list[dict]) -> str:
    lines = [
        "| D | assignment | encoder max/LB (median, max) | backbone max/LB | sum max/LB |",
        "|---:|---|---:|---:|---:|",
    ]
    for r in results:
        for name in ("mds two-part", "backbone only", "naive"):
            cells = [f"{r[name][p]['median']:.4f}, {r[name][p]['max']:.4f}" for p in ("encoder", "backbone", "sum")]
            lines.append(f"| {r['D']} | {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Per step, the most-loaded rank's load over the part's lower bound "
        f"(max(total/D, largest sample)); {STEPS} steps of {PER_RANK} samples per rank. "
        + ", ".join(f"two-part balance at D={r['D']}: {r['two_part_seconds']} s" for r in results)
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    parser.add_argument("--d", type=int, nargs="*", default=[8, 64])
    a = parser.parse_args()
    geometry = VisionGeometry()
    results = [run(D, np.random.default_rng(SEED + D), geometry) for D in a.d]
    write_report(a.out, "vision_balance", table(results), results)


if __name__ == "__main__":
    main()
