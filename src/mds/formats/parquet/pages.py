"""Chosen rows of a Parquet list<int> column, decoded from its pages: given where each row's
values start in its row group (the plan's `offset`, from the index), only the pages holding
them are decompressed and only their dictionary indices decoded.

pyarrow decodes a row group whole: every level, every index, every list (~0.9 ms of CPU for
a group of 120k tokens). A rank that takes a few rows of a group (many sources mixed, a run
shorter than a pass) pays that for each group it touches. Here a row costs its own values.

Only layouts pyarrow would decode to the same values are taken: one INT32/INT64 leaf with no
logical type, one repetition level, RLE levels, PLAIN or dictionary-encoded values, a codec
pyarrow decompresses. Every page up to the last one read must have all its definition levels
at the maximum (no null or empty list, no null token), so that level n is value n. Anything
else returns None, and the caller decodes with pyarrow, which reports what is wrong.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mds.formats.parquet.thrift import (
    CODECS,
    DATA_PAGE,
    DATA_PAGE_V2,
    DICTIONARY_PAGE,
    INDEX_PAGE,
    RLE,
    Truncated,
    Unsupported,
    decompress,
    field_int,
    field_struct,
    length_prefixed,
    page_fields,
    ranges,
    varint,
)

__all__ = ["Layout", "Source", "chunk_span", "layout", "leaves", "read_rows"]

_PLAIN, _PLAIN_DICTIONARY, _RLE_DICTIONARY = 0, 2, 8
_DTYPES = {("INT32", "int32"): np.dtype("<i4"), ("INT64", "int64"): np.dtype("<i8")}
_WHOLE_CHUNK = 4 << 20  # a column chunk up to this size is read in one request
_HEADER_READ = 256  # a page header's first read; a longer header is read again, whole
_MAX_PAGE = 256 << 20  # a (damaged) header's page size beyond this is left to pyarrow
_MAX_PACKED_HEADER = 0x7F  # a one-byte run header: bit-packed, 63 groups of 8 values
_MAX_GROUPS, _MAX_RUN = 63, 63 * 8


class Source(Protocol):
    """An object's bytes by range (ranges.RangeFile)."""

    def read_at(self, size: int, start: int) -> bytes: ...


# Each thread reads whole column chunks of files into one buffer of its own, reused from
# file to file: a fresh ~0.5 MB bytes object per read costs more in page faults than the
# decode.
_scratch = threading.local()


@dataclass(frozen=True)
class _Chunk:
    start: int  # file offset of the chunk's first page (the dictionary's, if any)
    size: int
    num_values: int  # levels: values, when every definition level is the maximum
    codec: str | None


class Layout:
    """What reading pages of one list column needs from the footer; chunk facts are taken
    per row group as first asked."""

    def __init__(self, meta: pq.FileMetaData, leaf: int, dtype: np.dtype, max_def: int):
        self._meta, self.leaf, self.dtype, self.max_def = meta, leaf, dtype, max_def
        self._chunks: dict[int, _Chunk | None] = {}

    def chunk(self, group: int) -> _Chunk | None:
        if group not in self._chunks:
            self._chunks[group] = self._chunk(group)
        return self._chunks[group]

    def _chunk(self, group: int) -> _Chunk | None:
        col = self._meta.row_group(group).column(self.leaf)
        if col.file_path or col.compression not in CODECS:
            return None
        start, end = chunk_span(col)
        return _Chunk(start, end - start, int(col.num_values), CODECS[col.compression])


def chunk_span(col: pq.ColumnChunkMetaData) -> tuple[int, int]:
    """Byte span [lo, hi) of a column chunk in its file, dictionary page first, if any."""
    lo = col.data_page_offset
    if col.has_dictionary_page and 0 < col.dictionary_page_offset < lo:
        lo = col.dictionary_page_offset
    return int(lo), int(lo + col.total_compressed_size)


def leaves(meta: pq.FileMetaData, column: str) -> list[int]:
    """Indices of the leaf columns of top-level `column`."""
    paths = [meta.schema.column(j).path for j in range(meta.num_columns)]
    return [j for j, p in enumerate(paths) if p == column or p.startswith(column + ".")]


def layout(meta: pq.FileMetaData, column: str, value_type: pa.DataType) -> Layout | None:
    """The Layout of top-level list column `column` whose Arrow values are `value_type`, or
    None where its pages are not read here."""
    found = leaves(meta, column)
    if len(found) != 1:
        return None
    col = meta.schema.column(found[0])
    dtype = _DTYPES.get((col.physical_type, str(value_type)))
    if dtype is None or col.max_repetition_level != 1 or col.max_definition_level < 1:
        return None
    if col.logical_type.type != "NONE" or col.converted_type != "NONE":
        return None
    return Layout(meta, found[0], dtype, col.max_definition_level)


def read_rows(
    source: int | Source, lay: Layout, group: int, starts: np.ndarray, counts: np.ndarray
) -> list[np.ndarray] | None:
    """The values [starts[k], starts[k] + counts[k]) of row group `group`'s leaf, one array
    per k (views of one array), or None where the pages cannot be read here. `source`: the
    file descriptor of a local file, or an object's reader (`read_at`, as ranges.RangeFile:
    its errors are raised as they come)."""
    chunk = lay.chunk(group)
    starts = np.asarray(starts, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    if chunk is None or not len(starts):
        return None
    ends = starts + counts
    # An empty row is an empty list whose page holds a level and no value: left to pyarrow.
    if starts.min() < 0 or counts.min() < 1 or int(ends.max()) > chunk.num_values:
        return None
    try:
        out = _decode(source, lay, chunk, starts, ends)
    except (Unsupported, Truncated):
        return None
    cuts = np.cumsum(counts).tolist()
    return [out[a:b] for a, b in zip([0, *cuts[:-1]], cuts, strict=True)]


def _read_at(source: int | Source, n: int, offset: int) -> memoryview:
    """Bytes [offset, offset + n) of their own (a page outlives the next read)."""
    got = os.pread(source, n, offset) if isinstance(source, int) else source.read_at(n, offset)
    if len(got) != n:
        raise Unsupported("column chunk is truncated")
    return memoryview(got).cast("B")


def _whole(source: int | Source, chunk: _Chunk) -> memoryview | None:
    """The column chunk (of a file: read into this thread's buffer, valid until its next
    read), or None if it is too big to read at once."""
    if chunk.size > _WHOLE_CHUNK:
        return None
    if not isinstance(source, int):
        return _read_at(source, chunk.size, chunk.start)
    fd = source
    buf = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < chunk.size:
        buf = _scratch.buf = bytearray(max(chunk.size, 1 << 20))
    data = memoryview(buf)[: chunk.size]
    if os.preadv(fd, [data], chunk.start) != chunk.size:
        raise Unsupported("column chunk is truncated")
    return data


def _decode(source, lay: Layout, chunk: _Chunk, starts: np.ndarray, ends: np.ndarray):
    """The values of ranges [starts, ends) concatenated, reading pages up to the last one."""
    data = _whole(source, chunk)

    def part(pos: int, n: int) -> memoryview:
        if pos + n > chunk.size:
            raise Unsupported("page runs past its column chunk")
        if data is not None:
            return data[pos : pos + n]
        return _read_at(source, n, chunk.start + pos)

    need = int(ends.max())
    lengths = ends - starts
    placed = np.cumsum(lengths) - lengths  # where each range goes in the output
    out = None
    pos = first = 0  # the page's place in the chunk, and the index of its first value
    dictionary = None
    while first < need:
        if pos >= chunk.size:
            raise Unsupported("column chunk ends before the values asked")
        head = part(pos, min(_HEADER_READ, chunk.size - pos))
        try:
            fields, size = page_fields(head, 0)
        except Truncated:
            head = part(pos, chunk.size - pos)
            fields, size = page_fields(head, 0)
        kind, stored = field_int(fields, 1), field_int(fields, 3)
        body = part(pos + size, stored)
        pos += size + stored
        if kind == DICTIONARY_PAGE:
            dictionary = _dictionary(fields, body, chunk.codec, lay.dtype)
        elif kind in (DATA_PAGE, DATA_PAGE_V2):
            n, encoding, values = _data_page(fields, body, chunk.codec, lay.max_def)
            lo, hi = np.maximum(starts, first), np.minimum(ends, first + n)
            if first == 0 and n >= need:  # every range in this page: the common case
                return _values(encoding, values, starts, ends, dictionary, lay.dtype, n)
            inside = hi > lo
            if inside.any():
                if out is None:
                    out = np.empty(int(lengths.sum()), lay.dtype)
                lo, hi = lo[inside], hi[inside]
                got = _values(encoding, values, lo - first, hi - first, dictionary, lay.dtype, n)
                out[ranges(placed[inside] + lo - starts[inside], hi - lo)] = got
            first += n
        elif kind != INDEX_PAGE:
            raise Unsupported(f"page type {kind}")
    assert out is not None
    return out


def _decompress(body: memoryview, size: int, codec: str | None) -> memoryview:
    if size > _MAX_PAGE:
        raise Unsupported("page larger than this reader takes")
    return decompress(body, size, codec)


def _dictionary(fields: dict, body: memoryview, codec: str | None, dtype: np.dtype):
    head = field_struct(fields, 7)
    n = field_int(head, 1)
    if field_int(head, 2) not in (_PLAIN, _PLAIN_DICTIONARY):
        raise Unsupported("dictionary not PLAIN")
    data = _decompress(body, field_int(fields, 2), codec)
    if len(data) < n * dtype.itemsize:
        raise Unsupported("dictionary page shorter than its values")
    return np.frombuffer(data, dtype=dtype, count=n)


def _data_page(fields: dict, body: memoryview, codec: str | None, max_def: int):
    """(levels in the page, value encoding, the values' bytes); Unsupported unless every
    definition level is `max_def`."""
    if field_int(fields, 1) == DATA_PAGE:
        head = field_struct(fields, 5)
        n = field_int(head, 1)
        if field_int(head, 3) != RLE or field_int(head, 4) != RLE:
            raise Unsupported("level encoding is not RLE")
        data = _decompress(body, field_int(fields, 2), codec)
        _rep, pos = length_prefixed(data, 0)  # repetition levels: rows come from the plan
        dfn, pos = length_prefixed(data, pos)
        values = data[pos:]
    else:
        head = field_struct(fields, 8)
        n, rep_bytes, def_bytes = field_int(head, 1), field_int(head, 6), field_int(head, 5)
        if field_int(head, 2) != 0 or rep_bytes + def_bytes > len(body):
            raise Unsupported("page holds nulls")
        dfn = body[rep_bytes : rep_bytes + def_bytes]
        values = body[rep_bytes + def_bytes :]
        if head.get(7, True):
            values = _decompress(values, field_int(fields, 2) - rep_bytes - def_bytes, codec)
    if not _all_at(dfn, n, max_def):
        raise Unsupported("page holds a null or an empty list")
    return n, field_int(head, 4 if field_int(fields, 1) == DATA_PAGE_V2 else 2), values


def _all_at(levels: memoryview, n: int, level: int) -> bool:
    """Whether the first `n` levels of an RLE/bit-packed hybrid stream all equal `level`."""
    width = level.bit_length()
    seen = pos = 0
    while seen < n:
        header, pos = varint(levels, pos)
        if header & 1:
            count = (header >> 1) * 8
            end = pos + (header >> 1) * width
            if count == 0 or end > len(levels):
                return False
            bits = np.unpackbits(np.frombuffer(levels[pos:end], np.uint8), bitorder="little")
            got = bits.reshape(-1, width) @ (1 << np.arange(width, dtype=np.int64))
            if np.any(got[: n - seen] != level):
                return False
            pos = end
        else:
            count, end = header >> 1, pos + (width + 7) // 8
            if count == 0 or end > len(levels):
                return False
            if int.from_bytes(levels[pos:end], "little") != level:
                return False
            pos = end
        seen += count
    return True


def _values(encoding: int, data: memoryview, starts, ends, dictionary, dtype, n: int):
    """The page's values in ranges [starts, ends) of its `n`, concatenated."""
    if encoding == _PLAIN:
        if len(data) < n * dtype.itemsize:
            raise Unsupported("page shorter than its values")
        return np.frombuffer(data, dtype=dtype, count=n)[ranges(starts, ends - starts)]
    if encoding not in (_PLAIN_DICTIONARY, _RLE_DICTIONARY) or dictionary is None:
        raise Unsupported(f"value encoding {encoding}")
    if not len(data) or data[0] > 32:
        raise Unsupported("bad dictionary index width")
    indices = _hybrid(data[1:], data[0], starts, ends)  # unsigned: never below zero
    try:
        return dictionary.take(indices)  # raises on an index past the end
    except IndexError:
        raise Unsupported("dictionary index out of range") from None


def _full_runs(data: memoryview, width: int, starts: np.ndarray, ends: np.ndarray):
    """`_hybrid`'s values where they are whole bytes and every run up to the last value
    asked is bit-packed with the most groups a one-byte header holds (what writers make of
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
    pieces = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        while a < b:
            run, i = divmod(a, _MAX_RUN)
            n = min(b - a, _MAX_RUN - i)
            at = run * longest + 1 + i * size
            pieces.append(raw[at : at + n * size])
            a += n
    return np.concatenate(pieces).view(f"<u{size}")


def _hybrid(data: memoryview, width: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Values in ranges [starts, ends) of an RLE/bit-packed hybrid stream of `width`-bit
    values, concatenated: run headers are walked up to the last value asked, then each
    range is cut into its pieces within one run, and the values are picked in one pass."""
    if width in (8, 16):
        got = _full_runs(data, width, starts, ends)
        if got is not None:
            return got
    buf = data  # indexed in place: a copy of a page costs page faults
    size, limit = len(buf), int(ends.max())
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
        header = shift = 0
        while True:  # the run's ULEB128 header
            if pos >= size or shift > 35:
                raise Unsupported("bad run header")
            b = buf[pos]
            pos += 1
            header |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
        firsts.append(i)
        places.append(pos)
        if header & 1:
            repeats.append(-1)
            pos += (header >> 1) * width
            i += (header >> 1) * 8
        else:
            if header >> 1 == 0 or pos + value_bytes > size:
                raise Unsupported("bad RLE run")
            repeats.append(int.from_bytes(buf[pos : pos + value_bytes], "little"))
            pos += value_bytes
            i += header >> 1
    firsts.append(i)
    first = np.array(firsts, dtype=np.int64)
    # The pieces: each range split where a run starts inside it.
    lo_run = np.searchsorted(first, starts, side="right") - 1
    hi_run = np.searchsorted(first, ends - 1, side="right") - 1
    runs_per = np.where(ends > starts, hi_run - lo_run + 1, 0)
    owner = np.repeat(np.arange(len(starts)), runs_per)
    run = ranges(lo_run[runs_per > 0], runs_per[runs_per > 0])
    lo = np.maximum(first[run], starts[owner])
    length = np.minimum(first[run + 1], ends[owner]) - lo
    repeat = np.array(repeats, dtype=np.int64)[run]
    packed = repeat < 0
    total = int(length.sum())
    if not width or not packed.any():
        return np.repeat(np.where(packed, 0, repeat), length)
    bit0 = np.array(places, dtype=np.int64)[run] * 8 + (lo - first[run]) * width
    last = bit0 + (length - 1) * width + width - 1
    if int(last[packed].max()) >> 3 >= size:
        raise Unsupported("bit-packed run past the end of its page")
    raw = np.frombuffer(buf, np.uint8)
    if width in (8, 16) and packed.all():
        # Whole-byte values (16 bits: dictionaries of 32769 to 65536 entries): each piece
        # is a run of bytes (a few per row); join them and read them as little-endian words.
        first_byte, nbytes = (bit0 >> 3).tolist(), (length * (width // 8)).tolist()
        pieces = [raw[b : b + n] for b, n in zip(first_byte, nbytes, strict=True)]
        return np.concatenate(pieces).view(f"<u{width // 8}")
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
    values = ((acc >> (bits & 7).astype(word)) & word.type((1 << width) - 1)).astype(np.int64)
    if not packed.all():
        values = np.where(np.repeat(packed, length), values, np.repeat(repeat, length))
    return values
