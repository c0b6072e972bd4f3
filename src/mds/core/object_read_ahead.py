"""Reads of one object that move forward (a Parquet column chunk read page by page: a page
header, its page, the next header...), served from byte ranges requested ahead, several in
flight at once, instead of one round trip per read.

Where a large column chunk's pages lie is known only from their headers, so read one by one
from a store, each header and each page is a round trip of its own, one after another. The
caller says which byte ranges its reads will cover (`planned`: the pages an earlier read of
the chunk found, and as far into the rest as the values asked are likely to reach); they
are cut here into pieces of at most `piece` bytes, neighbours joined into one request, and
requested in order on the range request threads (`object_ranges.request_pool`), at most
`most` bytes of them in flight or held at once (the reading thread's buffer in the memory
budget). A read the plan does not cover is one request of its own, as without it.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from typing import Any

from mds.core.object_ranges import RangeFile, in_request_pool, request_pool

__all__ = ["ReadAhead"]


class ReadAhead:
    """`read_at` of `source` (a RangeFile) for reads that go forward, from the `planned`
    ranges requested ahead. `more`: where reads may go on to past the plan (the chunk's
    end): a read beyond the plan plans the next `most` bytes after it. `close` drops what
    no read took, after the requests in flight end (no request outlives it)."""

    def __init__(
        self,
        source: RangeFile,
        planned: list[tuple[int, int]],
        most: int,
        piece: int,
        more: int = 0,
    ):
        self.source, self.size = source, source.size
        self.most, self.piece = max(1, most), max(1, piece)
        # (lo, hi, its request or None) in order; requested pieces are a prefix
        self._pieces: deque[list[Any]] = deque()
        self._issued = 0  # how many of `_pieces` (from the front) were requested
        self._held = 0  # bytes of those
        self._dropped: list[tuple[int, Future]] = []  # dropped while still in flight
        self._end = 0  # the end of the last planned piece
        self._more = more
        # a range request thread must not wait on its own pool: every read is then direct
        self._pool = None if in_request_pool() else request_pool()
        self.requests = 0  # pieces requested (for tests and reports)
        self.peak = 0  # the most bytes in flight or held at once (at most `most`)
        self._plan(planned)
        self._fill()

    def _plan(self, ranges: list[tuple[int, int]]) -> None:
        """Add the pieces of `ranges` (after the planned ones), joining neighbours."""
        for lo, hi in ranges:
            lo, hi = max(lo, self._end), min(hi, self.size)
            while lo < hi:
                last = self._pieces[-1] if self._pieces else None
                if last is not None and last[2] is None and last[1] == lo:
                    if last[1] - last[0] < self.piece:  # a neighbour not yet requested
                        grown = min(hi, last[0] + self.piece)
                        last[1], lo = grown, grown
                        continue
                end = min(hi, lo + self.piece)
                self._pieces.append([lo, end, None])
                lo = end
            self._end = max(self._end, hi)

    def _fill(self) -> None:
        """Request pieces in order while at most `most` bytes are in flight or held."""
        while self._issued < len(self._pieces) and self._request():
            pass

    def _request(self) -> bool:
        """Request the next piece if it fits in `most` bytes with those in flight or held
        (one always does, when none is); whether it was."""
        if self._pool is None:
            return False
        self._dropped = [(n, f) for n, f in self._dropped if not f.done()]
        used = self._held + sum(n for n, _ in self._dropped)
        p = self._pieces[self._issued]
        size = p[1] - p[0]
        if used and used + size > self.most:
            return False
        p[2] = self._pool.submit(self.source.read_at, size, p[0])
        self.requests += 1
        self._issued += 1
        self._held += size
        self.peak = max(self.peak, used + size)
        return True

    def _drop_before(self, start: int) -> None:
        """Forget pieces that end at or before `start`: the reads went past them."""
        while self._pieces and self._pieces[0][1] <= start:
            lo, hi, future = self._pieces.popleft()
            if future is not None:
                self._issued -= 1
                self._held -= hi - lo
                if not future.cancel() and not future.done():
                    self._dropped.append((hi - lo, future))

    def _covered(self, start: int, end: int) -> bytes | None:
        """Bytes [start, end) from the pieces (waiting for their requests), or None if the
        pieces do not hold them all; a failed request raises its error."""
        parts, at = [], start
        for k, (lo, hi, future) in enumerate(self._pieces):
            if lo > at:
                return None
            if future is None:  # not requested yet: the reads caught up with the requests
                if k != self._issued or not self._request():
                    return None
                future = self._pieces[k][2]
            data = future.result()
            parts.append(data[at - lo : min(end, hi) - lo])
            if len(data) < hi - lo or end <= hi:  # the object ends in this piece, or done
                break
            at = hi
        else:
            return None
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def read_at(self, size: int, start: int) -> bytes:
        """Bytes [start, start + size), clipped to the object, as `RangeFile.read_at`."""
        size = max(0, min(size, self.size - start))
        if size == 0:
            return b""
        end = start + size
        self._drop_before(start)
        data = self._covered(start, end) if size <= self.most else None
        if data is None:
            data = self.source.read_at(size, start)
            if start >= self._end and end < self._more:  # past the plan: plan on from here
                self._plan([(end, min(self._more, end + self.most))])
        self._fill()
        return data

    def close(self) -> None:
        """Drop every piece; wait for the requests in flight (their bytes are not used)."""
        self._drop_before(self.size + 1)
        for _n, future in self._dropped:
            try:
                future.result()
            except Exception:  # noqa: BLE001 - bytes no read asked for: nor their errors
                pass
        self._dropped = []
