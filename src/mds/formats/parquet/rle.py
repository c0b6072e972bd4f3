"""The RLE/bit-packed hybrid encoding of Parquet's levels and dictionary indices (Parquet
"Encodings": Run Length Encoding / Bit-Packing Hybrid): the one decoder of it, used by the
executor's page reader (`pages`) and the indexer's level reader (`levels`).

A stream is a sequence of runs, each a ULEB128 header, then an RLE run (`header >> 1`
copies of one value, in ceil(width / 8) little-endian bytes) or a bit-packed one
(`header >> 1` groups of 8 values of `width` bits each, least significant bit first).

Decoding finds the runs (`Runs`: where each starts, as a value index and as a byte, and the
value of an RLE run), then reads values from them (`Runs.take`). The runs are found one of
two ways, for two shapes of work, and both give the same `Runs`:
- `walk`: header by header from the start, as far as a given value: the executor reads a
  few values near the start of a page of dictionary indices (few, long runs);
- `scan`: every run of the stream at once, with array operations and no Python step per
  run: the indexer reads every level of a column chunk (about two runs per row).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mds.formats.parquet.thrift import Unsupported, varint, varints

__all__ = ["Decoded", "Runs", "all_equal", "decode_pages", "ranges", "scan", "values", "walk"]

_HEADER_BYTES = 5  # a run header is a 32-bit ULEB128 varint
_MAX_PACKED_HEADER = 0x7F  # a one-byte run header: bit-packed, 63 groups of 8 values
_MAX_GROUPS, _MAX_RUN = 63, 63 * 8
_FEW_RANGES = 32  # ranges cut at runs' ends one by one, not with array operations


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n)."""
    total = int(lengths.sum())
    offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return offsets + np.arange(total, dtype=np.int64)


@dataclass(frozen=True)
class Runs:
    """The runs of a stream (or of its start)."""

    first: np.ndarray  # index of each run's first value, then where the last run ends
    place: np.ndarray  # byte offset of each run's payload (after its header)
    repeat: np.ndarray  # the value of an RLE run; -1 for a bit-packed run

    def take(self, data, width: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Values in ranges [starts, ends) of the stream `data` these are the runs of,
        concatenated: each range is cut into its pieces within one run, and the values are
        picked in one pass. The ranges must lie within the runs."""
        first = self.first
        lo_run = np.searchsorted(first, starts, side="right") - 1
        hi_run = np.searchsorted(first, ends - 1, side="right") - 1
        runs_per = np.where(ends > starts, hi_run - lo_run + 1, 0)
        owner = np.repeat(np.arange(len(starts)), runs_per)
        run = ranges(lo_run[runs_per > 0], runs_per[runs_per > 0])
        lo = np.maximum(first[run], starts[owner])
        length = np.minimum(first[run + 1], ends[owner]) - lo
        repeat = self.repeat[run]
        packed = repeat < 0
        total = int(length.sum())
        if not width or not packed.any():
            return np.repeat(np.where(packed, 0, repeat), length)
        size = len(data)
        raw = np.frombuffer(data, np.uint8)
        bit0 = self.place[run] * 8 + (lo - first[run]) * width
        last = bit0 + (length - 1) * width + width - 1
        if int(last[packed].max()) >> 3 >= size:
            raise Unsupported("bit-packed run past the end of its data")
        if width in (8, 16) and packed.all():
            # Whole-byte values (16 bits: dictionaries of 32769 to 65536 entries): each piece
            # is a run of bytes (a few per row); join them and read them as little-endian words.
            first_byte, nbytes = (bit0 >> 3).tolist(), (length * (width // 8)).tolist()
            pieces = [raw[b : b + n] for b, n in zip(first_byte, nbytes, strict=True)]
            return np.concatenate(pieces).view(f"<u{width // 8}")
        if width < 8 and packed.all() and (lo == first[run]).all() and (np.diff(run) > 0).all():
            # Bit-packed runs, each from its first value: unpacked in whole groups of 8, bit
            # by bit, if those groups lie within the data.
            places, groups = self.place[run], (length + 7) // 8
            if int((places + groups * width).max()) <= size:
                return _unpack(raw, places, groups, length, width)
        # Each value's first bit, then the bytes from the one holding it that the value spans,
        # gathered into one word per value.
        bits = np.repeat(bit0 - (np.cumsum(length) - length) * width, length)
        bits += np.arange(total, dtype=np.int64) * width
        word = np.dtype(np.uint32) if width <= 25 else np.dtype(np.uint64)
        span = (width + 14) // 8  # bytes a value starting at any bit of a byte may touch
        at = bits >> 3
        if not packed.all():
            at = np.minimum(at, size - 1)  # RLE pieces read some byte, replaced below
        if int(at.max()) + span > size:
            raw = np.concatenate([raw, np.zeros(span, np.uint8)])
        acc = raw[at].astype(word)
        for k in range(1, span):
            acc |= raw[at + k].astype(word) << word.type(8 * k)
        got = ((acc >> (bits & 7).astype(word)) & word.type((1 << width) - 1)).astype(np.int64)
        if not packed.all():
            got = np.where(np.repeat(packed, length), got, np.repeat(repeat, length))
        return got


def _unpack(raw: np.ndarray, places, groups, lengths, width: int) -> np.ndarray:
    """The first `lengths` values of the `groups` groups of 8 bit-packed values of at most 8
    bits at each of increasing `places` (the groups must not overlap): unpacked bit by bit,
    then the values past each length dropped."""
    bits = np.unpackbits(_slices(raw, places, groups * width), bitorder="little")
    if width == 1:
        got = bits
    else:
        got = bits.reshape(-1, width) @ (1 << np.arange(width)).astype(np.uint8)
    extra = groups * 8 - lengths
    if extra.any():
        cut = extra > 0
        got = np.delete(got, ranges(np.cumsum(groups * 8)[cut] - extra[cut], extra[cut]))
    return got


def _slices(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of data[s : s + n] for each (s, n); the slices must not overlap."""
    keep = lengths > 0
    edges = np.zeros(data.size + 1, np.int8)
    edges[starts[keep]] = 1
    edges[starts[keep] + lengths[keep]] -= 1
    return data[np.cumsum(edges[:-1], dtype=np.int8).view(bool)]


def walk(data, width: int, limit: int) -> Runs:
    """The runs of `width`-bit values in `data` from its start through the one that holds
    value `limit - 1`, header by header."""
    buf = data  # indexed in place: a copy of a page costs page faults
    size = len(buf)
    value_bytes = (width + 7) // 8
    heads = np.frombuffer(buf, np.uint8)
    longest = 1 + _MAX_GROUPS * width  # a bit-packed run of the most groups one header holds
    firsts: list[int] = []
    places: list[int] = []
    repeats: list[int] = []
    i = pos = 0
    while i < limit:
        if pos < size and buf[pos] == _MAX_PACKED_HEADER and width:
            # Writers cut high-entropy data into runs of the most groups a one-byte header
            # holds: find how many follow back to back at once, not header by header.
            most = min((limit - i + _MAX_RUN - 1) // _MAX_RUN, (size - pos) // longest)
            same = heads[pos : pos + most * longest : longest] == _MAX_PACKED_HEADER
            k = most if same.all() else int(np.argmin(same))
            if k:
                firsts.extend(range(i, i + k * _MAX_RUN, _MAX_RUN))
                places.extend(range(pos + 1, pos + 1 + k * longest, longest))
                repeats.extend([-1] * k)
                i, pos = i + k * _MAX_RUN, pos + k * longest
                continue
        header, pos = varint(buf, pos, _HEADER_BYTES)
        count = header >> 1
        if not count:
            raise Unsupported("empty run")
        firsts.append(i)
        places.append(pos)
        if header & 1:
            repeats.append(-1)
            pos += count * width
            i += count * 8
        else:
            if pos + value_bytes > size:
                raise Unsupported("RLE run past the end of its data")
            repeats.append(int.from_bytes(buf[pos : pos + value_bytes], "little"))
            pos += value_bytes
            i += count
    firsts.append(i)
    return Runs(np.array(firsts, np.int64), np.array(places, np.int64), np.array(repeats, np.int64))


def values(data, width: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Values in ranges [starts, ends) of a stream of `width`-bit values, concatenated
    (unsigned: never below zero), reading its runs as far as the last value asked."""
    if width in (8, 16):
        got = _full_runs(data, width, starts, ends)
        if got is not None:
            return got
    return walk(data, width, int(ends.max())).take(data, width, starts, ends)


def _full_runs(data, width: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
    """`values` where they are whole bytes and every run up to the last value asked is
    bit-packed with the most groups a one-byte header holds (what writers make of
    high-entropy indices): where a value's bytes are is then plain arithmetic, so each range
    is cut at the runs' ends and its bytes sliced out, with no walk over run headers (about
    a third of the walk's time for a 400-row page). None for any other stream."""
    longest, size = 1 + _MAX_GROUPS * width, width // 8
    runs = (int(ends.max()) + _MAX_RUN - 1) // _MAX_RUN
    if not runs or runs * longest > len(data):
        return None
    raw = np.frombuffer(data, np.uint8, count=runs * longest)
    if not (raw[::longest] == _MAX_PACKED_HEADER).all():
        return None
    # Each range cut at the runs' ends, as (first byte, bytes) pieces: found with array
    # operations, or for a few ranges one by one (the array operations' fixed cost is
    # more); the pieces are joined as memoryview slices (a numpy slice a piece costs
    # several times more).
    if len(starts) <= _FEW_RANGES:
        at, nbytes = [], []
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            while a < b:
                run, i = divmod(a, _MAX_RUN)
                n = min(b - a, _MAX_RUN - i)
                at.append(run * longest + 1 + i * size)
                nbytes.append(n * size)
                a += n
    else:
        first, last = starts // _MAX_RUN, (ends - 1) // _MAX_RUN
        if (first == last).all():  # no range crosses a run's end: one piece each
            run, lo, hi = first, starts, ends
        else:
            per = last - first + 1
            owner = np.repeat(np.arange(len(starts)), per)
            run = ranges(first, per)
            lo = np.maximum(run * _MAX_RUN, starts[owner])
            hi = np.minimum((run + 1) * _MAX_RUN, ends[owner])
        at = (run * longest + 1 + (lo - run * _MAX_RUN) * size).tolist()
        nbytes = ((hi - lo) * size).tolist()
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    joined = b"".join([view[a : a + n] for a, n in zip(at, nbytes, strict=True)])
    return np.frombuffer(joined, f"<u{size}")


def all_equal(data, width: int, n: int, value: int) -> bool:
    """Whether the first `n` values of a stream of `width`-bit values all equal `value`."""
    if n and data:  # the usual: one RLE run holds them all (a page without nulls)
        header, pos = varint(data, 0, _HEADER_BYTES)
        size = (width + 7) // 8
        if not header & 1 and header >> 1 >= n and pos + size <= len(data):
            return int.from_bytes(data[pos : pos + size], "little") == value
    runs = walk(data, width, n)
    repeats = runs.repeat.tolist()
    if all(r == value for r in repeats):
        return True
    if any(r >= 0 and r != value for r in repeats):
        return False
    got = runs.take(data, width, np.zeros(1, np.int64), np.full(1, n, np.int64))
    return bool((got == value).all())


# --- every run at once ------------------------------------------------------------------


def scan(data: np.ndarray, width: int) -> Runs:
    """All the runs of `width`-bit values in `data` (uint8), which they must fill exactly."""
    starts, header_len, header = _chain(data, width)
    return _runs(data, width, starts + header_len, header, _counts(header))


def _counts(header: np.ndarray) -> np.ndarray:
    """Values in each run, from its header."""
    count = header >> 1
    if not count.all():
        raise Unsupported("empty run")
    return np.where((header & 1) == 1, count * 8, count)


def _runs(data: np.ndarray, width: int, place, header, counts) -> Runs:
    """`Runs` from what `_chain` found and each run's count of values."""
    packed = (header & 1) == 1
    repeat = np.full(place.size, -1, np.int64)
    rle = place[~packed]
    got = np.zeros(rle.size, np.int64)
    for i in range((width + 7) // 8):
        got |= data[rle + i].astype(np.int64) << (8 * i)
    repeat[~packed] = got
    return Runs(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), place, repeat)


def _chain(data: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start offset, header length and header of every run, which must end exactly at the
    end of `data`; without a Python loop per run.

    Reading a header as if one began at every byte gives each byte's successor; the runs are
    the chain of successors from byte 0. Parses that start at a wrong byte nearly always join
    that chain within a few runs, so the bytes reachable in 8 steps are the runs plus a few
    strays. Those bytes, in order, fall into stretches that follow each other; linking the
    stretches (pointer doubling, log2 rounds) keeps the ones on the chain from byte 0.
    """
    n = data.size
    if n == 0:
        return (np.zeros(0, np.int64),) * 3
    header, length = varints(data, _HEADER_BYTES)
    packed = header & 1
    payload = packed * ((header >> 1) * width) + (1 - packed) * ((width + 7) // 8)
    succ = np.arange(n, dtype=np.int64) + length + payload
    # Sentinels: n marks a clean end, n + 1 a run that overruns the data or a bad header.
    np.minimum(succ, n + 1, out=succ)
    succ[length == 0] = n + 1
    succ = np.concatenate([succ, [n, n + 1]])
    reachable = np.zeros(n + 2, bool)
    reachable[_power(succ, 8)] = True
    pos = 0
    for _ in range(8):  # the first runs, which nothing reaches in 8 steps
        reachable[pos] = True
        pos = int(succ[pos])
    nodes = np.flatnonzero(reachable[:n])
    chain = nodes[_on_chain(nodes, succ[nodes])]
    if succ[chain[-1]] != n:
        raise Unsupported("runs overrun their data")
    return chain, length[chain].astype(np.int64), header[chain]


def _power(succ: np.ndarray, steps: int) -> np.ndarray:
    """succ applied `steps` times (a power of two) to every node."""
    while steps > 1:
        succ = np.take(succ, succ)
        steps //= 2
    return succ


def _on_chain(nodes: np.ndarray, succ: np.ndarray) -> np.ndarray:
    """Mask of the sorted `nodes` (a superset of the chain from node 0) that are on the chain,
    given each node's successor (one that is not a node ends the chain)."""
    # A stretch is a maximal run of nodes each followed by its successor; a stretch must
    # also begin wherever a stretch's last node leads, so the chain enters only at a start.
    linked = succ[:-1] == nodes[1:]
    begins = np.concatenate([[True], ~linked])
    target = _find(nodes, succ[np.concatenate([~linked, [True]])])
    begins[target[target >= 0]] = True
    stretch = np.cumsum(begins) - 1
    count = int(stretch[-1]) + 1
    last = np.concatenate([np.flatnonzero(begins)[1:], [nodes.size]]) - 1
    target = _find(nodes, succ[last])
    # Each stretch leads to the stretch its last node's successor begins; `count` is the end.
    jump = np.concatenate([np.where(target >= 0, stretch[target], count), [count]])
    taken = np.zeros(count + 1, bool)
    taken[_path(jump, count)] = True
    return taken[stretch]


def _path(jump: np.ndarray, end: int) -> np.ndarray:
    """Nodes on the path from node 0 to `end` (jump[i] > i, jump[end] == end), by pointer
    doubling: after k rounds `path` holds the first 2**k nodes and `jump` skips 2**k."""
    path = np.zeros(1, np.int64)
    while path[-1] < end:
        path = np.concatenate([path, jump[path]])
        jump = np.take(jump, jump)
    return path


def _find(nodes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Index of each value in the sorted `nodes`, or -1 where it is not one."""
    if not nodes.size:
        return np.full(values.size, -1, np.int64)
    index = np.searchsorted(nodes, values).clip(max=nodes.size - 1)
    return np.where(nodes[index] == values, index, -1)


@dataclass(frozen=True)
class Decoded:
    """A decoded stream kept as runs, so long RLE runs cost nothing per value."""

    start: np.ndarray  # index of each run's first value
    end: np.ndarray  # index just past each run
    value: np.ndarray  # the RLE run's value, -1 for a bit-packed run
    packed_start: np.ndarray  # index into `packed` of a bit-packed run's first value
    packed: np.ndarray  # the values of all bit-packed runs, in order
    size: int

    def positions_of(self, value: int) -> np.ndarray:
        """Indices of the values equal to `value`, in order."""
        rle = self.value == value
        in_rle = ranges(self.start[rle], self.end[rle] - self.start[rle])
        hits = np.flatnonzero(self.packed == value)  # indices into `packed`
        if not hits.size:
            return in_rle
        bp = np.flatnonzero(self.value < 0)
        run = bp[np.searchsorted(self.packed_start[bp], hits, side="right") - 1]
        in_bp = self.start[run] + hits - self.packed_start[run]
        return np.sort(np.concatenate([in_rle, in_bp]), kind="stable")  # merges two sorted runs

    def at(self, positions: np.ndarray) -> np.ndarray:
        """The values at sorted `positions`."""
        run = np.searchsorted(self.end, positions, side="right")
        got = self.value[run]
        bp = got < 0
        if bp.any():
            r = run[bp]
            got[bp] = self.packed[self.packed_start[r] + positions[bp] - self.start[r]]
        return got

    def count_at_most(self, value: int) -> int:
        """How many values are at most `value`."""
        rle = (self.value >= 0) & (self.value <= value)
        in_rle = int((self.end[rle] - self.start[rle]).sum())
        return in_rle + int(np.count_nonzero(self.packed <= value))


def decode_pages(data: np.ndarray, page_ends: np.ndarray, counts: np.ndarray, max_value: int):
    """Decode consecutive streams of values up to `max_value` (at most 8 bits: levels), one
    per page, joined with no length prefix.

    Page i's stream ends at byte page_ends[i] and holds counts[i] values; values are
    numbered across pages. Every run must lie inside its page; only a page's last
    bit-packed group may hold more values than the page (padding, dropped).
    """
    width = max_value.bit_length()
    if width > 8:
        raise Unsupported("level wider than a byte")
    starts, header_len, header = _chain(data, width)
    if np.any(_find(starts, page_ends[page_ends < data.size]) < 0):
        raise Unsupported("a run crosses a page boundary")
    packed = (header & 1) == 1
    run_counts = _counts(header)
    page = np.searchsorted(page_ends, starts, side="right")
    excess = np.bincount(page, run_counts, minlength=counts.size)[: counts.size]
    excess = excess.astype(np.int64) - counts
    last = np.searchsorted(page, np.flatnonzero(excess), side="right") - 1
    if np.any(excess < 0) or np.any(excess[excess > 0] >= 8) or not np.all(packed[last]):
        raise Unsupported("value count differs from the page's")
    trimmed = run_counts.copy()
    trimmed[last] -= excess[excess > 0]
    runs = _runs(data, width, starts + header_len, header, trimmed)
    end = runs.first[1:]
    got = _unpack(data, runs.place[packed], header[packed] >> 1, trimmed[packed], width)
    if max(int(runs.repeat.max(initial=0)), int(got.max(initial=0))) > max_value:
        raise Unsupported("value above the maximum")
    kept = np.where(packed, trimmed, 0)
    return Decoded(
        start=end - trimmed,
        end=end,
        value=runs.repeat.astype(np.int16),
        packed_start=np.cumsum(kept) - kept,
        packed=got,
        size=int(counts.sum()),
    )
