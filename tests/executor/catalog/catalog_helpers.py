"""What the catalog's tests share (tests/executor/catalog/conftest.py puts this folder on
sys.path): small synthetic Parquet sources and their plans, and a run's batch digests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from executor_builders import batch_digest
from plan_builders import index_data, plan_config, train_table

from mds.executor import PlanExecutor
from mds.planner.plan.build import build_plan


def two_columns(root: Path, rows: int = 40) -> tuple[list, list]:
    """One Parquet file whose columns `a` and `b` hold different ids of the same lengths."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(2, 30, rows)
    a = [list(range(i, i + n)) for i, n in enumerate(lengths)]
    b = [[t + 1000 for t in seq] for seq in a]
    (root / "d").mkdir()
    pq.write_table(pa.table({"a": a, "b": b}), root / "d" / "data.parquet", row_group_size=16)
    return a, b


def plan_of(root: Path, sources: list[dict[str, Any]], **train: Any) -> tuple[Path, Path]:
    """(index, plan) of `sources` under `root`, with these [train] keys."""
    data = {"index": {"output": "index"}, "source": sources, "train": train_table(**train)}
    index = index_data(root, data)
    out = root / "plan.mds"
    build_plan(plan_config(root, data, **train), out)
    return index, out


def digests(plan: Path, rank: int, **kwargs: Any) -> list[str]:
    with PlanExecutor(plan, rank, **kwargs) as ex:
        return [batch_digest(b) for b in ex]
