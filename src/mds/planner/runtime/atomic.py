"""Write files so that readers see the old version or the new one, never a partial one."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mds.core.commit import (
    TMP_MARK,
    host_tag,
    is_temp_name,
    machine_id,
    replace_local,
    temp_name,
)
from mds.errors import MdsError, OutputError

__all__ = [
    "atomic_path",
    "atomic_write_bytes",
    "clean_stale_temps",
    "fsync_file",
    "is_temp",
    "pid_alive",
    "same_machine",
    "shortened",
    "temp_sibling",
]

# `.NAME.tmp-PID-HOST-RANDOM`: HOST is a short hash of the host name, so a writer can tell
# the temporaries of dead processes on its own host (safe to remove) from any other.
_TMP_RE = re.compile(r"\.tmp-(\d+)-([0-9a-f]{6})-[0-9a-f]{8}$")


# What a temporary's name adds to NAME: ".", ".tmp-", a pid of up to 7 digits, "-", the
# host tag, "-", 8 random hex digits; NAME keeps the rest of a 255-byte file name.
_STEM_MAX = 255 - len(f".{TMP_MARK}4194304-abcdef-01234567")


def shortened(name: str, room: int) -> str:
    """`name` if it fits in `room` bytes, else its start and a hash of all of it (still
    unique to it) in `room` bytes: for hidden names beside an output (its temporaries, its
    lock) within the file system's 255."""
    if len(os.fsencode(name)) <= room:
        return name
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:16]
    room -= len(f"~{digest}")
    head = os.fsencode(name)[:room].decode("utf-8", "ignore")
    while len(os.fsencode(head)) > room:  # a name that is not UTF-8 (surrogate escapes)
        head = head[:-1]
    return f"{head}~{digest}"


def _stem(name: str) -> str:
    """NAME as its temporaries start (shortened when a temporary's name would not fit)."""
    return shortened(name, _STEM_MAX)


def temp_sibling(path: Path) -> Path:
    """A hidden, unique name next to `path`, so the final rename stays on one filesystem."""
    return path.with_name(temp_name(_stem(path.name)))


def same_machine(holder: dict, host: str) -> bool:
    """Whether the writer a lock record names ran here, so that its pid is ours to ask
    about: the same host name and, when both sides know it, the same machine_id."""
    theirs, ours = holder.get("machine"), machine_id()
    return holder.get("host") == host and (not theirs or not ours or theirs == ours)


def pid_alive(pid: int) -> bool:
    """True if a process `pid` exists on this host (or we may not signal it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_temps(path: Path, *, every: bool = False) -> list[Path]:
    """Remove temporaries of `path` (with `every`: of anything in the directory `path`) left
    by dead processes of this host, e.g. after SIGKILL; a live writer's, or another host's,
    are left alone."""
    removed: list[Path] = []
    prefix, host = ("." if every else f".{_stem(path.name)}{TMP_MARK}"), host_tag()
    try:
        entries = list((path if every else path.parent).iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _TMP_RE.search(entry.name)
        if not entry.name.startswith(prefix) or match is None:
            continue
        pid = int(match.group(1))
        if match.group(2) != host or pid == os.getpid() or pid_alive(pid):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def is_temp(path: Path) -> bool:
    return is_temp_name(path.name)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces `path`, on failure it is removed."""
    tmp = temp_sibling(path)
    try:
        yield tmp
        fsync_file(tmp)
        replace_local(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def cannot_write(
    path: Path, what: str, exc: Exception, error: type[MdsError] = OutputError
) -> MdsError:
    """A failed write (disk full, read-only, permissions) as one line naming the output.
    Polars reports I/O failures as ComputeError "...underlying IO error: <reason>"."""
    reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
    return error(f"{path}: cannot write {what} ({reason.rpartition('IO error: ')[2]})")
