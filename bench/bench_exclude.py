"""Excluding 1% of a corpus's documents at step K (`mds plan --from OLD --at-step K
--exclude`), side by side with the plain re-plan from K and the original plan's own steps
from K:

- excluded documents after K, checked on `mds export` of the new plan (must be 0),
- the per-step mix after K: mean and max over steps of the largest abs(share - weight) over
  sources, for the original plan and the new one,
- balance after K: mean and max of most-loaded rank / lower bound (the stats `mds inspect`
  reports), new over original,
- planning time of the excluding re-plan over the plain re-plan (median of 3).

The corpus: 4 Parquet sources of log-normal lengths (25,000 documents each; weights
0.4/0.3/0.2/0.1), 320 steps of 256 samples over dp 8 x 2 micro-batches, K = 160; the 1% is
drawn uniformly from all documents (some were trained before K, most are still ahead).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import write_report  # noqa: E402

from mds.core.planfile_reader import PlanReader
from mds.planner.index.build import build_index
from mds.planner.index.config import parse_config
from mds.planner.index.tables import read_manifest
from mds.planner.plan.build import build_plan
from mds.planner.plan.config import plan_config_from_dict
from mds.planner.plan.exclude import Exclusion, read_exclude_list, resolve_entries
from mds.planner.report.export import export_plan

SEED = 20261206
WEIGHTS = {"web": 0.4, "code": 0.3, "books": 0.2, "math": 0.1}
DOCS, STEPS, K, DP, PER_STEP = 25_000, 320, 160, 8, 256


def corpus(root: Path, docs: int, steps: int, per_step: int) -> dict:
    """Write the sources, index them, return the config as a dict."""
    rng = np.random.default_rng(SEED)
    tables = []
    for name, weight in WEIGHTS.items():
        lengths = np.clip(rng.lognormal(6.0, 1.0, docs), 16, 4000).astype(np.int64)
        path = root / name / "data.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"n": lengths}), path)
        tables.append({"name": name, "path": f"{name}/data.parquet", "count": "n", "weight": weight})
    train = {
        "steps": steps,
        "dp_size": DP,
        "micro_batches": 2,
        "samples_per_step": per_step,
        "max_tokens_per_micro_batch": 64_000,
        "seed": 7,
    }
    data = {"index": {"output": "index"}, "source": tables, "train": train, "plan": {"chunk_steps": 64}}
    build_index(parse_config(data, path=root / "config.toml"), root / "index", workers=1)
    return data


def per_step_mix(plan: Path, first: int) -> tuple[float, float]:
    """Mean and max over steps from `first` of max over sources abs(share - weight)."""
    with PlanReader(plan) as reader:
        counts = np.asarray(reader.section("source_samples"), dtype=np.float64)
        names = [s["name"] for s in reader.footer["sources"]]
        counts = counts[first - reader.first_step :]
    weights = np.array([WEIGHTS[n] for n in names])
    dev = np.abs(counts / counts.sum(axis=1, keepdims=True) - weights).max(axis=1)
    return float(dev.mean()), float(dev.max())


def balance(plan: Path, first: int) -> tuple[float, float]:
    """Mean and max over steps from `first` of most-loaded rank / lower bound."""
    with PlanReader(plan) as reader:
        stats = np.asarray(reader.section("stats"), dtype=np.float64)[first - reader.first_step :]
        col = {c: i for i, c in enumerate(reader.footer["stats_columns"])}
    ratio = stats[:, col["max_rank_cost"]] / np.maximum(stats[:, col["lower_bound"]], 1)
    return float(ratio.mean()), float(ratio.max())


def measure(root: Path, docs: int = DOCS, steps: int = STEPS, at: int = K, per_step: int = PER_STEP, rounds: int = 3) -> dict:
    data = corpus(root, docs, steps, per_step)
    config = plan_config_from_dict(data, base=root)
    old, plain, new = root / "old.mds", root / "plain.mds", root / "new.mds"
    build_plan(config, old)
    rng = np.random.default_rng(SEED + 1)
    picked = np.sort(rng.choice(docs * len(WEIGHTS), docs * len(WEIGHTS) // 100, replace=False))
    names = list(WEIGHTS)
    listed = root / "bad.parquet"
    pl.DataFrame({"source": [names[i // docs] for i in picked], "row": (picked % docs).tolist()}).write_parquet(listed)
    found = read_exclude_list(listed)
    ids, given, _ = resolve_entries(found, read_manifest(root / "index"))
    exclusion = Exclusion(ids, given, listed.name, found.digest, found.entries)
    times = {"plain": [], "exclude": []}
    for _ in range(rounds):
        t0 = time.perf_counter()
        build_plan(config, plain, parent=old, at_step=at)
        times["plain"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        summary = build_plan(config, new, parent=old, at_step=at, exclusion=exclusion)
        times["exclude"].append(time.perf_counter() - t0)
    exported = root / "new.parquet"
    export_plan(new, exported)
    after = pl.read_parquet(exported).join(pl.read_parquet(listed), on=["source", "row"], how="semi")
    mix_old, mix_new = per_step_mix(old, at), per_step_mix(new, at)
    bal_old, bal_new = balance(old, at), balance(new, at)
    return {
        "excluded_listed": int(len(picked)),
        "trained_before_k": summary.exclude["trained_before"],
        "excluded_after_k": after.height,
        "mix_dev_mean": {"original": mix_old[0], "exclude": mix_new[0]},
        "mix_dev_max": {"original": mix_old[1], "exclude": mix_new[1]},
        "balance_mean": {"original": bal_old[0], "exclude": bal_new[0]},
        "balance_max": {"original": bal_old[1], "exclude": bal_new[1]},
        "balance_mean_ratio": bal_new[0] / bal_old[0],
        "plan_seconds_median": {k: statistics.median(v) for k, v in times.items()},
        "plan_seconds_ratio": statistics.median(times["exclude"]) / statistics.median(times["plain"]),
    }


def table(r: dict) -> str:
    rows = [
        "| measure | original plan (steps >= K) | re-plan with --exclude |",
        "|---|---|---|",
        f"| excluded documents after K (of {r['excluded_listed']:,} listed; {r['trained_before_k']:,} trained before K) | - | {r['excluded_after_k']} |",
        f"| per-step mix: largest abs(share - weight), mean / max | {r['mix_dev_mean']['original']:.4f} / {r['mix_dev_max']['original']:.4f} | {r['mix_dev_mean']['exclude']:.4f} / {r['mix_dev_max']['exclude']:.4f} |",
        f"| most-loaded rank / lower bound, mean / max | {r['balance_mean']['original']:.4f} / {r['balance_max']['original']:.4f} | {r['balance_mean']['exclude']:.4f} / {r['balance_max']['exclude']:.4f} |",
        f"| balance mean, exclude / original | | {r['balance_mean_ratio']:.4f} |",
        f"| planning seconds (median of 3), exclude / plain re-plan | {r['plan_seconds_median']['plain']:.2f} | {r['plan_seconds_median']['exclude']:.2f} ({r['plan_seconds_ratio']:.2f}x) |",
    ]
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mds-bench-exclude-") as tmp:
        result = measure(Path(tmp))
    write_report(args.out, "exclude", table(result), result)


if __name__ == "__main__":
    main()
