"""`mds verify` vouches for the plan's fetch records: a record that disagrees with the index
(a token count, a row, a byte range, a file entry, the footer's reading facts) fails the
"fetch records" check with a line naming the chunk, rank, source and row."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from executor_builders import rewrite_plan
from plan_builders import sample_workdir

from mds.core.planfile import RankChunk
from mds.planner.report.verify import verify_plan


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return sample_workdir(tmp_path_factory.mktemp("verify-fetch"))


def forged(pristine: Path, tmp_path: Path, column: str | None = None, **kw) -> Path:
    """The plan with chunk 1, rank 2's first sample's `column` raised by one (or the edits
    `block`/`footer` of rewrite_plan)."""

    def bump(c: int, r: int, block: RankChunk):
        if (c, r) != (1, 2):
            return None
        values = getattr(block.fetch, column).astype(np.int64)
        values[0] += 1
        return dataclasses.replace(
            block, fetch=dataclasses.replace(block.fetch, **{column: values})
        )

    edit = bump if column is not None else kw.get("block")
    return rewrite_plan(
        pristine / "plan.mds", tmp_path / "forged.mds", block=edit, footer=kw.get("footer")
    )


def check(result, name: str):
    (found,) = [c for c in result.checks if c.name == name]
    return found


def fetch_failure(pristine: Path, plan: Path) -> str:
    result = verify_plan(plan, index=pristine / "index", data_root=pristine / "data")
    found = check(result, "fetch records")
    assert not found.ok and not result.ok
    assert [c.name for c in result.checks if not c.ok] == ["fetch records"]
    return found.detail


def test_the_pristine_plan_passes(pristine):
    assert check(verify_plan(pristine / "plan.mds"), "fetch records").ok


@pytest.mark.parametrize("column", ["tokens", "row"])
def test_a_sample_record_that_differs(pristine, tmp_path, column):
    detail = fetch_failure(pristine, forged(pristine, tmp_path, column))
    assert detail.startswith("chunk 1 rank 2: source '")
    assert f"the plan's {column} " in detail and "differs from the index's" in detail


def test_a_file_record_that_differs(pristine, tmp_path):
    def size(c: int, r: int, block: RankChunk):
        if (c, r) != (0, 0):
            return None
        files = [(s, f, {**e, "size": e["size"] + 1}) for s, f, e in block.fetch.files]
        return dataclasses.replace(block, fetch=dataclasses.replace(block.fetch, files=files))

    detail = fetch_failure(pristine, forged(pristine, tmp_path, block=size))
    assert (
        detail.startswith("chunk 0 rank 0: file record of ") and "differs from the index" in detail
    )


def test_footer_facts_that_differ(pristine, tmp_path):
    def payload(footer):
        footer["fetch"]["sources"]["web"]["payload"] = {"kind": "text", "column": "lang"}

    detail = fetch_failure(pristine, forged(pristine, tmp_path, footer=payload))
    assert detail.startswith("source 'web': fetch facts ") and "differ from the index's" in detail
