"""Read-ahead: build the next steps' micro-batches in a background thread while the training
loop works on the current one. The plan says what comes next, so nothing is guessed.

One thread does all the fetching (readers and caches serve one thread at a time); the
caller only waits for results. A step's result, or its error, is handed out when that step
is asked for, never earlier, so a changed file still stops the run exactly where it is read.

A loop that asks for the next step as soon as it has one (a pass over the data alone, a
benchmark) has nothing for the thread to overlap, and pays for it: at every hand-off the
scheduler may move the building thread to the other core, where its caches are cold. So
while the loop keeps coming back within a quarter of a step's build, steps are built on
the calling thread; once it is away longer, the thread builds ahead again. Which thread
builds a step changes nothing in it. A thread left idle by steps built in line is ended, and
freed memory handed back: what it kept for its reads (a column chunk's buffer, its malloc
arena's free pages) would otherwise stay while nothing uses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from mds.core import freed_memory

__all__ = ["ReadAhead"]

Batches = list[dict[str, Any]]

_SETTLE = 4  # steps in a row that decide a switch between building ahead and in line
_QUICK = 0.25  # the loop is "quick" when away for less than this share of a step's build


class ReadAhead:
    """Steps `step .. step + depth` built by `build(step)` in one background thread, or on
    the calling thread while the loop gives the thread nothing to overlap."""

    def __init__(self, build: Callable[[int], Batches], depth: int, end: int):
        self.build, self.depth, self.end = build, depth, end
        self._pool: ThreadPoolExecutor | None = None
        self._steps: dict[int, Future[Batches]] = {}
        self.inline = False  # steps are built on the calling thread
        self._streak = 0  # steps in a row that argue for switching
        self._built = 0.0  # seconds the last step's build took
        self._away = 0.0  # seconds the loop spent away from `get` since the step began
        self._back: float | None = None  # when `get` last returned

    def get(self, step: int, micro_batch: int) -> dict[str, Any]:
        """Micro-batch `micro_batch` of `step`; schedules the steps after it."""
        now = time.perf_counter()
        if self._back is not None:
            self._away += now - self._back
        if micro_batch == 0:
            self._choose()
        for stale in [s for s in self._steps if not step <= s <= step + self.depth]:
            self._steps.pop(stale).cancel()
        if self.inline:
            if self._pool is not None and all(f.done() for f in self._steps.values()):
                self._retire()
            if step not in self._steps:
                self._steps[step] = self._now(step)
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="mds-read-ahead")
            for s in range(step, min(step + self.depth + 1, self.end)):
                if s not in self._steps:
                    self._steps[s] = self._pool.submit(self._timed, s)
        try:
            batches = self._steps[step].result()
            if micro_batch == len(batches) - 1:
                del self._steps[step]  # the step's last micro-batch: its memory can go
            return batches[micro_batch]
        finally:
            self._back = time.perf_counter()

    def _choose(self) -> None:
        """At a step's first micro-batch: switch after `_SETTLE` steps in a row whose loop was
        away less (building ahead) or more (building in line) than `_QUICK` of a build."""
        quick = self._away < _QUICK * self._built
        self._away = 0.0
        self._streak = self._streak + 1 if quick != self.inline else 0
        if self._streak >= _SETTLE:
            self.inline, self._streak = not self.inline, 0

    def _retire(self) -> None:
        """End the idle thread (nothing of it is queued or running) and hand back what it
        freed in ending."""
        assert self._pool is not None
        self._pool.shutdown(wait=True)
        self._pool = None
        freed_memory.give_back()

    def _timed(self, step: int) -> Batches:
        start = time.perf_counter()
        try:
            return self.build(step)
        finally:
            self._built = time.perf_counter() - start

    def _now(self, step: int) -> Future[Batches]:
        """Step `step` built on this thread, as a finished future (its error kept in it)."""
        done: Future[Batches] = Future()
        try:
            done.set_result(self._timed(step))
        except Exception as exc:
            done.set_exception(exc)
        return done

    def stop(self) -> None:
        """Cancel what is queued and wait for what runs (before a fork, or a seek)."""
        for future in self._steps.values():
            future.cancel()
        self._steps.clear()
        self._back = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def forget(self) -> None:
        """In a forked child: the parent's thread does not exist here; start afresh."""
        self._pool = None
        self._steps = {}
        self._back = None
