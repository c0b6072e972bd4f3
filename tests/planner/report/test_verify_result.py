"""src/mds/planner/report/verify_result.py: checks, the result of a run and its JSON."""

from __future__ import annotations

from pathlib import Path

from mds.planner.report.verify_result import VerifyResult, count, first_of


def test_the_first_failure_decides_and_names_the_problem():
    result = VerifyResult(Path("plan.mds"), full=False)
    result.add("plan file", "plan", None, "plan id x")
    assert result.ok and result.first_failure is None
    result.add("sections", "plan", "section 'stats': checksum mismatch", "3 sections")
    result.add("index manifest", "index", "gone", "")
    assert not result.ok
    first = result.first_failure
    assert (first.name, first.detail, first.kind) == (
        "sections",
        "section 'stats': checksum mismatch",
        "plan",
    )
    data = result.to_json()
    assert data["mode"] == "stat" and data["plan"] == "plan.mds" and data["index"] is None
    assert data["first_failure"] == {
        "name": "sections",
        "ok": False,
        "detail": "section 'stats': checksum mismatch",
    }
    assert [c["ok"] for c in data["checks"]] == [True, False, False]


def test_counts_and_the_first_of_many():
    assert count(1, "file") == "1 file" and count(1200, "file") == "1,200 files"
    assert first_of(None, 0, "blocks") is None
    assert first_of("chunk 2: bad", 1, "blocks") == "chunk 2: bad"
    assert first_of("chunk 2: bad", 3, "blocks") == "chunk 2: bad (and 2 more blocks)"
