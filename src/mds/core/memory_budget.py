"""One byte budget for what a process's executor holds: the block cache and the decodes in
flight share `room`, the budget less its fixed shares (rows read ahead, per-thread buffers).

A decode reserves its estimated bytes before it starts (`reserve`); the block cache gives
room back to it, least recently used first, and a decode that still does not fit waits for
another thread's to finish. A decoded block kept in the cache takes over its reservation
(`Reservation.keep`), so at any moment cache + reservations <= room. One decode larger
than `room` on its own can never fit: `reserve` raises `TooLarge`, which the caller turns
into an error naming the file and row.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

from mds.core.lru import LockedLRU

__all__ = ["BudgetCache", "MemoryBudget", "Reservation", "TooLarge"]

_WAIT = 0.05  # seconds between looks while another thread's decode holds the room


class TooLarge(Exception):
    """A reservation larger than the budget's whole room (`needed`, `room`)."""

    def __init__(self, needed: int, room: int):
        super().__init__(f"{needed} bytes needed, {room} bytes of room")
        self.needed, self.room = needed, room


class MemoryBudget:
    """`total` bytes, of which `fixed` are set aside (rows read ahead, per-thread buffers
    of `buffer` bytes at most) and `room` is shared by the block cache (`attach`) and the
    reservations of decodes."""

    def __init__(self, total: int, fixed: int = 0, buffer: int = 0):
        assert 0 <= fixed <= total, (fixed, total)
        self.total, self.fixed, self.buffer = total, fixed, buffer
        self.room = total - fixed
        self._cond = threading.Condition()
        self.reserved = 0  # bytes reserved by decodes in flight
        self.peak = 0  # the most cache + reservations held at once (for tests)
        self._cache: BudgetCache | None = None

    def attach(self, cache: BudgetCache) -> None:
        self._cache = cache

    def held(self) -> int:
        """Bytes the budget accounts for now: the cache's and the reservations'."""
        return self.reserved + (self._cache.nbytes if self._cache is not None else 0)

    def reserve(self, nbytes: int) -> Reservation:
        """Reserve `nbytes` for a decode, evicting cached blocks to make room and waiting
        for other decodes while they hold it; TooLarge if it exceeds `room` on its own."""
        nbytes = max(0, int(nbytes))
        if nbytes > self.room:
            raise TooLarge(nbytes, self.room)
        with self._cond:
            while True:
                cache = self._cache
                over = self.held() + nbytes - self.room
                if over > 0 and cache is not None and cache.nbytes:
                    cache.shed(max(0, cache.nbytes - over))
                    over = self.held() + nbytes - self.room
                if over <= 0 or not self.reserved:
                    # with nothing else in flight the cache is empty here, so it fits
                    self.reserved += nbytes
                    self.peak = max(self.peak, self.held())
                    return Reservation(self, nbytes)
                self._cond.wait(_WAIT)

    def _release(self, nbytes: int) -> None:
        with self._cond:
            self.reserved -= nbytes
            self._cond.notify_all()

    def _keep(self, res: Reservation, key: Hashable, value: Any, nbytes: int) -> None:
        with self._cond:
            self.reserved -= res.nbytes
            res.nbytes = 0
            if self._cache is not None:
                self._cache.put(key, value, nbytes)
            self.peak = max(self.peak, self.held())
            self._cond.notify_all()


class Reservation:
    """Bytes reserved for one decode: `release`d when its data is dropped, or handed to the
    block cache with the block (`keep`). A context manager that releases on exit."""

    def __init__(self, budget: MemoryBudget, nbytes: int):
        self.budget, self.nbytes = budget, nbytes

    def release(self) -> None:
        if self.nbytes:
            n, self.nbytes = self.nbytes, 0
            self.budget._release(n)

    def keep(self, key: Hashable, value: Any, nbytes: int) -> None:
        """Put `value` in the block cache in place of this reservation."""
        self.budget._keep(self, key, value, nbytes)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class BudgetCache(LockedLRU):
    """The block cache of a budget: bounded by its own `max_bytes` and by the budget's room
    less the reservations in flight, whichever is less (every put of every format)."""

    def __init__(self, max_bytes: int, budget: MemoryBudget):
        super().__init__(max_bytes=min(max_bytes, budget.room))
        self.budget = budget
        budget.attach(self)

    def put(self, key: Hashable, value: Any, nbytes: int = 0) -> None:
        with self._lock:
            super(LockedLRU, self).put(key, value, nbytes)
            self._shed(max(0, self.budget.room - self.budget.reserved))
        budget = self.budget
        budget.peak = max(budget.peak, budget.held())

    def shed(self, limit: int) -> None:
        """Evict least recently used entries until the cache holds at most `limit` bytes."""
        with self._lock:
            self._shed(limit)

    def _shed(self, limit: int) -> None:
        while self._entries and self._nbytes > limit:
            victim, (dropped, size) = self._entries.popitem(last=False)
            self._nbytes -= size
            self._evicted(victim, dropped)
