"""Read-ahead: build the next steps' micro-batches in a background thread while the training
loop works on the current one. The plan says what comes next, so nothing is guessed.

One thread does all the fetching (readers and caches serve one thread at a time); the
caller only waits for results. A step's result, or its error, is handed out when that step
is asked for, never earlier, so a changed file still stops the run exactly where it is read.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["ReadAhead"]

Batches = list[dict[str, Any]]


class ReadAhead:
    """Steps `step .. step + depth` built by `build(step)` in one background thread."""

    def __init__(self, build: Callable[[int], Batches], depth: int, end: int):
        self.build, self.depth, self.end = build, depth, end
        self._pool: ThreadPoolExecutor | None = None
        self._steps: dict[int, Future[Batches]] = {}

    def get(self, step: int, micro_batch: int) -> dict[str, Any]:
        """Micro-batch `micro_batch` of `step`; schedules the steps after it."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="mds-read-ahead")
        for stale in [s for s in self._steps if not step <= s <= step + self.depth]:
            self._steps.pop(stale).cancel()
        for s in range(step, min(step + self.depth + 1, self.end)):
            if s not in self._steps:
                self._steps[s] = self._pool.submit(self.build, s)
        batches = self._steps[step].result()
        if micro_batch == len(batches) - 1:
            del self._steps[step]  # the step's last micro-batch: its memory can go
        return batches[micro_batch]

    def stop(self) -> None:
        """Cancel what is queued and wait for what runs (before a fork, or a seek)."""
        for future in self._steps.values():
            future.cancel()
        self._steps.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def forget(self) -> None:
        """In a forked child: the parent's thread does not exist here; start afresh."""
        self._pool = None
        self._steps = {}
