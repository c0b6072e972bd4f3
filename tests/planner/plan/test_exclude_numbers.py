"""Excluding 1% of a synthetic corpus at step K, dp 8: no excluded document in the new
plan's export, the per-step mix after K no further from the weights than the original
plan's, balance within 0.5% of the original's (bench/bench_exclude.py measures the same at
a larger size)."""

from __future__ import annotations

import numpy as np
import polars as pl
from plan_builders import plan_config, synthetic, train_table

from mds.core.planfile_reader import PlanReader
from mds.planner.index.tables import read_manifest
from mds.planner.plan.build import build_plan
from mds.planner.plan.exclude import Exclusion, read_exclude_list, resolve_entries
from mds.planner.report.export import export_plan

WEIGHTS = {"web": 0.4, "code": 0.3, "books": 0.2, "math": 0.1}
DOCS, STEPS, K = 3000, 200, 100


def after_k(plan, at: int) -> tuple[np.ndarray, np.ndarray]:
    """Per step from `at`: max over sources abs(share - weight), and max rank / lower bound."""
    with PlanReader(plan) as reader:
        rows = slice(at - reader.first_step, None)
        counts = np.asarray(reader.section("source_samples"), np.float64)[rows]
        stats = np.asarray(reader.section("stats"), np.float64)[rows]
        col = {c: i for i, c in enumerate(reader.footer["stats_columns"])}
        names = [s["name"] for s in reader.footer["sources"]]
    weights = np.array([WEIGHTS[n] for n in names])
    mix = np.abs(counts / counts.sum(axis=1, keepdims=True) - weights).max(axis=1)
    return mix, stats[:, col["max_rank_cost"]] / stats[:, col["lower_bound"]]


def test_excluding_one_percent_keeps_mix_and_balance(tmp_path):
    rng = np.random.default_rng(11)
    sources = {
        name: {"lengths": np.clip(rng.lognormal(6.0, 1.0, DOCS), 16, 4000).astype(int).tolist(), "weight": w}
        for name, w in WEIGHTS.items()
    }
    train = train_table(steps=STEPS, dp_size=8, micro_batches=2, samples_per_step=64, max_tokens_per_micro_batch=64_000)
    config = plan_config(tmp_path, synthetic(tmp_path, sources, train))
    old, new = tmp_path / "old.mds", tmp_path / "new.mds"
    build_plan(config, old)
    total = DOCS * len(WEIGHTS)
    picked = np.sort(rng.choice(total, total // 100, replace=False))
    listed = tmp_path / "bad.csv"
    names = list(WEIGHTS)
    pl.DataFrame({"source": [names[i // DOCS] for i in picked], "row": (picked % DOCS).tolist()}).write_csv(listed)
    found = read_exclude_list(listed)
    ids, given, _ = resolve_entries(found, read_manifest(config.index))
    summary = build_plan(config, new, parent=old, at_step=K, exclusion=Exclusion(ids, given, "bad.csv", found.digest, found.entries))
    assert summary.exclude["matched"] == len(picked) and 0 < summary.exclude["trained_before"] < len(picked)
    export_plan(new, tmp_path / "new.parquet")
    exported = pl.read_parquet(tmp_path / "new.parquet")
    assert exported.height == (STEPS - K) * 64
    assert exported.join(pl.read_csv(listed), on=["source", "row"], how="semi").height == 0
    mix_old, bal_old = after_k(old, K)
    mix_new, bal_new = after_k(new, K)
    assert mix_new.mean() <= mix_old.mean() + 1e-12 and mix_new.max() <= mix_old.max() + 1e-12
    assert abs(bal_new.mean() / bal_old.mean() - 1) <= 0.005
