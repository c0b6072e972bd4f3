"""Data that moves: the data root given by argument, by MDS_DATA_ROOT or as recorded, and
checks by content when only mtimes differ (a touch, a copy that keeps no times)."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from cli_helpers import mds, one_error_line
from executor_builders import batch_digest, open_executor
from plan_builders import REPO

from mds.core import storage
from mds.core.storage import DATA_ROOT_ENV, given_root
from mds.errors import ConfigError, DataChangedError


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """The sample data indexed and planned under one directory: data/, index/, plan.mds."""
    from mds.planner.index.build import build_index
    from mds.planner.index.config import load_config
    from mds.planner.plan.build import build_plan
    from mds.planner.plan.config import load_plan_config

    top = tmp_path_factory.mktemp("tree")
    shutil.copytree(REPO / "sample_data", top / "data")
    config = top / "data" / "mds.toml"
    build_index(load_config(config), top / "index", workers=1)
    build_plan(replace(load_plan_config(config), index=top / "index"), top / "plan.mds")
    return top


@pytest.fixture(scope="module")
def digests(tree) -> list[str]:
    with open_executor(tree / "plan.mds", 1) as ex:
        return [batch_digest(b) for b in ex]


@pytest.fixture
def copied(tree, tmp_path) -> Path:
    """The data copied elsewhere without its mtimes (as cp without -p or s3 sync do)."""
    shutil.copytree(tree / "data", tmp_path / "moved", copy_function=shutil.copyfile)
    return tmp_path / "moved"


def _bump_mtimes(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            st = path.stat()
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 7_000_000_000))


def test_given_root_precedence(monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    assert given_root(None) == (None, "")
    monkeypatch.setenv(DATA_ROOT_ENV, "/from/env")
    assert given_root(None) == ("/from/env", DATA_ROOT_ENV)
    assert given_root("/from/arg") == ("/from/arg", "data_root")


def test_a_copy_without_mtimes_replays_the_same_plan(tree, copied, digests, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    _bump_mtimes(copied)  # whatever the copy did, no mtime is the indexed one
    with open_executor(tree / "plan.mds", 1, data_root=copied) as ex:
        assert ex.plan_id
        assert [batch_digest(b) for b in ex] == digests


def test_the_environment_points_a_launcher_at_the_copy(tree, copied, digests, monkeypatch):
    monkeypatch.setenv(DATA_ROOT_ENV, str(copied))
    shutil.rmtree(tree / "data" / "web", ignore_errors=False)  # the recorded root is not read
    try:
        with open_executor(tree / "plan.mds", 1) as ex:
            assert [batch_digest(b) for b in ex] == digests
        # the argument wins over the environment
        monkeypatch.setenv(DATA_ROOT_ENV, str(tree / "nowhere"))
        with open_executor(tree / "plan.mds", 1, data_root=copied) as ex:
            assert [batch_digest(b) for b in ex] == digests
        with pytest.raises(ConfigError, match=f"{DATA_ROOT_ENV}=.*nowhere.* is not a directory"):
            open_executor(tree / "plan.mds", 1)
    finally:
        shutil.copytree(copied / "web", tree / "data" / "web")


def test_a_touched_file_passes_the_stat_check(tree, copied, monkeypatch):
    """Only the mtime differs: the content fingerprint decides, and it matches."""
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    shutil.copystat(tree / "data" / "forum" / "forum.jsonl", copied / "forum" / "forum.jsonl")
    target = copied / "forum" / "forum.jsonl"
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with open_executor(tree / "plan.mds", 0, data_root=copied) as ex:
        for _ in ex:
            pass


def test_changed_content_is_an_error_naming_the_file(tree, copied, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    target = copied / "forum" / "forum.jsonl"
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # same size, new mtime
    target.write_bytes(bytes(raw))
    with pytest.raises(DataChangedError, match=r"forum/forum.jsonl: content changed") as info:
        with open_executor(tree / "plan.mds", 0, data_root=copied) as ex:
            for _ in ex:
                pass
    assert "modified (mtime_ns" in str(info.value)


def test_a_moved_plan_says_where_to_point_it(tree, tmp_path, digests, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    moved = tmp_path / "elsewhere" / "deeper" / "plan.mds"
    moved.parent.mkdir(parents=True)
    shutil.copy(tree / "plan.mds", moved)
    with pytest.raises(ConfigError) as info:
        open_executor(moved, 1)
    message = str(info.value)
    assert "data_root=" in message and DATA_ROOT_ENV in message and "--data-root" in message
    assert "mds index" not in message and "re-plan is needed" in message
    with open_executor(moved, 1, data_root=tree / "data") as ex:
        assert [batch_digest(b) for b in ex] == digests
    line = one_error_line(mds("verify", moved), "its index was expected at", "pass --index")
    assert "run `mds index`" not in line
    result = mds("verify", moved, "--index", tree / "index", "--data-root", tree / "data")
    assert result.exit_code == 0, result.output


def test_verify_takes_the_data_root(tree, copied, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    _bump_mtimes(copied)
    result = mds("verify", tree / "plan.mds", "--data-root", copied)
    assert result.exit_code == 0, result.output
    monkeypatch.setenv(DATA_ROOT_ENV, str(copied))
    assert mds("verify", tree / "plan.mds").exit_code == 0
    (copied / "web" / "part-00001.parquet").unlink()
    one_error_line(mds("verify", tree / "plan.mds"), "web/part-00001.parquet: missing")


def test_reindexing_a_copy_reuses_every_file(tree, copied, tmp_path, monkeypatch):
    """Content identity: a copy with new mtimes at another root re-indexes without a scan and
    keeps the index fingerprint, so plans made from it stay valid."""
    import json

    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    index = tmp_path / "index"
    shutil.copytree(tree / "index", index)
    _bump_mtimes(copied)
    result = mds("index", copied / "mds.toml", "-o", index, "--data-root", copied, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["files_scanned"] == 0
    before = json.loads((tree / "index" / "manifest.json").read_text())
    after = json.loads((index / "manifest.json").read_text())
    assert after["fingerprint"] == before["fingerprint"]
    assert after["root"] == str(copied.resolve())


def test_the_storage_page_names_every_knob():
    """docs/storage.md documents the variables and options the code reads."""
    from mds.core import storage

    page = (REPO / "docs" / "storage.md").read_text(encoding="utf-8")
    for name in (storage.DATA_ROOT_ENV, storage.TIMEOUT_ENV, storage.ATTEMPTS_ENV):
        assert f"`{name}`" in page
    for name in ("AWS_ENDPOINT_URL", "data_root=", "--data-root", "s3://"):
        assert name in page
    for command in ("verify", "index"):
        assert "--data-root" in mds(command, "--help").output


class _Opened:
    """An open object's handle as pyarrow gives it: its size and the metadata of its open."""

    def __init__(self, **meta: bytes):
        self.meta = meta

    def size(self) -> int:
        return 10

    def metadata(self) -> dict:
        return self.meta


@pytest.mark.parametrize(
    ("meta", "mtime_ns"),
    [
        ({"Last-Modified": b"2026-12-07T03:45:01Z"}, 1796615101 * 10**9),
        ({"updated": b"2026-12-07T03:45:04.997163+00:00"}, 1796615104997163000),
        ({"updated": b"2026-12-07T03:45:04.123456789Z"}, 1796615104123456789),
        ({"updated": b"2026-12-07T03:45:04.5Z"}, 1796615104500000000),
        ({"ETag": b'"abc"'}, None),
        ({"Last-Modified": b"Mon, 07 Dec 2026 03:45:01 GMT"}, None),
    ],
)
def test_an_opened_objects_stat_is_parsed_from_its_metadata(meta, mtime_ns):
    got = storage.opened_stat(_Opened(**meta), "s3://b/k")
    if mtime_ns is None:  # not a time this parses: the check asks the store (`stat`)
        assert got is None
    else:
        assert (got.st_size, got.st_mtime_ns) == (10, mtime_ns)
