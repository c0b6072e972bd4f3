"""src/mds/planner/report/verify_plan_file.py: `mds verify` on a corrupt, truncated or
missing plan file names the first bad part and counts the rest."""

from __future__ import annotations

from pathlib import Path

import pytest
from plan_builders import sample_workdir
from verify_builders import (
    block_span,
    check,
    copy_plan,
    failure,
    flip,
    layout,
)

import mds.planner.report.verify_plan_file as verify_plan_file
from mds.planner.report.verify import verify_plan


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """Shared and never modified: copy its plan or index before corrupting it."""
    return sample_workdir(tmp_path_factory.mktemp("verify"))


def test_hashing_in_small_pieces_gives_the_same_answer(pristine, monkeypatch):
    monkeypatch.setattr(verify_plan_file, "_READ", 7)
    assert verify_plan(pristine / "plan.mds").ok


def test_flipped_byte_in_a_rank_block(pristine, tmp_path):
    plan = copy_plan(pristine, tmp_path)
    offset, size = block_span(plan, 2, 1)
    flip(plan, offset + size // 2)
    result = verify_plan(plan, index=pristine / "index", data_root=pristine / "data")
    name, detail = failure(result)
    assert name == "rank blocks"
    assert detail == "chunk 2 rank 1: checksum mismatch (corrupt file)"
    assert [c.name for c in result.checks if not c.ok] == ["rank blocks"]


def test_every_bad_block_is_counted_and_the_first_named(pristine, tmp_path):
    plan = copy_plan(pristine, tmp_path)
    for chunk, rank in ((3, 0), (1, 3)):
        offset, _ = block_span(plan, chunk, rank)
        flip(plan, offset)
    result = verify_plan(plan, index=pristine / "index", data_root=pristine / "data")
    detail = check(result, "rank blocks").detail
    assert detail == "chunk 1 rank 3: checksum mismatch (corrupt file) (and 1 more blocks)"


def test_flipped_byte_in_a_directory(pristine, tmp_path):
    plan = copy_plan(pristine, tmp_path)
    flip(plan, layout(plan)["chunks"][1][2] + 5)
    result = verify_plan(plan, index=pristine / "index", data_root=pristine / "data")
    assert failure(result) == ("chunk directories", "chunk 1: directory checksum mismatch")
    # the other chunks' blocks are still read and checked
    assert check(result, "rank blocks").ok
    assert check(result, "rank blocks").detail.startswith("12 blocks")


@pytest.mark.parametrize("section", ["stats", "source_samples", "cursor_target"])
def test_flipped_byte_in_a_section(pristine, tmp_path, section):
    plan = copy_plan(pristine, tmp_path)
    meta = layout(plan)["sections"][section]
    flip(plan, meta["offset"] + meta["size"] - 1)
    result = verify_plan(plan, index=pristine / "index", data_root=pristine / "data")
    assert failure(result) == ("sections", f"section {section!r}: checksum mismatch")


def test_flipped_byte_in_the_footer(pristine, tmp_path):
    plan = copy_plan(pristine, tmp_path)
    flip(plan, plan.stat().st_size - 40)
    result = verify_plan(plan)
    assert failure(result) == ("plan file", "plan footer checksum mismatch (corrupt file)")
    assert len(result.checks) == 1  # no footer: no index path to follow


@pytest.mark.parametrize("cut", [1, 100, 5000])
def test_truncated_plan(pristine, tmp_path, cut):
    plan = copy_plan(pristine, tmp_path)
    data = plan.read_bytes()
    plan.write_bytes(data[: len(data) - cut])
    result = verify_plan(plan)
    name, detail = failure(result)
    assert name == "plan file" and "truncated" in detail
    assert result.plan_id is None and result.index is None


def test_truncated_plan_with_an_explicit_index_still_checks_the_index(pristine, tmp_path):
    plan = copy_plan(pristine, tmp_path)
    plan.write_bytes(plan.read_bytes()[:-8])
    result = verify_plan(plan, index=pristine / "index", data_root=pristine / "data")
    assert [c.name for c in result.checks if not c.ok] == ["plan file"]
    assert "not compared" in check(result, "index fingerprint").detail


def test_missing_plan(tmp_path):
    name, detail = failure(verify_plan(tmp_path / "nope.mds"))
    assert name == "plan file" and "cannot open plan" in detail
