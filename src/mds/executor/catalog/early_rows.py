"""Rows read early: when a block-coded file (a Parquet row group, a zstd frame) is decoded
for the step being built, the rows that this rank's later samples need from it are taken
too and kept until their step, so a block is decoded about once per window of steps
instead of once per sample. Only a plan knows which rows come later.

The window is bounded by bytes, not by plan chunks: a file's later rows are taken only as
far ahead as the planned sizes of all this rank's samples in between (4 bytes a token and
112 an array), kept or not, fit the budget together, so rows for the nearest steps are
never crowded out by rows needed last. Later chunks' blocks are loaded (and checksum-checked) as the window reaches
them. One decode takes at most 256 later rows (the nearest): taking a row costs a few
microseconds, so a decode's rows ahead cost about what the decode does. The first fetch of
a run (or after a seek) takes at most 16, and the cap doubles with each fetch, so the time
to the first batch stays about what it is without reading ahead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mds.core.planfile import RankChunk
from mds.core.row_slices import RowSlices
from mds.errors import PlanError

__all__ = ["Later", "Lookahead"]

BYTES_PER_TOKEN = 4
_PAYLOAD_HEADER = 112  # a kept array's bytes beyond its tokens (`_payload_bytes`)
# A row kept of a read's RowSlices (`Lookahead.keep`): its dict entry, key and code; and
# the read's values beyond their bytes: the array object and its entry in `_slices`.
_SLICE_ROW = 112
_SLICES_HEADER = 256
# A kept row's code: (id of its read's values << 2 * _BOUND) | (its first value << _BOUND) |
# the end of its values, so taking it costs integer operations and one slice.
_BOUND = 40
_BOUND_MASK = (1 << _BOUND) - 1
_MAX_BLOCKS = 64  # blocks held in the window at most, however small they are
MAX_LATER = 256  # later rows taken with one decode at most
FIRST_LATER = 16  # ... and with the first fetch's decodes; the cap doubles each fetch


@dataclass
class _Block:
    """One block of the window: where its samples start in the rank's order of samples,
    its samples grouped by file, and the planned bytes before each of them."""

    block: RankChunk
    base: int  # rank-wide index of the block's first sample
    micro_base: int  # rank-wide index of its first micro-batch
    by_file: np.ndarray = field(init=False)
    file_at: list[int] = field(init=False)
    micro: np.ndarray = field(init=False)
    reach: np.ndarray = field(init=False)
    files: dict[tuple[int, int], int] = field(init=False)
    end: int = field(init=False)  # rank-wide index after its last sample
    micro_end: int = field(init=False)  # ... and after its last micro-batch

    def __post_init__(self) -> None:
        b = self.block
        rec = b.fetch
        self.by_file = np.argsort(rec.file, kind="stable")
        self.file_at = np.searchsorted(
            rec.file[self.by_file], np.arange(len(rec.files) + 1), side="left"
        ).tolist()  # read one file at a time (`Lookahead.later`): Python integers
        counts = b.counts.ravel().astype(np.int64)
        self.micro = np.repeat(np.arange(counts.size, dtype=np.int64) + self.micro_base, counts)
        self.reach = np.zeros(len(b.ids) + 1, dtype=np.int64)
        planned = rec.tokens.astype(np.int64) * BYTES_PER_TOKEN + _PAYLOAD_HEADER
        np.cumsum(planned, out=self.reach[1:])
        self.files = {(sid, fid): f for f, (sid, fid, _e) in enumerate(rec.files)}
        self.end = self.base + len(b.ids)
        self.micro_end = self.micro_base + b.counts.size


@dataclass
class Later:
    """Later samples of one file: rank-wide indices and where each is in the file (`offset`
    and `length` as `Lookahead.later` was asked for, else None). `complete`: they are all of
    this process's samples after the current ones that read the file, to the end of the plan
    (so a block decoded for them is not needed again)."""

    index: np.ndarray
    gid: np.ndarray
    row: np.ndarray
    offset: np.ndarray | None
    length: np.ndarray | None
    complete: bool = False

    def __len__(self) -> int:
        return len(self.index)


class Lookahead:
    """Payloads kept for this rank's later samples, by rank-wide sample index.

    `stride`: this process builds every `stride`-th micro-batch (DataLoader worker w of
    `stride` builds positions w, w + stride, ...), so only rows of those are kept.
    `next_block(block)`: the rank's block of the chunk after `block`'s, or None.
    """

    def __init__(
        self,
        max_bytes: int,
        stride: int = 1,
        next_block: Callable[[RankChunk], RankChunk | None] | None = None,
    ):
        self.max_bytes, self.stride, self.next_block = max_bytes, stride, next_block
        self.nbytes = 0
        self._window: list[_Block] = []
        # rank-wide index -> (payload, bytes it holds), or the code of a row of a read's
        # RowSlices (`keep`)
        self._kept: dict[int, tuple[Any, int] | int] = {}
        # the id of such a read's values -> [the values, rows of them kept, bytes they hold]
        self._slices: dict[int, list] = {}
        self._slices_made = 0
        self._next = 0  # rank-wide index after the last sample taken
        self._fetches = 0  # since the window started
        self._ended = False  # the window's last block is the plan's last
        self._horizon_at: tuple[int, int] = (-1, -1)  # (start, its horizon), per fetch
        self._touched: set[tuple[int, int]] = set()  # files with rows taken (kept or not)

    def clear(self) -> None:
        self._window, self._kept, self.nbytes, self._next, self._fetches = [], {}, 0, 0, 0
        self._slices = {}
        self._ended = False
        self._horizon_at, self._touched = (-1, -1), set()

    # --- the window -------------------------------------------------------------------------

    def bind(self, block: RankChunk) -> int:
        """Make `block` the window's first; returns the rank-wide index of its first sample.
        Moving on to the next chunk keeps what was read for it; a seek elsewhere drops all."""
        for k, w in enumerate(self._window):
            if w.block.step_start == block.step_start:
                del self._window[:k]
                return w.base
        self.clear()
        self._window = [_Block(block, 0, 0)]
        return 0

    def _extend(self) -> bool:
        """Load the block after the window's last; False at the end of the plan."""
        if self._ended or self.next_block is None or len(self._window) >= _MAX_BLOCKS:
            return False
        last = self._window[-1]
        try:
            block = self.next_block(last.block)
        except PlanError:
            # A corrupt later block is that chunk's error, raised when its steps are built.
            self.next_block = None
            return False
        if block is None:
            self._ended = True
            return False
        self._window.append(_Block(block, last.end, last.micro_end))
        return True

    def _horizon(self, start: int) -> int:
        """The rank-wide index up to which the samples after `start` fit the byte budget
        together. Rows kept already are among them (every kept row lies before the horizon
        of the fetch that took it, and horizons only move forward), so they are not counted
        twice: counting them shrank the window as it filled, and a file's later rows past
        the shrunken horizon cost another decode."""
        budget = self.max_bytes
        for w in self._window_from(start):
            j = max(start - w.base, 0)
            room = budget + int(w.reach[j])
            k = int(np.searchsorted(w.reach, room, side="right")) - 1
            if k < len(w.block.ids):
                return w.base + k
            budget -= int(w.reach[-1] - w.reach[j])
        return self._window[-1].end

    def _window_from(self, start: int):
        """Window blocks from the one holding `start`, loading more as they are reached."""
        k = 0
        while True:
            while k == len(self._window):
                if not self._extend():
                    return
            w = self._window[k]
            if w.end > start:
                yield w
            k += 1

    # --- rows -------------------------------------------------------------------------------

    def take(self, base: int, lo: int, hi: int, out: list[Any]) -> np.ndarray:
        """Put the kept payloads of block samples [lo, hi) into out[j - lo]; return the block
        indices of those not kept. Rows kept for samples skipped over (a seek, or another
        worker's micro-batches) are dropped."""
        first = base + lo
        if first < self._next:  # a seek back: nothing kept is known to be wanted
            self._kept, self._slices, self.nbytes, self._fetches = {}, {}, 0, 0
        elif first - self._next <= 4 * (hi - lo) + 64:
            for g in range(self._next, first):
                if g in self._kept:
                    self._drop(g)
        else:
            for g in [g for g in self._kept if g < first]:
                self._drop(g)
        self._next = base + hi
        self._fetches += 1
        missing = []
        pop, slices, freed = self._kept.pop, self._slices, 0
        for j in range(lo, hi):
            kept = pop(base + j, None)
            if kept is None:
                missing.append(j)
            elif type(kept) is int:
                held = slices[kept >> 2 * _BOUND]
                out[j - lo] = held[0][(kept >> _BOUND) & _BOUND_MASK : kept & _BOUND_MASK]
                held[1] -= 1
                freed += _SLICE_ROW
                if not held[1]:
                    del slices[kept >> 2 * _BOUND]
                    freed += held[2]
            else:
                out[j - lo] = kept[0]
                freed += kept[1]
        self.nbytes -= freed
        return np.array(missing, dtype=np.int64)

    def later(
        self,
        key: tuple[int, int],
        entry: Any,
        base: int,
        lo: int,
        hi: int,
        located: str | None = None,
    ) -> Later:
        """The nearest (up to `MAX_LATER`) of this rank's samples after block sample `hi` that read
        file `key` (source, file) with the same record `entry`, are built by this process,
        are not kept yet and lie within the byte budget. `located`: "bytes" for their byte
        ranges (the plan's offset and length), "values" for where their values start in the
        row group and how many (offset and tokens), None for neither."""
        parts: list[tuple[_Block, np.ndarray]] = []
        complete = False
        if self.max_bytes > 0:
            start = base + hi
            if self._horizon_at[0] != start:  # the same for every file of a fetch
                self._horizon_at = (start, self._horizon(start))
            end = self._horizon_at[1]
            cap = min(MAX_LATER, FIRST_LATER << min(max(self._fetches - 1, 0), 8))
            taken = 0
            micro_now = int(self._window[0].micro[lo]) if lo < len(self._window[0].micro) else 0
            for w in self._window_from(start):
                if w.base >= end:
                    break
                f = w.files.get(key)
                if f is None:
                    continue
                record = w.block.fetch.files[f][2]
                if record is not entry and record != entry:
                    continue
                js = w.by_file[w.file_at[f] : w.file_at[f + 1]]
                if start > w.base:  # the block's samples from `start` on
                    js = js[js.searchsorted(start - w.base) :]
                if end < w.end:  # ... before `end`
                    js = js[: js.searchsorted(end - w.base)]
                if self.stride > 1:
                    js = js[(w.micro[js] - micro_now) % self.stride == 0]
                if key in self._touched:  # only then can some of its rows be kept already
                    js = js[[w.base + j not in self._kept for j in js.tolist()]]
                js = js[: cap - taken]
                if len(js):
                    parts.append((w, js))
                    taken += len(js)
                    if taken == cap:
                        break
            # nothing beyond the horizon, and every sample up to it taken (or kept already)
            complete = taken < cap and self._ended and end >= self._window[-1].end
            if taken:
                self._touched.add(key)
        rec = [(w.block.fetch, w.block.ids, js, w.base) for w, js in parts]
        if not rec:
            empty = np.zeros(0, dtype=np.int64)
            where = empty if located else None
            return Later(empty, empty, empty, where, where, complete)
        cat = np.concatenate if len(rec) > 1 else _only
        offset = length = None
        if located:
            size = "length" if located == "bytes" else "tokens"
            offset = cat([r.offset[js].astype(np.int64) for r, _i, js, _b in rec])
            length = cat([getattr(r, size)[js].astype(np.int64) for r, _i, js, _b in rec])
        return Later(
            index=cat([js + b for _r, _i, js, b in rec]),
            gid=cat([ids[js].astype(np.int64) for _r, ids, js, _b in rec]),
            row=cat([r.row[js].astype(np.int64) for r, _i, js, _b in rec]),
            offset=offset,
            length=length,
            complete=complete,
        )

    def keep(self, index: list[int], payloads: list[Any] | RowSlices) -> None:
        """Keep the payloads of rank-wide samples `index`, in order, while the budget lasts.

        Rows of a RowSlices (read from Parquet pages) keep its values alive while any of
        them is kept: they are counted whole, with the first of its rows kept, until the
        last is let go; each row kept costs a dict entry and an integer saying where its
        values are, no array of its own until it is taken. Any other array kept holds only
        its own bytes (a view is copied)."""
        left = self.max_bytes - self.nbytes
        if isinstance(payloads, RowSlices):
            values = payloads.values
            whole = values.nbytes + _SLICES_HEADER
            n = 0 if left < whole + _SLICE_ROW else min(len(index), (left - whole) // _SLICE_ROW)
            if n:
                assert len(values) <= _BOUND_MASK
                self._slices_made += 1
                top = self._slices_made << 2 * _BOUND
                starts, ends = payloads.starts[:n].tolist(), payloads.ends[:n].tolist()
                codes = [top | a << _BOUND | b for a, b in zip(starts, ends, strict=True)]
                self._slices[self._slices_made] = [values, n, whole]
                self._kept.update(zip(index[:n], codes, strict=True))
                self.nbytes += whole + n * _SLICE_ROW
            return
        kept = self._kept
        for g, payload in zip(index, payloads, strict=True):
            if type(payload) is np.ndarray:
                if payload.base is not None:
                    payload = payload.copy()  # not to hold the array it is a view of
                size = payload.nbytes + _PAYLOAD_HEADER  # `_payload_bytes`, without the call
            else:
                size = _payload_bytes(payload)
            if size > left:
                break
            kept[g] = (payload, size)
            left -= size
        self.nbytes = self.max_bytes - left

    def _drop(self, g: int) -> None:
        kept = self._kept.pop(g)
        if type(kept) is not int:
            self.nbytes -= kept[1]
            return
        held = self._slices[kept >> 2 * _BOUND]
        held[1] -= 1
        self.nbytes -= _SLICE_ROW
        if not held[1]:
            del self._slices[kept >> 2 * _BOUND]
            self.nbytes -= held[2]


def _only(parts: list[np.ndarray]) -> np.ndarray:
    """np.concatenate of one array, which needs no copy."""
    return parts[0]


def _payload_bytes(payload: Any) -> int:
    """Memory a payload holds: a numpy array's buffer or a str's characters, plus headers."""
    if isinstance(payload, np.ndarray):
        return payload.nbytes + _PAYLOAD_HEADER
    return len(payload) + 64 if isinstance(payload, (str, bytes)) else 64
