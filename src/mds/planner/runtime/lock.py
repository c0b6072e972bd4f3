"""One writer at a time per index or plan: a lock file next to the output.

The lock is `.NAME.lock` beside the output (never inside an index, hidden, so never data;
a name too long for the filesystem is shortened with a hash of it), holding the writer's
pid, host and start time. The record is written to a temporary file first and hard-linked
into place, so a lock is never seen empty and the link fails if a lock exists: it works
on every local and network filesystem, and the holder is readable for the error message.
A lock is stale when its pid is dead on this host, or when it is empty or unreadable
(only damage makes it so). A stale lock is taken over under flock(2) on the stale file
itself, checking it is still the file at the lock's path before removing it, so of many
racing writers exactly one removes it and one creates the next. The lock is removed when
the writer exits, on success, error or interrupt (only SIGKILL leaves it, and the next
writer on the host takes it over). An output in object storage gets a lock object
instead (src/mds/planner/runtime/object_lock.py), through the same `output_lock`.
"""

from __future__ import annotations

import errno
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mds.core import storage
from mds.errors import ConfigError, OutputError
from mds.planner.runtime.atomic import clean_stale_temps, pid_alive, same_machine, temp_sibling
from mds.planner.runtime.lock_record import held_by, lock_name, lock_record, parse_record

__all__ = ["lock_path", "output_lock"]

# Filesystems without hard links (FAT, some FUSE and SMB mounts) create the lock in place.
_NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}
_TRIES = 50


def lock_path(output: Path) -> Path:
    return output.with_name(lock_name(output.name))


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def _stale(holder: dict[str, Any], host: str) -> bool:
    if not holder:
        return True
    return same_machine(holder, host) and not pid_alive(holder["pid"])


def _read(fd: int) -> bytes:
    chunks, offset = [], 0
    while piece := os.pread(fd, 1 << 16, offset):
        chunks.append(piece)
        offset += len(piece)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _same(lock: Path, st: os.stat_result) -> bool:
    """Whether the lock's path still names the file `st` describes."""
    try:
        now = os.stat(lock)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def _flock(fd: int) -> bool:
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        return False  # not supported here (ENOLCK on some network filesystems)
    return True


def _create(lock: Path, record: bytes) -> tuple[int, int] | None:
    """Create the lock holding `record`: its (device, inode), or None if a lock exists."""
    tmp = temp_sibling(lock)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, record)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, lock)
        except FileExistsError:
            return None
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
            return _create_in_place(lock, record)
        return st.st_dev, st.st_ino
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def _create_in_place(lock: Path, record: bytes) -> tuple[int, int] | None:
    """_create where hard links are not supported: O_EXCL, then the record written under
    flock, which a writer taking over an (as yet) empty lock waits for."""
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return None
    st = os.fstat(fd)
    try:
        _flock(fd)
        _write_all(fd, record)
        if not _same(lock, st):
            return None  # taken for an abandoned empty lock before we wrote: look again
    except BaseException:
        if _same(lock, st):
            lock.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    return st.st_dev, st.st_ino


def _holder_or_take_over(lock: Path, host: str) -> dict[str, Any] | None:
    """The live holder of `lock`, or None once it is gone (released, or stale and removed
    here). Removal happens under flock on that very file, after checking the lock's path
    still names it, so two writers never both remove a lock and both create one."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        holder = parse_record(_read(fd))
        if not _stale(holder, host):
            return holder
        if not _flock(fd):
            raise ConfigError(
                f"{lock} is stale (pid {holder.get('pid')} on host {holder.get('host')}) but "
                "cannot be taken over safely on this filesystem (no flock): remove it"
            )
        if not _same(lock, os.fstat(fd)):
            return None  # taken over meanwhile: look at the new one
        holder = parse_record(_read(fd))
        if not _stale(holder, host):
            return holder
        os.unlink(lock)
        return None
    finally:
        os.close(fd)


def _acquire(output: Path, lock: Path) -> tuple[int, int]:
    host = socket.gethostname()
    record = json.dumps(lock_record()).encode()
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(lock)
        for _ in range(_TRIES):
            ours = _create(lock, record)
            if ours is not None:
                return ours
            holder = _holder_or_take_over(lock, host)
            if holder is not None:
                raise held_by(output, holder, lock)
    except OSError as exc:
        raise OutputError(f"cannot take the lock {lock}: {_reason(exc)}") from None
    raise ConfigError(f"{output}: cannot take the lock {lock}; remove it if no mds runs")


def _release(lock: Path, ours: tuple[int, int]) -> None:
    """Remove the lock if it is still the one we created (a lost one is left alone)."""
    try:
        st = os.stat(lock)
        if (st.st_dev, st.st_ino) == ours:
            os.unlink(lock)
    except OSError:
        pass  # gone, or the directory is no longer writable: stale once we exit


@contextmanager
def output_lock(output: Path | str) -> Iterator[Any]:
    """Hold the lock of `output` for the block; raise ConfigError if another writer has it,
    OutputError if the lock cannot be written. A URL (s3://, gs://) gets a lock object
    (src/mds/planner/runtime/object_lock.py; the block gets its handle), a path a lock file (its path)."""
    if storage.is_url(output):
        from mds.planner.runtime.object_lock import object_lock

        with object_lock(str(output)) as held:
            yield held
        return
    output = Path(output)
    lock = lock_path(output)
    ours = _acquire(output, lock)
    try:
        yield lock
    finally:
        _release(lock, ours)
