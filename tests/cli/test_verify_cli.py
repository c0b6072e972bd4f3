"""`mds verify` from the command line: exit codes, the table, --json, one `error:` line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from cli_helpers import mds, one_error_line
from index_files import manifest_with_files, write_v1
from plan_builders import REPO

from mds.planner.index.build import build_index
from mds.planner.index.config import load_config
from mds.planner.plan.build import build_plan, with_overrides
from mds.planner.plan.config import load_plan_config


@pytest.fixture
def work(tmp_path) -> Path:
    """A copy of the sample data with its index and plan: tests may change it."""
    shutil.copytree(REPO / "sample_data", tmp_path / "data")
    config = tmp_path / "data" / "mds.toml"
    build_index(load_config(config), tmp_path / "index", workers=1)
    build_plan(
        with_overrides(load_plan_config(config), index=tmp_path / "index"), tmp_path / "plan.mds"
    )
    return tmp_path


def test_clean_plan_passes(work):
    result = mds("verify", work / "plan.mds")
    assert result.exit_code == 0, result.output
    for text in ("rank blocks", "source math: files", "ok", "checks passed"):
        assert text in result.stdout
    assert "FAILED" not in result.stdout and result.stderr == ""
    assert mds("verify", work / "plan.mds", "--full").exit_code == 0


def test_json(work):
    result = mds("verify", work / "plan.mds", "--json", "--full")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"ok", "plan_id", "checks", "first_failure"} <= set(data)
    assert data["ok"] is True and data["first_failure"] is None and data["mode"] == "full"
    assert all(set(c) == {"name", "ok", "detail"} and c["ok"] for c in data["checks"])


def test_corrupt_block_is_named(work):
    plan = work / "plan.mds"
    data = bytearray(plan.read_bytes())
    # chunk 0's directory is at 16: its first entry is rank 0's block (u64 offset first)
    block = int.from_bytes(data[16:24], "little")
    data[block + 3] ^= 0xFF
    plan.write_bytes(bytes(data))
    result = mds("verify", plan)
    line = one_error_line(result, "rank blocks: chunk 0 rank 0: checksum mismatch")
    assert line.startswith(f"error: {plan}: ")
    assert "FAILED" in result.stdout  # the table is still printed
    result = mds("verify", plan, "--json")
    assert result.exit_code == 1
    assert result.stderr == ""
    data = json.loads(result.stdout)
    assert data["ok"] is False
    assert data["first_failure"]["name"] == "rank blocks"
    assert data["error"]["type"] == "PlanError"
    assert "chunk 0 rank 0" in data["error"]["message"]


def test_touched_source_file(work):
    path = work / "data" / "books" / "books.parquet"
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5))
    assert mds("verify", work / "plan.mds").exit_code == 0  # same content: passes
    assert mds("verify", work / "plan.mds", "--full").exit_code == 0
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    one_error_line(
        mds("verify", work / "plan.mds"),
        "source books: files",
        "books/books.parquet: content changed",
    )


def test_changed_content_only_full_notices(work):
    path = work / "data" / "forum" / "forum.jsonl"
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[1000] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert mds("verify", work / "plan.mds").exit_code == 0
    one_error_line(mds("verify", work / "plan.mds", "--full"), "forum/forum.jsonl: content changed")


def test_other_index(work, tmp_path_factory):
    other = tmp_path_factory.mktemp("other") / "index"
    shutil.copytree(work / "index", other)
    manifest = manifest_with_files(other)
    manifest["sources"][0]["files"][0]["path"] = "../../etc/passwd"
    write_v1(other, manifest)  # file entries inline: one of them forged
    one_error_line(
        mds("verify", work / "plan.mds", "--index", other),
        "index manifest",
        "'../../etc/passwd' escapes the index root",
    )
    one_error_line(
        mds("verify", work / "plan.mds", "--index", work / "missing"), "not an mds index"
    )


def test_truncated_and_missing_plans(work):
    plan = work / "plan.mds"
    plan.write_bytes(plan.read_bytes()[:-1])
    one_error_line(mds("verify", plan), "plan file: ", "truncated")
    one_error_line(mds("verify", work / "nope.mds"), "cannot open plan")


def _copied(work: Path, to: Path) -> Path:
    """The tree (data, index, plan) copied whole to `to`, mtimes kept (`cp -rp`)."""
    for name in ("data", "index"):
        shutil.copytree(work / name, to / name)
    shutil.copy2(work / "plan.mds", to / "plan.mds")
    return to


@pytest.mark.parametrize("original", ["kept", "removed"])
def test_a_copied_tree_is_checked_where_the_executor_reads_it(work, tmp_path_factory, original):
    """The data root is the one the executor finds (the plan's, relative to its directory),
    named in the output, never the index's recorded root, with or without the original."""
    copy = _copied(work, tmp_path_factory.mktemp("copy"))
    if original == "removed":
        shutil.rmtree(work / "data")
    result = mds("verify", copy / "plan.mds")
    assert result.exit_code == 0, result.output
    assert f"data root checked: {copy / 'data'}" in " ".join(result.stdout.split())
    data = json.loads(mds("verify", copy / "plan.mds", "--json").stdout)
    assert data["ok"] is True and data["data_root"] == str(copy / "data")
    # a change in the copy is what fails: the copy is what the job reads
    path = copy / "data" / "books" / "books.parquet"
    path.write_bytes(path.read_bytes()[:-1])
    one_error_line(mds("verify", copy / "plan.mds"), "books/books.parquet: size changed")
    if original == "kept":
        assert mds("verify", work / "plan.mds").exit_code == 0  # the original is intact


def test_every_file_missing_ends_with_the_executors_hint(work, tmp_path_factory):
    from mds.core.storage import MOVED_HINT

    copy = _copied(work, tmp_path_factory.mktemp("copy"))
    shutil.rmtree(copy / "data")
    (copy / "data").mkdir()
    line = one_error_line(mds("verify", copy / "plan.mds"), "holds none of the indexed files")
    assert line.endswith(MOVED_HINT) and str(copy / "data") in line
    data = json.loads(mds("verify", copy / "plan.mds", "--json").stdout)
    assert data["data_root"] == str(copy / "data")
    assert data["error"]["message"].endswith(MOVED_HINT)
    # the data root the plan records is not there at all: the executor's refusal, same hint
    (copy / "data").rmdir()
    line = one_error_line(mds("verify", copy / "plan.mds"), "data root", "the plan or the data moved")
    assert line.endswith(MOVED_HINT)
    other = tmp_path_factory.mktemp("elsewhere")
    shutil.copytree(work / "data", other / "data")
    assert mds("verify", copy / "plan.mds", "--data-root", other / "data").exit_code == 0


def test_help_has_examples():
    result = mds("verify", "--help")
    assert result.exit_code == 0
    assert "Example" in result.stdout and "mds verify build/plan.mds --full" in result.stdout


def test_verify_reads_each_index_table_once(work, monkeypatch):
    """The table check and the fetch records' check share one read of each table."""
    from mds.planner.index import tables

    read = []
    original = tables.read_table_bytes
    monkeypatch.setattr(
        tables, "read_table_bytes", lambda p, c: (read.append(Path(p).name), original(p, c))[1]
    )
    assert mds("verify", work / "plan.mds").exit_code == 0
    assert read and len(read) == len(set(read))
