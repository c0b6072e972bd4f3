"""Write files so that readers see the old version or the new one, never a partial one."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "atomic_write_bytes", "fsync_file", "is_temp", "temp_sibling"]

_TMP_MARK = ".tmp-"


def temp_sibling(path: Path) -> Path:
    """A hidden, unique name next to `path`, so the final rename stays on one filesystem."""
    return path.with_name(f".{path.name}{_TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def is_temp(path: Path) -> bool:
    return path.name.startswith(".") and _TMP_MARK in path.name


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
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
