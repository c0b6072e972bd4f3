"""Byte ranges of objects (s3://, gs://), read the way a store answers best: many requests in
flight at once, neighbouring ranges joined into one request.

A step touches a few byte spans of each of several objects (Parquet column chunks, JSONL
blocks, zstd frames, Arrow record batches, Megatron sequences). Issued one after another, their latencies add up; so the executor
first asks each reader which spans it will read (`spans`), fetches all of them together
(`prefetch`: every object's spans, up to `REQUESTS` requests in flight), and the readers
then decode from those staged bytes. Staged bytes live until the fetch ends (`unstage`);
what a reader reads beyond them is one request, as before.

An object's open is a metadata request (its size and version). A file's first reads or its
start-up check open it and keep the handle (`keep_open`) for the check and the reader that
open the object next (`take_kept`), so they share one request.
"""

from __future__ import annotations

import bisect
import io
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mds.core.storage import failure, object_version, open_input, read_exact
from mds.errors import SourceDataError

__all__ = [
    "HOLE",
    "KEEP_SECONDS",
    "KEPT",
    "MAX_REQUEST",
    "RANGE_BLOCK",
    "REQUESTS",
    "Counters",
    "RangeFile",
    "counters",
    "drop_kept",
    "in_order",
    "in_request_pool",
    "keep_open",
    "parallel",
    "prefetch",
    "request_pool",
    "take_kept",
]

RANGE_BLOCK = 256 << 10  # unit of JSONL range reads, kept in the block cache
REQUESTS = 8  # range requests in flight at once, per process
# Spans of an object at most HOLE apart are read in one request: reading the gap costs
# less than another request's latency (1 MiB is what 20 ms to first byte at 50 MiB/s
# transfers; Arrow's CacheOptions.from_network_metrics reasons the same way). A request is
# at most MAX_REQUEST bytes, so one long span is read as several requests in parallel.
HOLE = 1 << 20
MAX_REQUEST = 16 << 20


@dataclass
class Counters:
    """Range requests made by this process and the bytes they returned (for reports)."""

    requests: int = 0
    bytes: int = 0


counters = Counters()
_counted = threading.Lock()

# Handles opened (one metadata request each: size, version, mtime) by a file's first reads or
# its check, kept for the check and the reader's open that come next (`keep_open`), tagged
# with their owner (an executor's catalog); one kept longer than KEEP_SECONDS is not used.
KEPT = 1024
KEEP_SECONDS = 30.0
# url -> (pid, when, owner, open handle)
_kept: OrderedDict[str, tuple[int, float, Any, Any]] = OrderedDict()
_kept_lock = threading.Lock()


def keep_open(url: str, handle: Any, owner: Any = None) -> None:
    """Keep `handle`, an open pyarrow file of the object `url`, for the next RangeFile of
    `url` (or `take_kept`), which then makes no metadata request of its own. At most KEPT
    are kept, the oldest closed first."""
    drop = []
    with _kept_lock:
        old = _kept.pop(url, None)
        if old is not None and old[3] is not handle:
            drop.append(old[3])
        _kept[url] = (os.getpid(), time.monotonic(), owner, handle)
        while len(_kept) > KEPT:
            drop.append(_kept.popitem(last=False)[1][3])
    for h in drop:
        h.close()


def take_kept(url: str, owner: Any = None) -> Any | None:
    """The handle kept for `url` (no longer kept), if it is this process's, at most
    KEEP_SECONDS old and, given an `owner`, kept by it; else None."""
    with _kept_lock:
        kept = _kept.get(url)
        if kept is None or (owner is not None and kept[2] is not owner):
            return None
        del _kept[url]
    if kept[0] != os.getpid():
        return None
    if time.monotonic() - kept[1] > KEEP_SECONDS:
        kept[3].close()
        return None
    return kept[3]


def drop_kept(owner: Any) -> None:
    """Close the handles `owner` kept that no open took."""
    with _kept_lock:
        urls = [url for url, kept in _kept.items() if kept[2] is owner]
        handles = [_kept.pop(url) for url in urls]
    for pid, _when, _owner, h in handles:
        if pid == os.getpid():  # a parent's are not this process's to close
            h.close()


class RangeFile:
    """Byte ranges of one object.

    `read_at` serves a range from the bytes staged by `prefetch` when they hold it, else
    makes one request. `read_ranges` reads lines' ranges in aligned blocks of RANGE_BLOCK
    bytes through the shared, byte-bounded block cache: one call fetches the blocks it
    lacks, neighbours in one request, so a step's lines of an object cost a few requests,
    and a block read again while cached costs none.
    """

    def __init__(self, url: str, blocks: Any):
        self.url, self._blocks = url, blocks
        self._file = take_kept(url) or open_input(url)  # a handle kept for this open
        try:
            self.size = int(self._file.size())
            # the version this handle was opened at, and the requests made through it: the
            # catalog compares both with what it pinned (a store reads the object as it is
            # now, whatever version the handle was opened at)
            self.version = object_version(self._file, url)
        except OSError as exc:
            self._file.close()
            raise failure(url, "stat", exc) from None
        except BaseException:
            self._file.close()
            raise
        self.requests = 0
        self.checked = 0  # `requests` when the catalog last asked the store for the version
        self._staged_at: list[int] = []  # sorted starts of the staged runs
        self._staged: list[tuple[int, bytes | SourceDataError]] = []  # (end, bytes or error)

    # --- staged bytes -------------------------------------------------------------------

    def stage(self, start: int, end: int, data: bytes | SourceDataError) -> None:
        """Keep bytes [start, end) (or the error reading them) until `unstage`."""
        k = bisect.bisect_left(self._staged_at, start)
        self._staged_at.insert(k, start)
        self._staged.insert(k, (end, data))

    def unstage(self) -> None:
        self._staged_at, self._staged = [], []

    def read_at(self, size: int, start: int) -> bytes:
        """Bytes [start, start + size), clipped to the object; a staged run that holds them
        answers (or raises the error met reading it), else one request."""
        size = max(0, min(size, self.size - start))
        staged = self._from_staged(start, start + size)
        if staged is not None:
            return staged
        if size == 0:
            return b""
        data = self._read(start, size)
        with _counted:
            counters.requests += 1
            counters.bytes += len(data)
            self.requests += 1
        return data

    def _read(self, start: int, size: int) -> bytes:
        """One request through the object's one handle: a read does not move its position,
        so reads of this object in parallel share it (no open, no metadata request each)."""
        return read_exact(self._file, self.url, self.size, start, size)

    def _from_staged(self, start: int, end: int) -> bytes | None:
        """Bytes [start, end) if staged runs (one, or consecutive ones) hold them all."""
        k = bisect.bisect_right(self._staged_at, start) - 1
        pieces, at = [], start
        while 0 <= k < len(self._staged) and self._staged_at[k] <= at:
            stop, data = self._staged[k]
            if stop <= at:
                return None
            if isinstance(data, SourceDataError):
                raise data
            pieces.append(data[at - self._staged_at[k] : min(end, stop) - self._staged_at[k]])
            at = min(end, stop)
            if at >= end:
                return pieces[0] if len(pieces) == 1 else b"".join(pieces)
            k += 1
        return None

    def arrow_file(self) -> Any:
        """A pyarrow random-access file over the object whose reads go through `read_at`."""
        import pyarrow as pa

        return pa.PythonFile(_View(self), mode="r")

    # --- lines, through the block cache -------------------------------------------------

    def missing(self, starts: Iterable[int], sizes: Iterable[int]) -> list[tuple[int, int]]:
        """Byte spans [lo, hi) of the blocks `read_ranges` of these ranges would request."""
        runs = _runs(
            [b for b in self._blocks_of(starts, sizes) if self._key(b) not in self._blocks]
        )
        return [(a * RANGE_BLOCK, min((b + 1) * RANGE_BLOCK, self.size)) for a, b in runs]

    def read_ranges(self, starts: Any, sizes: Any) -> list[bytes]:
        spans = [(int(s), int(n)) for s, n in zip(starts, sizes, strict=True)]
        need = self._blocks_of([s for s, _ in spans], [n for _, n in spans])
        have = {b: self._blocks.get(self._key(b)) for b in need}
        missing = [b for b in need if have[b] is None]
        runs = _runs(missing)  # neighbouring blocks: one request; runs: requests in parallel
        for (first, last), data in zip(runs, parallel(self._read_run, runs), strict=True):
            for b in range(first, last + 1):
                piece = bytes(data[(b - first) * RANGE_BLOCK : (b - first + 1) * RANGE_BLOCK])
                have[b] = piece
                self._blocks.put(self._key(b), piece, len(piece))
        out = []
        for s, n in spans:
            if n <= 0:
                out.append(b"")
                continue
            first, last = s // RANGE_BLOCK, (s + n - 1) // RANGE_BLOCK
            joined = b"".join(have[b] for b in range(first, last + 1))
            at = s - first * RANGE_BLOCK
            out.append(joined[at : at + n])
        return out

    def _key(self, block: int) -> tuple:
        return (self.url, "range", block)

    @staticmethod
    def _blocks_of(starts: Iterable[int], sizes: Iterable[int]) -> list[int]:
        return sorted(
            {
                b
                for s, n in zip(starts, sizes, strict=True)
                if n > 0
                for b in range(int(s) // RANGE_BLOCK, (int(s) + int(n) - 1) // RANGE_BLOCK + 1)
            }
        )

    def _read_run(self, run: tuple[int, int]) -> bytes:
        lo = run[0] * RANGE_BLOCK
        return self.read_at(min((run[1] + 1) * RANGE_BLOCK, self.size) - lo, lo)

    def close(self) -> None:
        """Close the handle (after the reads through it ended: `ReadAhead.close` waits for
        its requests in flight)."""
        self.unstage()
        self._file.close()


class _View(io.RawIOBase):
    """A seekable, readable file object over a RangeFile, for pyarrow.PythonFile."""

    def __init__(self, source: RangeFile):
        super().__init__()
        self._source, self._pos = source, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        base = (0, self._pos, self._source.size)[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def read(self, size: int = -1) -> bytes:
        left = max(0, self._source.size - self._pos)
        size = left if size is None or size < 0 else min(size, left)
        data = self._source.read_at(size, self._pos)
        self._pos += len(data)
        return data


def prefetch(wants: list[tuple[RangeFile, list[tuple[int, int]]]]) -> None:
    """Stage the spans [lo, hi) each object will be read at: all objects' requests in
    flight together (at most REQUESTS), spans of an object less than HOLE apart in one
    request. A failed request stages its error, raised when (and only if) a reader reads
    those bytes: a span wanted for a later step is not this step's failure."""
    jobs = [(f, lo, hi) for f, spans in wants for lo, hi in _coalesce(spans)]

    def read(job: tuple[RangeFile, int, int]) -> bytes | SourceDataError:
        f, lo, hi = job
        try:
            return f.read_at(hi - lo, lo)
        except SourceDataError as exc:
            return exc

    for (f, lo, hi), data in zip(jobs, parallel(read, jobs), strict=True):
        f.stage(lo, hi, data)


def _coalesce(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted spans joined across gaps up to HOLE, then cut into requests of at most
    MAX_REQUEST bytes."""
    joined: list[tuple[int, int]] = []
    for lo, hi in sorted(s for s in spans if s[1] > s[0]):
        if joined and lo - joined[-1][1] <= HOLE:
            joined[-1] = (joined[-1][0], max(hi, joined[-1][1]))
        else:
            joined.append((lo, hi))
    out = []
    for lo, hi in joined:
        pieces = -(-(hi - lo) // MAX_REQUEST)
        step = -(-(hi - lo) // pieces)
        out.extend((a, min(a + step, hi)) for a in range(lo, hi, step))
    return out


_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()  # the threads reading a step's files may both make the pool


def _new_locks_in_child() -> None:
    global _pool_lock, _counted, _kept_lock
    # a lock another thread held at fork stays held in the child
    _pool_lock, _counted, _kept_lock = threading.Lock(), threading.Lock(), threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_in_child)


def parallel(read: Callable[[Any], Any], items: list) -> list:
    """`read` of every item, up to REQUESTS at a time (a store answers requests in
    parallel; their latency, not the bandwidth, bounds a step's scattered reads)."""
    if len(items) <= 1:
        return [read(item) for item in items]
    return list(request_pool().map(read, items))


def in_order(
    read: Callable[[Any], Any], items: list, sizes: list[int], most: int = 4 * MAX_REQUEST
) -> Iterator[Any]:
    """`read` of every item, yielded in order, made on the range request threads: at most
    `most` bytes (`sizes`: each item's) requested and not yet taken at once (one item
    always), so a long list is read at the pool's pace without all its bytes held."""
    if in_request_pool():  # a range thread must not wait on its own pool
        yield from map(read, items)
        return
    pool = request_pool()
    pending: deque[tuple[int, Future]] = deque()
    held, at = 0, 0
    while at < len(items) or pending:
        while at < len(items) and (not pending or held + sizes[at] <= most):
            pending.append((sizes[at], pool.submit(read, items[at])))
            held += sizes[at]
            at += 1
        n, future = pending.popleft()
        held -= n
        yield future.result()


_POOL_NAME = "mds-range"


def request_pool() -> ThreadPoolExecutor:
    """The REQUESTS threads that make this process's range requests. Made per process: a
    forked DataLoader worker has none of its parent's threads."""
    global _pool
    pool = _pool
    if pool is None or pool[0] != os.getpid():
        with _pool_lock:
            if _pool is None or _pool[0] != os.getpid():
                _pool = (os.getpid(), ThreadPoolExecutor(REQUESTS, thread_name_prefix=_POOL_NAME))
            pool = _pool
    return pool[1]


def in_request_pool() -> bool:
    """Whether this thread is one of `request_pool`'s (which must not wait on the pool)."""
    return threading.current_thread().name.startswith(_POOL_NAME)


def _runs(blocks: list[int]) -> list[tuple[int, int]]:
    """Sorted block numbers as (first, last) runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for b in blocks:
        if runs and b == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((b, b))
    return runs
