"""Content fingerprints of source files, so a plan can prove its data is unchanged.

"sampled" hashes the size plus the first and last MiB and 16 evenly spaced 64 KiB blocks:
constant cost per file, and it catches appends, truncation and most rewrites. "full"
hashes every byte. Both are BLAKE2b-128 and labelled with their mode.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from mds.core import storage
from mds.errors import SourceDataError

__all__ = ["fingerprint", "hashes_every_byte", "opened_fingerprints", "spans", "stat_signature"]

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


def spans(size: int, mode: str) -> list[tuple[int, int]]:
    """The byte ranges [lo, hi) whose bytes, in this order after the size, `fingerprint`
    hashes in `mode` for a file of `size` bytes: they can be read in any order, at once."""
    if mode == "full":
        return [(lo, min(lo + _FULL_READ, size)) for lo in range(0, size, _FULL_READ)]
    if size <= 2 * _EDGE + _BLOCKS * _BLOCK:
        return [(0, size)] if size else []
    span = size - 2 * _EDGE - _BLOCK
    blocks = [_EDGE + span * i // (_BLOCKS - 1) for i in range(_BLOCKS)]
    return [(0, _EDGE), *((lo, lo + _BLOCK) for lo in blocks), (size - _EDGE, size)]


def opened_fingerprints(
    objects: dict[str, tuple[Any, int, str]],
    read_in_order: Callable[[list[tuple[Any, str, int, int, int]]], Iterator[bytes | None]],
) -> dict[tuple[str, str], str]:
    """`fingerprint` of objects already open, by (URL, mode): `objects` maps a URL to (its
    open handle, its size at the open, the mode); `read_in_order` yields the bytes of every
    (handle, URL, size, lo, hi) asked, in order (a store's requests in flight together),
    None for a read that failed. An object with a failed read is left out (`fingerprint`
    of it then reads it again, and names what it finds)."""
    jobs = [
        (handle, url, size, lo, hi)
        for url, (handle, size, mode) in objects.items()
        for lo, hi in spans(size, mode)
    ]
    parts = read_in_order(jobs)
    out = {}
    for url, (_handle, size, mode) in objects.items():
        h = hashlib.blake2b(digest_size=16)
        h.update(size.to_bytes(8, "little"))
        whole = True
        for _ in spans(size, mode):
            part = next(parts)
            whole = whole and part is not None
            if whole:
                h.update(part)  # type: ignore[arg-type]
        if whole:
            out[(url, mode)] = f"{mode}:{h.hexdigest()}"
    return out


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
