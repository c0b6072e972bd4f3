"""trace_plan reads only the traced chunk's blocks (and one small section), no index table
for a plain plan, and gives export's rows; rows_block locates index rows as the plan does."""

from __future__ import annotations

import numpy as np
import pytest
from plan_builders import sample_index, sample_plan_config

from mds.core.planfile_reader import PlanReader
from mds.planner.plan.build import build_plan
from mds.planner.report import trace as trace_module
from mds.planner.report.export import plan_frame
from mds.planner.report.trace import rows_block, trace_plan


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    index = sample_index(tmp_path_factory)
    path = tmp_path_factory.mktemp("trace") / "plan.mds"
    build_plan(sample_plan_config(index), path)
    return path


@pytest.fixture
def reads(monkeypatch):
    """The (chunk, rank) blocks and sections every PlanReader reads."""
    seen = {"blocks": [], "sections": []}
    block, section = PlanReader.rank_chunk, PlanReader.section

    def rank_chunk(self, chunk, rank):
        seen["blocks"].append((chunk, rank))
        return block(self, chunk, rank)

    def read_section(self, name):
        seen["sections"].append(name)
        return section(self, name)

    monkeypatch.setattr(PlanReader, "rank_chunk", rank_chunk)
    monkeypatch.setattr(PlanReader, "section", read_section)
    return seen


def test_reads_only_the_traced_chunk(plan, reads, monkeypatch):
    """Step 37 lies in chunk 2 of 4 (chunk_steps 16): that chunk's blocks are the only ones
    read, and no index (a plain plan: where samples lie is in the blocks)."""

    def no_index(*_args, **_kw):
        raise AssertionError("the index was read")

    monkeypatch.setattr(trace_module, "plan_index", no_index)
    with PlanReader(plan) as reader:
        assert len(reader.chunks) == 4 and reader.chunk_of(37) == 2
        dp = reader.dp
    reads["blocks"].clear()
    trace = trace_plan(plan, (37, 38), ranks=[1])
    assert sorted(set(reads["blocks"])) == [(2, r) for r in range(dp)]
    assert reads["sections"] == ["cursor_consumed"]
    assert set(trace.blocks) == {(2, 1)}
    assert set(trace.frame["step"]) == {37} and set(trace.frame["rank"]) == {1}


def test_rows_as_export(plan):
    """Every step: the same rows as export's, epochs included (the sample plan's sources
    cross many epochs)."""
    exported = plan_frame(plan)
    columns = [c for c in trace_plan(plan, (0, 1)).frame.columns if c not in ("chunk", "pos")]
    for a, b in [(0, 16), (16, 40), (40, 64)]:
        traced = trace_plan(plan, (a, b)).frame.select(columns)
        want = exported.filter((exported["step"] >= a) & (exported["step"] < b)).select(columns)
        assert traced.to_dicts() == want.to_dicts()
    assert exported["epoch"].max() > 1


def test_rows_block_matches_the_plan(plan, tmp_path_factory):
    """The fetch records rows_block makes from the index are the plan's for those samples."""
    from mds.planner.index.tables import read_manifest

    trace = trace_plan(plan, (5, 6))
    manifest = read_manifest(sample_index(tmp_path_factory))
    for source in ("forum", "web", "math"):
        part = trace.frame.filter(trace.frame["source"] == source)
        block = rows_block(manifest, trace.footer, source, part["row"].to_numpy())
        files = [block.fetch.files[f] for f in block.fetch.file]
        assert [f[2]["path"] for f in files] == part["file"].to_list()
        assert block.fetch.row.tolist() == part["file_row"].to_list()
        assert block.fetch.tokens.tolist() == part["n_tokens"].to_list()
        if source == "forum":
            assert block.fetch.offset.tolist() == part["byte_offset"].to_list()
        assert np.array_equal(block.ids.astype(np.int64), part["sample_id"].to_numpy())
