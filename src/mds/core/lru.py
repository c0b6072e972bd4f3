"""A small least-recently-used cache bounded by entry count and/or total bytes.

The executor keeps three: open file readers (by count; evicting one closes it), decoded
blocks such as Parquet row groups and zstd frames (by bytes), and parsed file metadata
(by bytes, `metacache`). `LRU` is not thread-safe; `LockedLRU` is (the block cache, which
the threads reading a step's files share).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["LRU", "LockedLRU", "version_key"]


def version_key(kind: str, path: Any, st: os.stat_result) -> tuple:
    """The cache key of what was parsed (`kind`) from one version of a file: its identity
    and version, so a changed file is parsed afresh."""
    return (path, kind, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class LRU:
    """An ordered mapping that drops its least recently used entries to stay within bounds.

    `on_evict(key, value)` is called for every entry the cache lets go of on its own
    (eviction, replacement, an entry too large to store, `clear`), never for `pop`.
    """

    def __init__(
        self,
        max_items: int | None = None,
        max_bytes: int | None = None,
        on_evict: Callable[[Any, Any], None] | None = None,
    ):
        for name, bound in (("max_items", max_items), ("max_bytes", max_bytes)):
            if bound is not None and bound < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {bound}")
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._on_evict = on_evict
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    @property
    def nbytes(self) -> int:
        """The total of the `nbytes` given with the entries held now."""
        return self._nbytes

    def fits(self, nbytes: int) -> bool:
        """Whether an entry of this size can be stored at all."""
        return self.max_bytes is None or nbytes <= self.max_bytes

    def get(self, key: Hashable) -> Any:
        """The value for `key` (now the most recently used), or None if absent."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: Hashable, value: Any, nbytes: int = 0) -> None:
        """Store `value` as the most recently used entry, evicting others to stay in bounds."""
        old = self._entries.pop(key, None)
        if old is not None:
            self._nbytes -= old[1]
            if old[0] is not value:
                self._evicted(key, old[0])
        if not self.fits(nbytes):
            self._evicted(key, value)
            return
        self._entries[key] = (value, nbytes)
        self._nbytes += nbytes
        while self._entries and self._over():
            victim, (dropped, size) = self._entries.popitem(last=False)
            self._nbytes -= size
            self._evicted(victim, dropped)

    def resize(self, max_bytes: int | None) -> None:
        """Change the byte bound, evicting least recently used entries to fit the new one."""
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 or None, got {max_bytes}")
        self.max_bytes = max_bytes
        while self._entries and self._over():
            victim, (dropped, size) = self._entries.popitem(last=False)
            self._nbytes -= size
            self._evicted(victim, dropped)

    def pop(self, key: Hashable) -> Any:
        """Remove and return the value for `key` (None if absent); `on_evict` is not called."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._nbytes -= entry[1]
        return entry[0]

    def clear(self) -> None:
        """Drop every entry, least recently used first, calling `on_evict` for each."""
        while self._entries:
            key, (value, size) = self._entries.popitem(last=False)
            self._nbytes -= size
            self._evicted(key, value)

    def _over(self) -> bool:
        return (self.max_items is not None and len(self._entries) > self.max_items) or (
            self.max_bytes is not None and self._nbytes > self.max_bytes
        )

    def _evicted(self, key: Hashable, value: Any) -> None:
        if self._on_evict is not None:
            self._on_evict(key, value)


class LockedLRU(LRU):
    """An `LRU` whose operations are atomic: several threads may get and put at once.
    (A new process must make its own: a lock held by a thread at fork stays held.)"""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        with self._lock:
            return super().get(key)

    def put(self, key: Hashable, value: Any, nbytes: int = 0) -> None:
        with self._lock:
            super().put(key, value, nbytes)

    def resize(self, max_bytes: int | None) -> None:
        with self._lock:
            super().resize(max_bytes)

    def pop(self, key: Hashable) -> Any:
        with self._lock:
            return super().pop(key)

    def clear(self) -> None:
        with self._lock:
            super().clear()
