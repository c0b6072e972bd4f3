"""`verify_plan`: every checksum of a plan, its index and its source files, and the first
mismatch named; the sample data is copied so tests can corrupt and change it. The checks
that fail are in test_verify_plan_file.py and test_verify_index.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from plan_builders import sample_workdir
from verify_builders import (
    PLAN_CHECKS,
    SOURCES,
    check,
)

from mds.planner.report.verify import verify_plan


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """Shared and never modified: copy its plan or index before corrupting it."""
    return sample_workdir(tmp_path_factory.mktemp("verify"))


@pytest.mark.parametrize("full", [False, True])
def test_a_clean_plan_verifies(pristine, full):
    result = verify_plan(pristine / "plan.mds", full=full)
    assert result.ok, result.first_failure
    assert result.first_failure is None
    names = [c.name for c in result.checks]
    per_source = [f"source {s}: {what}" for s in SOURCES for what in ("table", "files")]
    index_checks = ["index manifest", "index fingerprint"]
    replay = [f"source {s}: replay" for s in SOURCES]  # the executor's start-up checks
    assert names == PLAN_CHECKS + index_checks + per_source + replay + ["fetch records"]
    assert check(result, "source forum: replay").detail == (
        f"payload column, tokenizer {pristine / 'data' / 'tokenizer.json'} as indexed"
    )
    assert check(result, "fetch records").detail == (
        "2,048 samples: files, rows, token counts and byte ranges match the index"
    )
    assert result.index == pristine / "index"
    files = check(result, "source web: files").detail
    assert files == (
        "3 files, content fingerprints (sampled) match" if full else "3 files, size and mtime match"
    )
    assert "16 blocks, 2,048 samples" == check(result, "rank blocks").detail
    data = result.to_json()
    assert {"ok", "plan_id", "checks", "first_failure"} <= set(data)
    assert data["ok"] and data["first_failure"] is None
    assert data["mode"] == ("full" if full else "stat")
    assert all(set(c) == {"name", "ok", "detail"} for c in data["checks"])


def test_each_index_table_is_read_once(pristine, monkeypatch):
    """The table check and the fetch records' check share one checked read per table."""
    import builtins
    import io

    tables = {
        Path(s["table"]).name
        for s in json.loads((pristine / "index" / "manifest.json").read_text())["sources"]
    }
    opened: list[str] = []
    real_open = io.open

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and Path(file).name in tables:
            opened.append(Path(file).name)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    assert verify_plan(pristine / "plan.mds").ok
    assert sorted(opened) == sorted(tables)


def test_a_plan_still_verifies_after_its_index_is_re_indexed(pristine, tmp_path):
    """A re-index of a grown corpus keeps the replaced manifest and its tables (history/):
    the plan made before it verifies against the files it used, and one whose kept
    manifest is gone says which index it was made from."""
    import shutil

    from mds.planner.index.build import build_index
    from mds.planner.index.config import load_config

    work = tmp_path / "w"
    shutil.copytree(pristine, work, symlinks=True)
    shutil.copy2(work / "data/web/part-00002.parquet", work / "data/web/part-00003.parquet")
    before = json.loads((work / "index/manifest.json").read_text())["fingerprint"]
    after = build_index(load_config(work / "data/mds.toml"), work / "index", workers=1)
    assert after.fingerprint != before
    result = verify_plan(work / "plan.mds")
    assert result.ok, result.first_failure
    assert check(result, "index fingerprint").detail == before
    assert check(result, "source web: files").detail.startswith("3 files, ")  # not 4
    shutil.rmtree(work / "index/history")
    result = verify_plan(work / "plan.mds")
    assert not result.ok
    assert f"differs from the plan's {before}" in result.first_failure.detail
