"""SourceCatalog on small synthetic indexes: sources sharing a file, the limits it refuses,
and what a process hands on to another (the files it checked)."""

from __future__ import annotations

import pytest
from catalog_helpers import plan_of, two_columns

from mds.errors import ConfigError
from mds.executor import PlanExecutor


def test_two_sources_on_one_file_get_their_own_columns(tmp_path):
    a, b = two_columns(tmp_path)
    _, plan = plan_of(
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


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_open_files": 0}, "max_open_files=0 must be an integer >= 1"),
        ({"cache_bytes": -1}, "cache_bytes=-1 must be an integer >= 0"),
        ({"read_threads": 0}, "read_threads=0 must be an integer >= 1"),
        ({"read_threads": 1.5}, "read_threads=1.5 must be an integer"),
    ],
)
def test_bad_limits_are_refused(tmp_path, kwargs, message):
    two_columns(tmp_path)
    _, plan = plan_of(
        tmp_path,
        [{"name": "A", "path": "d/data.parquet", "tokens": "a", "weight": 1}],
        dp_size=1,
    )
    with pytest.raises(ConfigError, match=message):
        PlanExecutor(plan, 0, **kwargs)


def test_checked_files_are_handed_on_as_copies(tmp_path):
    two_columns(tmp_path)
    _, plan = plan_of(
        tmp_path,
        [{"name": "A", "path": "d/data.parquet", "tokens": "a", "weight": 1}],
        dp_size=1,
    )
    with PlanExecutor(plan, 0) as ex, PlanExecutor(plan, 0, verify="none") as other:
        checked, pins = ex._catalog.checked_files()
        assert checked and set(pins) == checked
        other._catalog.restore_checks(checked, pins)
        assert other._catalog.checked_files() == (checked, pins)
        again, pinned = other._catalog.checked_files()
        assert again is not checked and all(pinned[k] is not pins[k] for k in pins)
