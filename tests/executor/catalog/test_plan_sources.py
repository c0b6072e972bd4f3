"""The plan's sources as its footer describes them: names and global ids, how a sample is
located in its file, and what blocks say of them checked before anything is read."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from catalog_helpers import plan_of, two_columns

from mds.core.planfile_reader import PlanReader
from mds.errors import PlanError
from mds.executor.catalog.plan_sources import PlanSources, Source


@pytest.fixture
def footer_and_plan(tmp_path):
    two_columns(tmp_path)
    _, plan = plan_of(
        tmp_path,
        [
            {"name": "A", "path": "d/data.parquet", "tokens": "a", "weight": 1},
            {"name": "B", "path": "d/data.parquet", "tokens": "b", "weight": 0},
        ],
        dp_size=1,
    )
    with PlanReader(plan) as reader:
        return reader.footer, plan


def test_sources_ids_and_rows(footer_and_plan):
    footer, plan = footer_and_plan
    sources = PlanSources(footer, plan, None)
    assert sources.names == ["A", "B"] and [s.name for s in sources.used] == ["A"]
    assert sources.root == plan.parent and not sources.relocated
    a, b = sources.sources
    gids = np.array([b.base + 3, a.base, a.base + a.rows - 1])
    sid, rows = sources.locate(gids)
    assert sid.tolist() == [1, 0, 0] and rows.tolist() == [3, 0, a.rows - 1]
    with pytest.raises(PlanError, match="a sample beyond its index's rows"):
        sources.locate(np.array([b.base + b.rows]))
    assert sources.source_of(0) is a
    with pytest.raises(PlanError, match="a block names source 1"):
        sources.source_of(1)  # not drawn from: no block may name it


def test_every_block_must_give_a_file_the_same_record(footer_and_plan):
    sources = PlanSources(*footer_and_plan, None)
    a = sources.sources[0]
    entry = {"path": "d/data.parquet", "size": 1}
    sources.same_record(a, 0, entry)
    sources.same_record(a, 0, dict(entry))  # equal: the same record
    with pytest.raises(PlanError, match=r"blocks disagree on A files\[0\]"):
        sources.same_record(a, 0, {**entry, "size": 2})


def test_a_corrupt_footer_is_a_plan_error(footer_and_plan):
    footer, plan = footer_and_plan
    for damage in (
        lambda f: f.pop("fetch"),
        lambda f: f["fetch"].update(root=""),
        lambda f: f["index"]["sources"][0].update(rows="many"),
    ):
        broken = copy.deepcopy(footer)
        damage(broken)
        with pytest.raises(PlanError, match="corrupt plan footer"):
            PlanSources(broken, plan, None)


@pytest.mark.parametrize(
    ("fmt", "payload", "located"),
    [
        ("jsonl", {}, "bytes"),
        ("jsonl.zst", {}, "bytes"),
        ("parquet", {"offsets": "row_group"}, "values"),
        ("parquet", {}, None),
        ("arrow", {}, None),
        ("megatron", {}, None),
    ],
)
def test_how_a_sample_is_located_in_its_file(fmt, payload, located):
    assert Source(0, "s", 0, 1, {"format": fmt, "payload": payload}).located == located
