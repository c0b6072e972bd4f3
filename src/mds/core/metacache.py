"""Parsed file metadata (Parquet footers and their schema checks, zstd frame tables), kept per
process apart from open files and decoded blocks.

Reopening a file whose handle was evicted then costs an open, not another parse, and the
churn of decoded blocks cannot push metadata out. Entries are keyed by `lru.version_key`,
so a changed file is parsed afresh, and bounded by bytes (`configure`); an entry larger
than the bound is not kept. Forked processes inherit the entries (immutable parsed data,
no file descriptors), which is what lets DataLoader workers skip parses the parent made.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Hashable
from typing import Any

from mds.core.lru import LRU

__all__ = [
    "DEFAULT_MAX_BYTES",
    "clear",
    "configure",
    "get",
    "keep",
    "lookup",
    "max_bytes",
    "nbytes",
    "put",
]

DEFAULT_MAX_BYTES = 32 << 20
_ENV = "MDS_METADATA_CACHE_BYTES"


def _initial_bound() -> int:
    raw = os.environ.get(_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{_ENV}={raw!r} must be a number of bytes >= 0")
    return value


_lock = threading.Lock()
_cache = LRU(max_bytes=_initial_bound())


def _new_lock_in_child() -> None:
    # A lock held by another thread at fork time would stay held forever in the child.
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


def get(key: Hashable) -> Any:
    """The metadata stored under `key`, or None."""
    with _lock:
        return _cache.get(key)


def put(key: Hashable, value: Any, nbytes: int) -> bool:
    """Keep `value` (taking `nbytes` of memory); False if it is larger than the bound."""
    with _lock:
        if not _cache.fits(nbytes):
            return False
        _cache.put(key, value, nbytes)
        return True


def lookup(key: Hashable, spill: LRU | None = None) -> Any:
    """The metadata under `key` here, else in `spill` (where `keep` puts entries too large
    for this cache), else None."""
    value = get(key)
    if value is None and spill is not None:
        value = spill.get(key)
    return value


def keep(key: Hashable, value: Any, nbytes: int, spill: LRU | None = None) -> None:
    """Store `value` here, or in `spill` (e.g. the block cache) if it is larger than this
    cache's bound: a large entry (the frame table of a huge zstd file) then competes with
    decoded blocks."""
    if not put(key, value, nbytes) and spill is not None:
        spill.put(key, value, nbytes)


def configure(max_bytes: int) -> None:
    """Set this process's bound in bytes (default 32 MiB, or $MDS_METADATA_CACHE_BYTES);
    0 keeps nothing."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ValueError(f"max_bytes={max_bytes!r} must be an integer >= 0")
    with _lock:
        _cache.resize(max_bytes)


def max_bytes() -> int:
    """The bound in force."""
    return int(_cache.max_bytes or 0)


def nbytes() -> int:
    """Bytes held now."""
    return _cache.nbytes


def clear() -> None:
    """Drop every entry."""
    with _lock:
        _cache.clear()
