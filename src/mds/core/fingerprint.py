"""Content fingerprints of source files, so a plan can prove its data is unchanged.

"sampled" hashes the size plus the first and last MiB and 16 evenly spaced 64 KiB blocks:
constant cost per file, and it catches appends, truncation and most rewrites. "full"
hashes every byte. Both are BLAKE2b-128 and labelled with their mode.
"""

from __future__ import annotations

import hashlib
import os

from mds.core import storage
from mds.errors import SourceDataError

__all__ = ["fingerprint", "hashes_every_byte", "stat_signature"]

_EDGE = 1 << 20
_BLOCK = 1 << 16
_BLOCKS = 16
_FULL_READ = 8 << 20


def _hash(f, size: int, mode: str, h) -> None:
    """Feed `h` the size of open file `f` and its bytes: all of them, or the sampled ones."""
    h.update(size.to_bytes(8, "little"))
    if mode == "full":
        while chunk := f.read(_FULL_READ):
            h.update(chunk)
    else:
        _sampled(f, size, h)


def _sampled(f, size: int, h) -> None:
    if size <= 2 * _EDGE + _BLOCKS * _BLOCK:
        h.update(f.read())
        return
    h.update(f.read(_EDGE))
    span = size - 2 * _EDGE - _BLOCK
    for i in range(_BLOCKS):
        f.seek(_EDGE + span * i // (_BLOCKS - 1))
        h.update(f.read(_BLOCK))
    f.seek(size - _EDGE)
    h.update(f.read(_EDGE))


def hashes_every_byte(fingerprint: str, *sizes: int) -> bool:
    """Whether a fingerprint of a file (and its companion) of these sizes covers all of their
    content: "full" always, "sampled" when each part is small enough to be hashed whole
    (3 MiB)."""
    mode = fingerprint.partition(":")[0]
    small = all(size <= 2 * _EDGE + _BLOCKS * _BLOCK for size in sizes)
    return mode == "full" or (mode == "sampled" and small)


def fingerprint(path: str | os.PathLike, mode: str = "sampled") -> str:
    """Return "<mode>:<hex>" for the file's content (see the module docstring)."""
    assert mode in ("sampled", "full"), mode
    h = hashlib.blake2b(digest_size=16)
    if storage.is_url(path):  # range reads of the object; errors name its URL
        with storage.open_input(path) as f:
            try:
                _hash(f, f.size(), mode, h)
            except OSError as exc:
                raise storage.failure(str(path), "read", exc) from None
        return f"{mode}:{h.hexdigest()}"
    try:
        with open(path, "rb") as f:
            _hash(f, os.fstat(f.fileno()).st_size, mode, h)
    except OSError as exc:
        raise SourceDataError(f"{path}: cannot read file ({exc.strerror or exc})") from None
    return f"{mode}:{h.hexdigest()}"


def stat_signature(path: str | os.PathLike) -> tuple[int, int]:
    """(size, mtime_ns): the cheap check used before a content fingerprint."""
    if storage.is_url(path):
        st = storage.stat(path)
        return st.st_size, st.st_mtime_ns
    try:
        st = os.stat(path)
    except OSError as exc:
        raise SourceDataError(f"{path}: cannot stat file ({exc.strerror or exc})") from None
    return st.st_size, st.st_mtime_ns
