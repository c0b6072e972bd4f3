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
from itertools import accumulate
from typing import Any

import numpy as np

from mds.core.planfile import RankChunk
from mds.errors import PlanError

__all__ = ["Later", "Lookahead", "narrowed"]

BYTES_PER_TOKEN = 4
_PAYLOAD_HEADER = 112  # a kept array's bytes beyond its tokens (`_payload_bytes`)
_U16 = int(np.iinfo(np.uint16).max)
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
    file_at: np.ndarray = field(init=False)
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
        )
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
        # rank-wide index -> (payload, bytes it holds of its own, id of the array it is a view of)
        self._kept: dict[int, tuple[Any, int, int | None]] = {}
        self._arrays: dict[int, list[int]] = {}  # such an array's id -> [rows kept, its bytes]
        self._next = 0  # rank-wide index after the last sample taken
        self._fetches = 0  # since the window started
        self._ended = False  # the window's last block is the plan's last
        self._horizon_at: tuple[int, int] = (-1, -1)  # (start, its horizon), per fetch
        self._touched: set[tuple[int, int]] = set()  # files with rows taken (kept or not)

    def clear(self) -> None:
        self._window, self._kept, self.nbytes, self._next, self._fetches = [], {}, 0, 0, 0
        self._arrays = {}
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
            self._kept, self._arrays, self.nbytes, self._fetches = {}, {}, 0, 0
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
        pop, freed = self._kept.pop, 0
        for j in range(lo, hi):
            kept = pop(base + j, None)
            if kept is None:
                missing.append(j)
            else:
                out[j - lo] = kept[0]
                freed += kept[1] if kept[2] is None else self._freed(kept)
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
                if f is None or w.block.fetch.files[f][2] != entry:
                    continue
                group = w.by_file[w.file_at[f] : w.file_at[f + 1]]
                js = group[
                    np.searchsorted(group, max(start - w.base, 0)) : np.searchsorted(
                        group, end - w.base
                    )
                ]
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
        cat = np.concatenate
        if not rec:
            empty = np.zeros(0, dtype=np.int64)
            where = empty if located else None
            return Later(empty, empty, empty, where, where, complete)
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

    def keep(self, index: list[int], payloads: list[Any]) -> None:
        """Keep the payloads of rank-wide samples `index`, in order, while the budget lasts.

        Rows that are views of one array (read from Parquet pages, or copied out of a
        decode by `narrowed`) keep it alive while any of them does: it is counted whole,
        with the first of its rows kept, until the last is let go."""
        kept, arrays, left = self._kept, self._arrays, self.max_bytes - self.nbytes
        for g, payload in zip(index, payloads, strict=True):
            if type(payload) is np.ndarray:
                owner = payload.base
                if type(owner) is np.ndarray:
                    key = id(owner)  # unique while a view keeps the array alive
                    held = arrays.get(key)
                    extra = owner.nbytes if held is None else 0
                    if _PAYLOAD_HEADER + extra > left:
                        break
                    if held is None:
                        held = arrays[key] = [0, extra]
                    held[0] += 1
                    kept[g] = (payload, _PAYLOAD_HEADER, key)
                    left -= _PAYLOAD_HEADER + extra
                    continue
                size = payload.nbytes + _PAYLOAD_HEADER  # `_payload_bytes`, without the call
            else:
                size = _payload_bytes(payload)
            if size > left:
                break
            kept[g] = (payload, size, None)
            left -= size
        self.nbytes = self.max_bytes - left

    def _freed(self, entry: tuple[Any, int, int | None]) -> int:
        """Bytes no longer held once kept `entry` is let go: its own, and with the last row
        kept from an array, the array's."""
        _payload, size, key = entry
        if key is not None:
            held = self._arrays[key]
            held[0] -= 1
            if not held[0]:
                del self._arrays[key]
                size += held[1]
        return size

    def _drop(self, g: int) -> None:
        self.nbytes -= self._freed(self._kept.pop(g))


def narrowed(payloads: list[Any]) -> list[Any]:
    """`payloads` (a read's rows, this step's and those read ahead) with the integer rows
    that are views of a larger array replaced by views of one array per such array holding
    only them, as uint16 where all their values fit (token ids of a vocabulary under
    65,536), else at their width. The decode is then freed at once, not when the last row
    read ahead is used; batches widen token ids to int64 whatever their width
    (`batch.compact`)."""
    first = payloads[0] if payloads else None
    owner = first.base if type(first) is np.ndarray else None
    if type(owner) is np.ndarray and all(
        type(p) is np.ndarray and p.base is owner for p in payloads
    ):
        groups = [list(range(len(payloads)))]  # the common case: one decode's rows
    else:
        by_owner: dict[int, list[int]] = {}
        for k, payload in enumerate(payloads):
            if type(payload) is np.ndarray and type(payload.base) is np.ndarray:
                by_owner.setdefault(id(payload.base), []).append(k)
        groups = list(by_owner.values())
    out = list(payloads)
    for ks in groups:
        owner = payloads[ks[0]].base
        rows = [payloads[k] for k in ks]
        if owner.dtype.kind not in "iu" or rows[0].ndim != 1:
            continue
        values = np.concatenate(rows)
        if values.dtype.itemsize > 2 and values.size and 0 <= values.min():
            if values.max() <= _U16:
                values = values.astype(np.uint16)
        if values.nbytes >= owner.nbytes:
            continue  # no smaller than what it would keep
        cuts = list(accumulate(len(r) for r in rows))
        for k, lo, hi in zip(ks, [0, *cuts[:-1]], cuts, strict=True):
            out[k] = values[lo:hi]
    return out


def _payload_bytes(payload: Any) -> int:
    """Memory a payload holds: a numpy array's buffer or a str's characters, plus headers."""
    if isinstance(payload, np.ndarray):
        return payload.nbytes + _PAYLOAD_HEADER
    return len(payload) + 64 if isinstance(payload, (str, bytes)) else 64
