from __future__ import annotations

import errno
import json
import multiprocessing
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mds.errors import ConfigError, OutputError
from mds.planner.runtime.lock import lock_path, output_lock


def test_lock_is_exclusive_and_removed(tmp_path: Path) -> None:
    out = tmp_path / "plan.mds"
    with output_lock(out) as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(ConfigError, match="is being written by pid"):
            with output_lock(out):
                pass
    assert not lock_path(out).exists()


def test_lock_removed_on_error(tmp_path: Path) -> None:
    out = tmp_path / "index"
    with pytest.raises(KeyboardInterrupt):
        with output_lock(out):
            raise KeyboardInterrupt
    assert not lock_path(out).exists()


def _dead_pid() -> int:
    """The pid of a process of this host that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _stale_record() -> str:
    return json.dumps({"pid": _dead_pid(), "host": socket.gethostname(), "since": "then"})


def _racer(out: Path, trials: int, barrier: Any, wins: Any) -> None:
    for trial in range(trials):
        barrier.wait()  # the stale lock is in place
        try:
            with output_lock(out):
                with wins.get_lock():
                    wins[trial] += 1
                barrier.wait()  # every racer has tried, the winner still holds it
        except ConfigError:
            barrier.wait()
        barrier.wait()  # the winner has released it


def _no_links(monkeypatch: pytest.MonkeyPatch) -> None:
    """A filesystem without hard links (FAT, some FUSE mounts): link(2) fails with EPERM."""

    def link(*args, **kwargs):
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "link", link)


@pytest.mark.parametrize("links", [True, False], ids=["links", "no-links"])
def test_racing_takeover_of_a_stale_lock_has_one_winner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, links: bool
) -> None:
    """8 processes take over the same stale lock at once, 20 times: exactly one holds it."""
    if not links:
        _no_links(monkeypatch)
    out, racers, trials = tmp_path / "plan.mds", 8, 20
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(racers + 1, timeout=60)
    wins = ctx.Array("i", trials)
    procs = [ctx.Process(target=_racer, args=(out, trials, barrier, wins)) for _ in range(racers)]
    record = _stale_record()
    for p in procs:
        p.start()
    try:
        for _ in range(trials):
            lock_path(out).write_text(record)
            barrier.wait()
            barrier.wait()
            barrier.wait()
            assert not lock_path(out).exists()
    finally:
        for p in procs:
            p.join(timeout=60)
    assert list(wins) == [1] * trials


def test_stale_lock_of_a_dead_pid_is_taken_over(tmp_path: Path) -> None:
    out = tmp_path / "plan.mds"
    lock_path(out).write_text(_stale_record())
    with output_lock(out) as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock_path(out).exists()


@pytest.mark.parametrize("content", [b"", b'{"pid": nul', b"\xff\xfe", b"[]", b"{}"])
def test_empty_or_damaged_lock_is_stale(tmp_path: Path, content: bytes) -> None:
    """A lock is never seen empty while it is written, so empty means left by a failure."""
    out = tmp_path / "index"
    lock_path(out).write_bytes(content)
    with output_lock(out) as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock_path(out).exists()


def test_lock_is_never_seen_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record is in place the moment the lock exists (written first, then linked)."""
    out = tmp_path / "plan.mds"
    seen: list[bytes] = []
    real_link = os.link

    def link(src, dst, *args, **kwargs):
        real_link(src, dst, *args, **kwargs)
        seen.append(Path(dst).read_bytes())

    monkeypatch.setattr(os, "link", link)
    with output_lock(out):
        pass
    assert seen and json.loads(seen[0])["pid"] == os.getpid()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG])
def test_lock_write_failure_is_one_error_and_leaves_no_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    out = tmp_path / "plan.mds"
    real_write = os.write

    def write(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path)):
            raise OSError(code, os.strerror(code))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(OutputError) as caught:
        with output_lock(out):
            pass
    message = str(caught.value)
    assert str(lock_path(out)) in message and os.strerror(code) in message
    assert "\n" not in message
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []  # neither the lock nor its temporary
    with output_lock(out):  # and the next run is not blocked
        pass


def test_unwritable_directory_is_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EACCES or EROFS creating the lock (root ignores a read-only mode, so it is faked)."""
    out = tmp_path / "plan.mds"
    real_open = os.open

    def deny(path, flags, *args, **kwargs):
        if Path(path).parent == tmp_path and flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    with pytest.raises(
        OutputError, match=f"cannot take the lock {lock_path(out)}: Permission denied"
    ):
        with output_lock(out):
            pass


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_read_only_directory_is_one_error(tmp_path: Path) -> None:
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(OutputError, match="cannot take the lock"):
            with output_lock(tmp_path / "plan.mds"):
                pass
    finally:
        tmp_path.chmod(0o755)


def test_parent_that_is_a_file_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "sub" / "plan.mds"
    with pytest.raises(OutputError, match=f"cannot take the lock {lock_path(out)}: "):
        with output_lock(out):
            pass


def test_long_output_name_gets_a_short_lock_beside_it(tmp_path: Path) -> None:
    out = tmp_path / ("p" * 250)
    other = tmp_path / ("p" * 249 + "q")
    lock = lock_path(out)
    assert lock.parent == tmp_path and lock.name.startswith(".ppp") and len(lock.name) <= 200
    assert lock != lock_path(other)
    with output_lock(out) as held:
        assert held == lock and json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(ConfigError, match="is being written by pid"):
            with output_lock(out):
                pass
        with output_lock(other):
            pass
    assert not lock.exists()


def test_long_output_name_through_the_cli(tmp_path: Path) -> None:
    """An index directory named with 250 characters: indexed, no NAME_MAX traceback from
    its lock."""
    from cli_helpers import mds
    from fault_builders import write_world

    config = write_world(tmp_path / "w")
    out = tmp_path / ("i" * 250)
    result = mds("index", config, "-o", out)
    assert result.exit_code == 0, result.output
    assert (out / "manifest.json").exists() and not lock_path(out).exists()


def test_lock_without_hard_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where link(2) is not supported the lock is created in place, still exclusive."""
    _no_links(monkeypatch)
    out = tmp_path / "plan.mds"
    with output_lock(out) as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(ConfigError, match="is being written by pid"):
            with output_lock(out):
                pass
    assert os.listdir(tmp_path) == []


def test_full_disk_at_the_lock_is_one_cli_line(tmp_path: Path, monkeypatch) -> None:
    """`mds index` on a full disk: exit 1, one line naming the lock, no lock left."""
    from cli_helpers import mds, one_error_line
    from fault_builders import write_world

    config = write_world(tmp_path / "w")
    out = tmp_path / "out" / "index"
    out.parent.mkdir()
    real_write = os.write

    def write(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(out.parent)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    one_error_line(mds("index", config, "-o", out), str(lock_path(out)), "No space left")
    assert os.listdir(out.parent) == []


def test_a_dead_pid_in_another_pid_namespace_is_not_stale(tmp_path: Path) -> None:
    """Same host name, another boot or PID namespace (a container on the same node): the
    holder's pid cannot be asked about here, so its lock is not taken over; an older record
    without the machine field is judged by host and pid as before."""
    out = tmp_path / "plan.mds"
    record = {"pid": _dead_pid(), "host": socket.gethostname(), "since": "then"}
    lock_path(out).write_text(json.dumps({**record, "machine": "another/pid:[1]"}))
    with pytest.raises(ConfigError, match="is being written by pid"):
        with output_lock(out):
            pass
    lock_path(out).write_text(json.dumps(record))
    with output_lock(out):
        pass
    assert not lock_path(out).exists()
