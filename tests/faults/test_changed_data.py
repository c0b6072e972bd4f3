"""Data that changes under a run, and other data in the indexed data's place: a file rewritten
after its check is never read as training data (DataChangedError naming the file and the
step), a relocated copy is checked by content, and a root with none of the files says so."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from builders import jsonl_bytes, write_arrow, write_jsonl, write_megatron, write_parquet, write_zst
from cli_helpers import mds, one_error_line
from executor_builders import batch_digest
from plan_builders import index_data, plan_config

from mds.core.storage import DATA_ROOT_ENV
from mds.errors import DataChangedError
from mds.executor import PlanExecutor

ROWS = 24
RECHECK_ENV = "MDS_RECHECK"  # the benchmark's switch (sources.RECHECK_ENV)


def _ids(r: int) -> list[int]:
    return [(r * 7 + k) % 500 for k in range(5 + (r * 5) % 11)]


def _write(root: Path, fmt: str) -> tuple[str, dict[str, Any]]:
    """One source of ROWS token lists in `fmt` under `root`: (its file, its [[source]])."""
    rows = [_ids(r) for r in range(ROWS)]
    if fmt == "jsonl":
        write_jsonl(root / "d/data.jsonl", [{"ids": x} for x in rows])
        return "d/data.jsonl", {"path": "d/data.jsonl", "tokens": "ids"}
    if fmt == "jsonl.zst":
        write_zst(root / "d/data.jsonl.zst", jsonl_bytes({"ids": x} for x in rows), frames=4)
        return "d/data.jsonl.zst", {"path": "d/data.jsonl.zst", "tokens": "ids"}
    if fmt == "parquet":
        write_parquet(root / "d/data.parquet", {"ids": rows}, row_group_size=4)
        return "d/data.parquet", {"path": "d/data.parquet", "tokens": "ids"}
    if fmt == "arrow":
        write_arrow(root / "d/data.arrow", {"ids": rows})
        return "d/data.arrow", {"path": "d/data.arrow", "tokens": "ids"}
    assert fmt == "megatron"
    write_megatron(root / "d/data", rows)
    return "d/data.bin", {"path": "d/data"}


def _world(base: Path, fmt: str, write=_write) -> tuple[Path, str]:
    """Data, index and plan of one source in `fmt` (written by `write`): (the plan, the
    source file)."""
    from mds.planner.plan.build import build_plan

    root = base / "data"
    rel, source = write(root, fmt)
    config = {
        "index": {"output": "index"},
        "source": [{"name": "src", "weight": 1, **source}],
        "train": {
            "steps": 12,
            "dp_size": 1,
            "micro_batches": 1,
            "samples_per_step": 2,
            "max_tokens_per_micro_batch": 64,
            "seed": 3,
        },
    }
    index_data(root, config)
    plan = base / "plan.mds"
    build_plan(plan_config(root, config), plan, workers=1)
    return plan, rel


def _rewrite_in_place(path: Path) -> None:
    """Flip a bit of every byte after the first quarter, in place (same inode and size); the
    mtime moves on as a later write's would."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size // 4)
        tail = bytearray(f.read())
        for k in range(len(tail)):
            tail[k] ^= 0x01
        f.seek(st.st_size // 4)
        f.write(bytes(tail))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def _replace_by_rename(path: Path) -> None:
    """Another file renamed over `path`: same size and mtime, other bytes (a `cp -p` of
    changed data moved into place)."""
    st = path.stat()
    raw = bytearray(path.read_bytes())
    for k in range(len(raw) // 4, len(raw)):
        raw[k] ^= 0x01
    new = path.with_name(path.name + ".new")
    new.write_bytes(bytes(raw))
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, path)


def _replay_until_changed(plan: Path, expected: list[str], change, **kwargs: Any) -> str:
    """Replay `plan`, calling `change` after three steps: every batch handed out must be the
    unchanged run's, and the run must stop with DataChangedError; returns its message."""
    with PlanExecutor(plan, 0, **kwargs) as ex:
        it = iter(ex)
        got = [batch_digest(next(it)) for _ in range(3)]
        change()
        with pytest.raises(DataChangedError) as info:
            for batch in it:
                got.append(batch_digest(batch))
    assert got == expected[: len(got)]  # never a batch of changed bytes
    assert len(got) < len(expected)
    return str(info.value)


@pytest.fixture
def expected_of():
    def run(plan: Path, **kwargs: Any) -> list[str]:
        with PlanExecutor(plan, 0, **kwargs) as ex:
            return [batch_digest(b) for b in ex]

    return run


FORMATS = ["jsonl", "jsonl.zst", "megatron", "arrow", "parquet"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_file_rewritten_in_place_during_the_run_stops_it(fmt, tmp_path, expected_of, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    plan, rel = _world(tmp_path, fmt)
    kwargs = dict(read_ahead=0, cache_bytes=0)
    expected = expected_of(plan, **kwargs)
    path = tmp_path / "data" / rel
    message = _replay_until_changed(plan, expected, lambda: _rewrite_in_place(path), **kwargs)
    assert rel in message and "changed after it was checked" in message
    assert "at step 3" in message


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_file_replaced_by_rename_is_not_read(fmt, tmp_path, expected_of, monkeypatch):
    """A new file at the path, same size and mtime: caught when the file is opened again
    (one open file at a time here) or, for a memory map, at the path on the next read."""
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    plan, rel = _world(tmp_path, fmt)
    kwargs = dict(read_ahead=0, cache_bytes=0)
    expected = expected_of(plan, **kwargs)
    path = tmp_path / "data" / rel

    def change() -> None:
        _replace_by_rename(path)
        if fmt == "megatron":
            _replace_by_rename(path.with_suffix(".idx"))

    # open files are forgotten so the next read opens the path again, as an evicted one is
    with PlanExecutor(plan, 0, **kwargs) as ex:
        it = iter(ex)
        got = [batch_digest(next(it)) for _ in range(3)]
        change()
        if fmt != "arrow":
            ex._catalog.reset()
        with pytest.raises(DataChangedError, match="replaced") as info:
            for batch in it:
                got.append(batch_digest(batch))
    assert got == expected[: len(got)] and len(got) < len(expected)
    assert rel.rsplit(".", 1)[0] in str(info.value) and "at step 3" in str(info.value)


def test_a_same_size_replacement_its_sampled_fingerprint_skips_stops_the_run(
    tmp_path, expected_of, monkeypatch
):
    """A file over 3 MiB replaced (same size and mtime) by one that differs only in bytes
    its sampled fingerprint does not read: that fingerprint cannot vouch for the new bytes,
    so the run stops instead of reading them."""
    from mds.core.fingerprint import _BLOCK, _EDGE

    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)

    def write(root: Path, fmt: str) -> tuple[str, dict[str, Any]]:
        pad = "x" * 200_000  # 24 lines: about 4.6 MiB
        write_jsonl(root / "d/big.jsonl", [{"ids": _ids(r), "pad": pad} for r in range(ROWS)])
        return "d/big.jsonl", {"path": "d/big.jsonl", "tokens": "ids"}

    plan, rel = _world(tmp_path, "jsonl", write)
    kwargs = dict(read_ahead=0, cache_bytes=0)
    expected = expected_of(plan, **kwargs)
    path = tmp_path / "data" / rel

    def change() -> None:
        st = path.stat()
        raw = bytearray(path.read_bytes())
        at = _EDGE + _BLOCK + 100  # between the first two sampled blocks
        assert raw[at : at + 1] == b"x"
        raw[at] = ord("y")
        new = path.with_name("big.new")
        new.write_bytes(bytes(raw))
        os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(new, path)
        with PlanExecutor(plan, 0, **kwargs):
            pass  # the new bytes pass a fresh start-up check: only the pin can tell
        ex_reset()

    with PlanExecutor(plan, 0, **kwargs) as ex:
        ex_reset = ex._catalog.reset
        it = iter(ex)
        got = [batch_digest(next(it)) for _ in range(3)]
        change()
        with pytest.raises(DataChangedError, match="replaced") as info:
            for batch in it:
                got.append(batch_digest(batch))
    assert got == expected[: len(got)] and rel in str(info.value)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_touched_file_whose_bytes_are_the_same_replays_on(
    fmt, tmp_path, expected_of, monkeypatch
):
    """`touch` during the run: the mtime moved, the bytes did not, and the fingerprint (every
    byte of a small file) says so; the run goes on with the same batches."""
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    plan, rel = _world(tmp_path, fmt)
    kwargs = dict(read_ahead=0, cache_bytes=0)
    expected = expected_of(plan, **kwargs)
    path = tmp_path / "data" / rel
    with PlanExecutor(plan, 0, **kwargs) as ex:
        it = iter(ex)
        got = [batch_digest(next(it)) for _ in range(3)]
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        ex._catalog.reset()
        got += [batch_digest(batch) for batch in it]
    assert got == expected


def test_an_unchanged_file_touched_by_nothing_replays(tmp_path, expected_of, monkeypatch):
    """Re-checks find nothing on data left alone: the same batches with them and without."""
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    plan, _rel = _world(tmp_path, "parquet")
    with_checks = expected_of(plan, read_ahead=0, cache_bytes=1 << 10)
    monkeypatch.setenv(RECHECK_ENV, "0")
    assert expected_of(plan, read_ahead=0, cache_bytes=1 << 10) == with_checks


def test_the_switch_turns_the_re_checks_off(tmp_path, expected_of, monkeypatch):
    """MDS_RECHECK=0 (for the benchmark): a rewrite after the check goes unseen; the test of
    the switch itself, so the comparison the benchmark makes is of checks on against off."""
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    plan, rel = _world(tmp_path, "jsonl")
    monkeypatch.setenv(RECHECK_ENV, "0")
    with PlanExecutor(plan, 0, read_ahead=0, cache_bytes=0) as ex:
        it = iter(ex)
        next(it)
        path = tmp_path / "data" / rel
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # "modified", same bytes
        assert len(list(it)) == 11


# --- objects ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "store_kind,fmt",
    [("s3", fmt) for fmt in FORMATS] + [("gcs", "jsonl")],
)
def test_an_object_rewritten_during_the_run_stops_it(store_kind, fmt, tmp_path, monkeypatch):
    """A store on a small cache: the reads of an open handle go to the object as it is now
    (the GCS emulator too, though the service pins the generation), so each fetch that went
    to the store asks for the object's version after reading."""
    from gcs_store import gcs_server
    from s3_store import s3_server

    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    plan, rel = _world(tmp_path, fmt)
    kwargs = dict(read_ahead=0, cache_bytes=1 << 10)
    server = s3_server if store_kind == "s3" else gcs_server
    with server(monkeypatch) as store:
        url = store.upload(tmp_path / "data", "data")
        with PlanExecutor(plan, 0, data_root=url, **kwargs) as ex:
            expected = [batch_digest(b) for b in ex]
        path = tmp_path / "data" / rel

        def change() -> None:
            _rewrite_in_place(path)
            store.put(f"data/{rel}", path.read_bytes())

        message = _replay_until_changed(plan, expected, change, data_root=url, **kwargs)
    assert f"{url}/{rel}" in message and "at step 3" in message
    assert "changed after it was checked" in message


@pytest.mark.parametrize("megatron", [False, True])
@pytest.mark.parametrize("modify", [False, True])
def test_uploaded_objects_are_checked_by_content_through_the_checks_open(
    modify, megatron, tmp_path, expected_of, monkeypatch
):
    """An upload of the indexed data is a relocated root: each object's content fingerprint
    (a Megatron file's with its companion's) is checked before any of its bytes is used,
    read through the open the check makes (one HEAD an object, not a second open for the
    fingerprint); other bytes of the same size are refused naming the file."""
    from fault_proxy import fault_proxy
    from s3_store import s3_server

    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    plan, rel = _world(tmp_path, "megatron" if megatron else "parquet")
    expected = expected_of(plan)
    _relocated_copy(tmp_path / "data", tmp_path / "copy", rel, modify=modify)
    with s3_server(monkeypatch) as store:
        url = store.upload(tmp_path / "copy", "copy")
        with fault_proxy(store, monkeypatch) as proxy:
            if modify:
                with pytest.raises(DataChangedError, match=f"{rel}: content changed"):
                    PlanExecutor(plan, 0, data_root=url, read_ahead=0)
                return
            with PlanExecutor(plan, 0, data_root=url, read_ahead=0) as ex:
                heads = [k for m, k, _q in proxy.requests("HEAD")]
                assert [batch_digest(b) for b in ex] == expected
    assert sorted(heads) == sorted({f"copy/{rel}", f"copy/{rel[:-4]}.idx"} if megatron else {f"copy/{rel}"})


# --- relocated roots ----------------------------------------------------------------------


def _relocated_copy(root: Path, copy: Path, rel: str, modify: bool) -> None:
    """`cp -rp root copy`, then (`modify`) other bytes in `rel` with its size and mtime."""
    shutil.copytree(root, copy)  # copy2: keeps mtimes, as cp -p and rsync -a do
    if modify:
        target = copy / rel
        st = target.stat()
        raw = bytearray(target.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        target.write_bytes(bytes(raw))
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_relocated_copy_with_other_bytes_is_refused(fmt, tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    plan, rel = _world(tmp_path, fmt)
    copy = tmp_path / "copy"
    _relocated_copy(tmp_path / "data", copy, rel, modify=True)
    with pytest.raises(DataChangedError, match=f"{rel}: content changed"):
        with PlanExecutor(plan, 0, data_root=copy) as ex:
            list(ex)
    result = mds("verify", plan, "--data-root", copy)
    assert result.exit_code != 0
    assert f"{rel}: content changed" in result.output


def test_an_unchanged_relocated_copy_replays_bit_identically(tmp_path, expected_of, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    plan, rel = _world(tmp_path, "parquet")
    expected = expected_of(plan)
    copy = tmp_path / "copy"
    _relocated_copy(tmp_path / "data", copy, rel, modify=False)
    assert expected_of(plan, data_root=copy) == expected
    monkeypatch.setenv(DATA_ROOT_ENV, str(copy))
    assert expected_of(plan) == expected
    assert mds("verify", plan).exit_code == 0
    assert mds("verify", plan, "--data-root", copy).exit_code == 0


def test_the_recorded_root_given_again_is_not_relocated(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    plan, _rel = _world(tmp_path, "jsonl")
    with PlanExecutor(plan, 0, data_root=tmp_path / "data") as ex:
        assert not ex._catalog.plan.relocated
    with PlanExecutor(plan, 0, data_root=tmp_path / "data" / "d" / "..") as ex:
        assert not ex._catalog.plan.relocated
    with PlanExecutor(plan, 0) as ex:
        assert not ex._catalog.plan.relocated


# --- a root with none of the files --------------------------------------------------------


def test_an_empty_root_says_it_holds_none_of_the_files(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    plan, _rel = _world(tmp_path, "jsonl")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataChangedError) as info:
        PlanExecutor(plan, 0, data_root=empty)
    message = str(info.value)
    assert f"data root {empty} (from data_root) holds none of the indexed files" in message
    assert "--data-root" in message and "the data changed" not in message
    line = one_error_line(mds("verify", plan, "--data-root", empty), "holds none of the indexed")
    assert str(empty) in line and "--data-root" in line


def test_an_empty_prefix_or_a_missing_bucket_says_so(tmp_path, monkeypatch):
    from s3_store import s3_server

    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    plan, _rel = _world(tmp_path, "jsonl")
    with s3_server(monkeypatch) as store:
        store.upload(tmp_path / "data", "data")
        for url in (store.url("elsewhere"), "s3://no-such-bucket/data"):
            with pytest.raises(DataChangedError) as info:
                PlanExecutor(plan, 0, data_root=url)
            message = str(info.value)
            assert f"data root {url} (from data_root) holds none of the indexed files" in message
            assert "--data-root" in message and "the data changed" not in message


def test_a_changed_file_stays_refused(tmp_path, monkeypatch):
    """Once a file is found changed, a retry of the step fails the same way (blocks decoded
    from its new bytes while it was read are cached, and are not served)."""
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    plan, rel = _world(tmp_path, "parquet")
    with PlanExecutor(plan, 0, read_ahead=0) as ex:
        next(iter(ex))
        _rewrite_in_place(tmp_path / "data" / rel)
        pos = 1
        with pytest.raises(DataChangedError) as info:
            for pos in range(1, ex.total):  # noqa: B007 - the position that raised
                ex.micro_batch_at(pos)
        first = str(info.value)
        assert rel in first and f"at step {pos}" in first
        for _ in range(2):
            with pytest.raises(DataChangedError) as info:
                ex.micro_batch_at(pos)
            assert str(info.value) == first


def test_a_spawned_worker_keeps_the_versions_its_parent_checked(tmp_path, monkeypatch):
    """An executor rebuilt in a spawned DataLoader worker (from what it pickles to: its
    `__reduce__`, then `__setstate__`) does not check again what its parent checked, and
    compares what it reads with the parent's pins."""
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    plan, rel = _world(tmp_path, "jsonl")
    with PlanExecutor(plan, 0, read_ahead=0, cache_bytes=0) as ex:
        next(iter(ex))
        _rewrite_in_place(tmp_path / "data" / rel)
        rebuild, args, state = ex.__reduce__()
        child = rebuild(*args)
        child.__setstate__(state)  # as unpickling does
        with child:
            assert child._catalog.checks.pins == ex._catalog.checks.pins
            with pytest.raises(DataChangedError, match=f"{rel} changed after it was checked"):
                list(child)
