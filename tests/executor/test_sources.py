"""SourceCatalog on small synthetic indexes: payload columns, truncation, and its limits."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from plan_builders import index_data, plan_config, train_table

from mds.executor import PlanExecutor
from mds.executor.errors import ConfigError
from mds.planner.plan import build_plan


def _two_columns(root, rows: int = 40):
    """One Parquet file whose columns `a` and `b` hold different ids of the same lengths."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(2, 30, rows)
    a = [list(range(i, i + n)) for i, n in enumerate(lengths)]
    b = [[t + 1000 for t in seq] for seq in a]
    (root / "d").mkdir()
    pq.write_table(pa.table({"a": a, "b": b}), root / "d" / "data.parquet", row_group_size=16)
    return a, b


def _plan(root, sources, **train):
    data = {"index": {"output": "index"}, "source": sources, "train": train_table(**train)}
    index = index_data(root, data)
    out = root / "plan.mds"
    build_plan(plan_config(root, data, **train), out)
    return index, out


def test_two_sources_on_one_file_get_their_own_columns(tmp_path):
    a, b = _two_columns(tmp_path)
    _, plan = _plan(
        tmp_path,
        [
            {"name": "A", "path": "d/data.parquet", "tokens": "a", "weight": 1},
            {"name": "B", "path": "d/data.parquet", "tokens": "b", "weight": 1},
        ],
        dp_size=1,
        micro_batches=1,
        steps=6,
    )
    seen = 0
    with PlanExecutor(plan, 0) as ex:
        for batch in ex:
            cu = batch["cu_seqlens"].tolist()
            for i, (s, r) in enumerate(
                zip(batch["source"].tolist(), batch["row"].tolist(), strict=True)
            ):
                want = (a if ex.source_names[s] == "A" else b)[r]
                assert batch["input_ids"][cu[i] : cu[i + 1]].tolist() == want
                seen += 1
    assert seen == 6 * 8


def test_overlong_samples_are_cut_as_the_plan_truncated_them(tmp_path):
    a, _ = _two_columns(tmp_path)
    _, plan = _plan(
        tmp_path,
        [{"name": "A", "path": "d/data.parquet", "tokens": "a", "weight": 1}],
        dp_size=1,
        micro_batches=4,
        steps=4,
        samples_per_step=2,
        max_tokens_per_micro_batch=10,
        overlong="truncate",
    )
    with PlanExecutor(plan, 0) as ex:
        batches = list(ex)
    lengths = [n for b in batches for n in b["cu_seqlens"].diff().tolist()]
    rows = [r for b in batches for r in b["row"].tolist()]
    assert lengths == [min(len(a[r]), 10) for r in rows]
    assert any(len(a[r]) > 10 for r in rows)
    assert all(len(b["input_ids"]) <= 10 for b in batches)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_open_files": 0}, "max_open_files=0 must be an integer >= 1"),
        ({"cache_bytes": -1}, "cache_bytes=-1 must be an integer >= 0"),
    ],
)
def test_bad_limits_are_refused(tmp_path, kwargs, message):
    _two_columns(tmp_path)
    _, plan = _plan(
        tmp_path,
        [{"name": "A", "path": "d/data.parquet", "tokens": "a", "weight": 1}],
        dp_size=1,
    )
    with pytest.raises(ConfigError, match=message):
        PlanExecutor(plan, 0, **kwargs)
