"""The first steps' files made ready before their steps read them: at the start of a run
(or after a seek) the plan already names every file the next `steps` steps read and the rows
read from each, so opening them need not wait for the step that first reads them.

A run over many sources opens a new file at almost every sample of its first steps: each
open parses a footer, and each first read fetches a column chunk, one file after another on
the thread building the step (from a cold page cache, one disk read at a time). Here
`THREADS` threads go ahead of the steps, in the order the steps will read the files: each
Parquet footer is parsed into the metadata cache (the reader's open finds it there; an
object's is fetched, by as many threads as a step has range requests in flight,
`object_ranges.REQUESTS`, instead of one round trip after another as each file is first
opened), and a local file's column chunks of the row groups its rows are in are asked of
the kernel (`posix_fadvise(WILLNEED)`: it reads them into the page cache in the background,
many at once, and a read then copies them from memory). No byte is held by the process: the bytes
asked for and not yet read are bounded by `window` (a quarter of the block cache's share of
the memory budget, 64 MiB at most), so a run's first steps cannot flood the page cache.

Nothing here changes what is read, only when it is fetched. An object's column chunks are
left to each step's concurrent range requests (`object_ranges.prefetch`); a problem (a
missing file, a damaged footer) is left to the read, which raises it in its step, in file
order.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from mds.core import storage
from mds.core.object_ranges import REQUESTS
from mds.core.planfile import RankChunk
from mds.errors import MdsError
from mds.executor.catalog.plan_sources import PlanSources
from mds.executor.readers.parquet import footer_meta

__all__ = ["DEFAULT_STEPS", "THREADS", "FirstReads"]

DEFAULT_STEPS = 16  # steps whose files are made ready at a start or a seek (objects)

THREADS = 2  # threads reading them (file reads and footer parses in flight at once)
_POLL = 0.1  # seconds between looks at the clock while the window is full
_PATIENCE = 2.0  # seconds a full window waits for the reads to move before giving up
_ADVISE = hasattr(os, "posix_fadvise")


class FirstReads:
    """The first `steps` steps' files made ready by `THREADS` threads: footers parsed into
    the metadata cache, column chunks asked of the kernel, at most `window` bytes ahead of
    the reads (`reached`)."""

    def __init__(self, plan: PlanSources, steps: int, window: int, owner: Any = None):
        self.plan, self.steps, self.window = plan, steps, window
        self.owner = owner  # keeps the objects' handles for their checks (`footer_meta`)
        self.stride = 1
        self._pool: ThreadPoolExecutor | None = None
        self._run = 0  # bumped by each start and stop: a thread of an older run gives up
        self._lock = threading.Lock()
        self._moved = threading.Condition(self._lock)  # bytes left the window, or a stop
        # file -> (bytes asked, not yet read; its first sample's place in the block)
        self._asked: dict[tuple[int, int], tuple[int, int]] = {}
        self.ahead = 0  # bytes asked, not yet read
        # (block's first step, sample after the last fetch, whether it was near its end)
        self._next: tuple[int, int, bool] | None = None
        self.footers = 0  # footers parsed or found cached (for tests and reports)
        self.asked = 0  # bytes asked of the kernel (for tests and reports)
        self.reached_bytes = 0  # ... of which the reads have come to

    def follow(self, block: RankChunk, lo: int, hi: int) -> None:
        """A fetch of samples [lo, hi) of `block`: unless it continues the last one (in this
        block, or from the end of the one before), the run starts here (the first fetch, or
        a seek), and the files of the steps after it are read ahead."""
        last = self._next
        # going on: from where the last fetch ended, past the micro-batches other workers
        # build in between (`stride`), in this block or from the end of the one before
        gap = 4 * (hi - lo) * self.stride + 64
        fresh = last is None or not (
            (block.step_start == last[0] and 0 <= lo - last[1] <= gap)
            or (block.step_start > last[0] and last[2] and lo <= gap)
        )
        if not fresh and block.step_start != last[0]:  # type: ignore[index]
            self._passed(None)  # what was asked was of the block before
        self._next = (block.step_start, hi, len(block.ids) - hi <= gap)
        if fresh and self.steps > 0 and hi > lo:
            self.start(block, lo, hi)
        elif self._asked:
            self._passed(lo)

    def _passed(self, sample: int | None) -> None:
        """The reads went past block sample `sample` (None: past the block): files first
        planned before it and not read (their rows came from rows read early) leave the
        window."""
        with self._moved:
            for file, (n, first) in list(self._asked.items()):
                if sample is None or first < sample:
                    del self._asked[file]
                    self.ahead -= n
                    self.reached_bytes += n
            self._moved.notify_all()

    def start(self, block: RankChunk, lo: int, hi: int) -> None:
        """Read ahead the files of block samples from `hi` on (those of [lo, hi) are being
        read now), in the order they are first read, as far as `steps` fetches of `hi - lo`
        samples (this process's own micro-batches only: `stride`)."""
        self.stop()
        files = self._files(block, lo, hi)
        if not files:
            return
        run = self._run
        # an object's footer is a round trip: as many in flight as a step's range requests
        threads = REQUESTS if storage.is_url(self.plan.root) else THREADS
        if self._pool is None:
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="mds-first-reads")
        for part in range(threads):
            self._pool.submit(self._read_files, run, files[part::threads])

    def _files(self, block: RankChunk, lo: int, hi: int) -> list[tuple]:
        """(source, file id, record, rows) of the Parquet files samples [hi, ...) read, in
        order of first use."""
        counts = block.counts.ravel()
        micro = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
        end = min(len(block.ids), hi + self.steps * (hi - lo) * self.stride)
        picked = np.arange(hi, end)
        if self.stride > 1 and lo < len(micro):
            picked = picked[(micro[picked] - micro[lo]) % self.stride == 0]
        rec = block.fetch
        picked = picked[~np.isin(rec.file[picked], rec.file[lo:hi])]  # being read now
        files = rec.file[picked]
        first = np.sort(np.unique(files, return_index=True)[1])
        out = []
        for f, at in zip(files[first].tolist(), picked[first].tolist(), strict=True):
            sid, fid, entry = rec.files[f]
            try:
                s = self.plan.source_of(sid)
            except MdsError:
                continue
            if s.fmt != "parquet":
                continue
            rows = rec.row[picked[files == f]].astype(np.int64)
            out.append((s, fid, entry, rows, at))
        return out

    def _read_files(self, run: int, files: list[tuple]) -> None:
        for s, fid, entry, rows, at in files:
            if run != self._run:
                return
            try:
                self._read_file(run, s, fid, entry, rows, at)
            except (MdsError, OSError, ValueError, KeyError, IndexError):
                continue  # left to the read, which names the problem in its step

    def _read_file(self, run: int, s, fid: int, entry: Any, rows: np.ndarray, at: int) -> None:
        """Parse one file's footer into the metadata cache and ask the kernel for the chunks
        of the row groups its rows are in."""
        path, _companion = self.plan.paths(entry, f"{s.name} files[{fid}]")
        column = str(s.payload.get("column") or s.payload.get("text") or "")
        shown = str(path) if storage.is_url(path) else str(entry["path"])
        found = footer_meta(path, shown, self.owner)
        if found is not None:
            with self._lock:
                self.footers += 1
        if found is None or storage.is_url(path) or not _ADVISE:
            return
        _key, meta = found
        starts = meta.starts
        rows = rows[(rows >= 0) & (rows < starts[-1])]
        groups = np.unique(np.searchsorted(starts, rows, side="right") - 1).tolist()
        spans = [span for i in groups for span in meta.chunk_spans(column)[i]]
        nbytes = sum(hi - lo for lo, hi in spans)
        if not nbytes or not self._wait(run, nbytes):
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            for lo, hi in spans:
                os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)
        with self._lock:
            if run == self._run:
                self._asked[(s.sid, fid)] = (nbytes, at)
                self.ahead += nbytes
                self.asked += nbytes

    def _wait(self, run: int, nbytes: int) -> bool:
        """Wait until `nbytes` more fit the window; False if they never can, if the run
        ended, or if the reads have not moved for `_PATIENCE` seconds (a run left alone)."""
        if nbytes > self.window:
            return False
        with self._moved:
            since, seen = time.monotonic(), self.reached_bytes
            while run == self._run:
                if self.ahead + nbytes <= self.window:
                    return True
                if self.reached_bytes != seen:
                    since, seen = time.monotonic(), self.reached_bytes
                elif time.monotonic() - since > _PATIENCE:
                    return False
                self._moved.wait(_POLL)
        return False

    def reached(self, sid: int, fid: int) -> None:
        """A read of file (sid, fid) begins: what was asked of it leaves the window."""
        if not self._asked:
            return
        with self._moved:
            n = self._asked.pop((sid, fid), (0, 0))[0]
            self.ahead -= n
            self.reached_bytes += n
            self._moved.notify_all()

    def stop(self) -> None:
        """End the run: its threads stop at their next file."""
        with self._moved:
            self._run += 1
            self._asked, self.ahead = {}, 0
            self._moved.notify_all()

    def close(self) -> None:
        self.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._next = None

    def forget(self) -> None:
        """In a forked child: the parent's threads and bytes are not here; start afresh."""
        self._pool = None
        self._run += 1
        self._asked, self.ahead = {}, 0
        self._lock = threading.Lock()
        self._moved = threading.Condition(self._lock)
        self._next = None
