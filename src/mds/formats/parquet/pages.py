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

import io
import os
import threading
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mds.core.row_slices import RowSlices, narrow_ids
from mds.formats.parquet import footer, page_reads, rle
from mds.formats.parquet.compression import PREFIX_DECODERS, decompress, levels_end
from mds.formats.parquet.footer import Chunk, chunk_span, leaves
from mds.formats.parquet.thrift import (
    DATA_PAGE,
    DATA_PAGE_V2,
    DICTIONARY_PAGE,
    INDEX_PAGE,
    RLE,
    Truncated,
    Unsupported,
    field_int,
    field_struct,
    length_prefixed,
    page_fields,
)

__all__ = [
    "WHOLE_CHUNK",
    "Layout",
    "Source",
    "chunk_span",
    "fetch_rows",
    "layout",
    "leaves",
    "read_rows",
]

_PLAIN, _PLAIN_DICTIONARY, _RLE_DICTIONARY = 0, 2, 8
_DTYPES = {("INT32", "int32"): np.dtype("<i4"), ("INT64", "int64"): np.dtype("<i8")}
WHOLE_CHUNK = 4 << 20  # a column chunk up to this size is read in one request (default)
_HEADER_READ = 256  # a page header's first read; a longer header is read again, whole
_CHECKED_PAGES = 4096  # data pages of a row group remembered as full (16-24 bytes each)
_SHORT = 2  # values asked within the first 1/_SHORT of a chunk: read page by page
_MAX_PAGE = 256 << 20  # a (damaged) header's page size beyond this is left to pyarrow
# Codecs whose v1 data pages are decompressed only through the last value asked (`_prefix`),
# where the values asked lie in a page's first 1/share, and a page holding no value
# asked only through its levels. Measured on 1 MB pages of token ids: gzip, 0.2 against 5.0
# ms for a page's levels (Python's zlib decodes more slowly than pyarrow's whole page, so
# not past the half); zstd, 0.14 against 0.2 ms, its stream decoded a block at a time. Not
# snappy: its prefix is found by walking its elements in Python (~0.1 us each), which cost
# more than decompressing the whole page in native code (140 against 62 us through the
# levels of a 1 MB page of token ids).
_PREFIX_CODECS = {"gzip": 2, "zstd": 4}
# A read `narrow` casts the dictionary (not the values it gives) where it asks for at least
# 1/_NARROW_DICTIONARY as many values as the dictionary holds.
_NARROW_DICTIONARY = 4


class Source(Protocol):
    """An object's bytes by range (ranges.RangeFile), and its size."""

    size: int

    def read_at(self, size: int, start: int) -> bytes: ...


# Each thread reads whole column chunks of files into one buffer of its own, reused from
# file to file: a fresh ~0.5 MB bytes object per read costs more in page faults than the
# decode.
_scratch = threading.local()


class Layout:
    """What reading pages of top-level list column `column` needs from the footer; chunk
    facts are taken per row group as first asked."""

    def __init__(
        self, meta: pq.FileMetaData, leaf: int, dtype: np.dtype, max_def: int, column: str
    ):
        self.meta, self.leaf, self.dtype, self.max_def = meta, leaf, dtype, max_def
        self.column = column
        self._chunks: dict[int, Chunk | None] = {}
        self._checked: dict[int, dict[int, tuple[int, int]]] = {}

    def checked(self, group: int) -> dict[int, tuple[int, int]]:
        """Row group `group`'s data pages whose levels were read and found full (level n is
        value n), by their place in the chunk: (the next page's place, values in the page).
        A later read skips such a page without reading it where it holds no value asked."""
        return self._checked.setdefault(group, {})

    def note(self, group: int, at: int, after: int, n: int) -> None:
        """Data page `at` of row group `group` is full: see `checked`."""
        pages = self.checked(group)
        if len(pages) < _CHECKED_PAGES:
            pages[at] = (after, n)

    def chunk(self, group: int) -> Chunk | None:
        """Row group `group`'s column chunk, or None where its pages are not read here: a
        chunk `footer.chunk` does not take, or any chunk while MDS_PAGE_READS is `off` (so
        a reader leaves every row group to pyarrow's whole decode)."""
        if page_reads.mode() == "off":
            return None
        if group not in self._chunks:
            self._chunks[group] = footer.chunk(self.meta, group, self.leaf)
        return self._chunks[group]

    def first_row(self, group: int) -> int:
        """The file row where row group `group` starts."""
        return sum(self.meta.row_group(i).num_rows for i in range(group))


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
    return Layout(meta, found[0], dtype, col.max_definition_level, column)


def fetch_rows(
    source: int | Source,
    lay: Layout,
    group: int,
    rows: np.ndarray,
    starts: np.ndarray,
    counts: np.ndarray,
    file: str,
    most: int = WHOLE_CHUNK,
    narrow: bool = False,
) -> RowSlices | None:
    """`read_rows` as MDS_PAGE_READS says (`page_reads`): `on`, read_rows; `off`, None, so
    the caller decodes the row group with pyarrow; `check`, read_rows compared with pyarrow's
    decode of file rows `rows` (whose values the plan says are [starts, starts + counts) of
    the group): SourceDataError naming `file` and the first row that differs."""
    setting = page_reads.mode()
    if setting == "off":
        return None
    got = read_rows(source, lay, group, starts, counts, most, narrow)
    if setting == "check" and got is not None:
        _check(source, lay, group, np.asarray(rows, dtype=np.int64), got, file)
    return got


def _check(source, lay: Layout, group: int, rows: np.ndarray, got, file: str) -> None:
    """SourceDataError unless each of `got` is file row rows[k] as pyarrow decodes it: the
    same values, of the same dtype or (read `narrow`) uint16."""
    try:
        lists = _pyarrow_group(source, lay, group)
    except (OSError, pa.ArrowException) as exc:  # where the page reader read rows
        raise page_reads.unreadable(file, group, lay.column, exc) from None
    offsets = lists.offsets.to_numpy()
    valid = lists.is_valid().to_numpy(zero_copy_only=False)
    first = lay.first_row(group)
    for k in np.argsort(rows, kind="stable").tolist():
        r = int(rows[k]) - first
        if valid[r]:
            a, b = int(offsets[r]), int(offsets[r + 1])
            want = lists.values.slice(a, b - a).to_numpy(zero_copy_only=False)
            row = got[k]
            if row.dtype in (want.dtype, np.uint16) and np.array_equal(row, want):
                continue
        raise page_reads.mismatch(file, group, lay.column, int(rows[k]), "token ids")


def _pyarrow_group(source: int | Source, lay: Layout, group: int) -> pa.ListArray:
    """Row group `group`'s list column as pyarrow decodes it, from the same bytes."""
    handle = pa.PythonFile(_SourceFile(source), mode="r")
    try:
        with pq.ParquetFile(handle, metadata=lay.meta) as parquet:
            table = parquet.read_row_group(group, columns=[lay.column], use_threads=False)
    finally:
        handle.close()
    return table.column(0).combine_chunks()


class _SourceFile(io.RawIOBase):
    """A seekable, readable file object over a file descriptor or a Source, for pyarrow."""

    def __init__(self, source: int | Source):
        super().__init__()
        self._source, self._pos = source, 0
        self._size = os.fstat(source).st_size if isinstance(source, int) else source.size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = max(0, (0, self._pos, self._size)[whence] + pos)
        return self._pos

    def read(self, size: int = -1) -> bytes:
        left = max(0, self._size - self._pos)
        size = left if size is None or size < 0 else min(size, left)
        source = self._source
        data = (
            os.pread(source, size, self._pos)
            if isinstance(source, int)
            else source.read_at(size, self._pos)
        )
        self._pos += len(data)
        return data


def read_rows(
    source: int | Source,
    lay: Layout,
    group: int,
    starts: np.ndarray,
    counts: np.ndarray,
    most: int = WHOLE_CHUNK,
    narrow: bool = False,
) -> RowSlices | None:
    """The values [starts[k], starts[k] + counts[k]) of row group `group`'s leaf, row k of
    the RowSlices (one array, in order), or None where the pages cannot be read here. With
    `narrow` the values are uint16 where every one of them fits, else at the leaf's width:
    a dictionary whose values all fit is cast before its indices are looked up, so rows of
    a dictionary page are decoded straight into uint16. `source`: the
    file descriptor of a local file, or an object's reader (`read_at`, as ranges.RangeFile:
    its errors are raised as they come). A chunk of at most `most` bytes is read at once,
    a larger one page by page: only the pages holding the values asked, their headers and
    the dictionary page are read, never the whole chunk. So is any chunk whose values asked
    all lie in its first half (`_short`)."""
    chunk = lay.chunk(group)
    starts = np.asarray(starts, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    if chunk is None or not len(starts):
        return None
    ends = starts + counts
    # An empty row is an empty list whose page holds a level and no value: left to pyarrow.
    if starts.min() < 0 or counts.min() < 1 or int(ends.max()) > chunk.num_values:
        return None
    # The ranges in the order of their values, each once: the values of a page then fill
    # one stretch of the output (a slice, not an index a value), which is what the rows'
    # slices point into. Ranges that overlap (no two rows share values) keep their order.
    order = np.argsort(starts, kind="stable")
    ordered_starts, ordered_ends = starts[order], ends[order]
    new = np.ones(len(order), dtype=bool)
    np.not_equal(ordered_starts[1:], ordered_starts[:-1], out=new[1:])
    first = np.cumsum(new) - 1  # each range's place among the distinct ones
    lo, hi = ordered_starts[new], ordered_ends[new]
    ordered = bool((hi[:-1] <= lo[1:]).all() and (ordered_ends == hi[first]).all())
    try:
        if ordered:
            out = _decode(source, lay, chunk, lo, hi, most, narrow, ordered=True)
            at = np.cumsum(hi - lo) - (hi - lo)
            row_starts = np.empty(len(starts), dtype=np.int64)
            row_starts[order] = at[first]
            rows = RowSlices(out, row_starts, row_starts + counts)
        else:
            out = _decode(source, lay, chunk, starts, ends, most, narrow)
            rows = RowSlices.of_lengths(out, counts)
    except (Unsupported, Truncated):
        return None
    return rows.narrow() if narrow else rows


def _read_at(source: int | Source, n: int, offset: int) -> memoryview:
    """Bytes [offset, offset + n) of their own (a page outlives the next read)."""
    got = os.pread(source, n, offset) if isinstance(source, int) else source.read_at(n, offset)
    if len(got) != n:
        raise Unsupported("column chunk is truncated")
    return memoryview(got).cast("B")


def _read_page(fd: int, n: int, offset: int) -> memoryview:
    """Bytes [offset, offset + n) of a file, read into this thread's page buffer (valid
    until its next page read): a fresh bytes object per page of a large chunk costs its
    page faults again each time, more than the page's decode."""
    buf = getattr(_scratch, "page", None)
    if buf is None or len(buf) < n:
        buf = _scratch.page = bytearray(max(n, 64 << 10))
    data = memoryview(buf)[:n]
    if os.preadv(fd, [data], offset) != n:
        raise Unsupported("column chunk is truncated")
    return data


def _whole(source: int | Source, chunk: Chunk, most: int = WHOLE_CHUNK) -> memoryview | None:
    """The column chunk (of a file: read into this thread's buffer, valid until its next
    read), or None if it is bigger than `most` bytes: then its pages are read one by one."""
    if chunk.size > most:
        return None
    if not isinstance(source, int):
        return _read_at(source, chunk.size, chunk.start)
    fd = source
    buf = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < chunk.size:
        buf = _scratch.buf = bytearray(max(chunk.size, min(1 << 20, most)))
    data = memoryview(buf)[: chunk.size]
    if os.preadv(fd, [data], chunk.start) != chunk.size:
        raise Unsupported("column chunk is truncated")
    return data


def _decode(
    source,
    lay: Layout,
    chunk: Chunk,
    starts: np.ndarray,
    ends: np.ndarray,
    most: int,
    narrow: bool = False,
    ordered: bool = False,
):
    """The values of ranges [starts, ends) concatenated, reading the pages that hold them
    (and the headers of those before), the whole chunk at once if at most `most` bytes and
    the values asked reach past its first half (`_SHORT`). `narrow`: a dictionary is cast
    to uint16 if its values fit and the values asked are not few beside it. `ordered`: the
    ranges are sorted and disjoint, so each page's values asked are one stretch of the
    output."""
    data = None if _short(chunk, ends) else _whole(source, chunk, most)

    def part(pos: int, n: int, body: bool = False) -> memoryview:
        if pos + n > chunk.size:
            raise Unsupported("page runs past its column chunk")
        if data is not None:
            return data[pos : pos + n]
        if body and isinstance(source, int):
            return _read_page(source, n, chunk.start + pos)
        return _read_at(source, n, chunk.start + pos)

    need = int(ends.max())
    lengths = ends - starts
    placed = np.cumsum(lengths) - lengths  # where each range goes in the output
    out = None
    pos = first = 0  # the page's place in the chunk, and the index of its first value
    dictionary = None
    checked = lay.checked(chunk.row_group)
    while first < need:
        if pos >= chunk.size:
            raise Unsupported("column chunk ends before the values asked")
        known = checked.get(pos)
        if known is not None and not _wanted(starts, ends, first, known[1]):
            pos, first = known[0], first + known[1]  # neither its header nor body is read
            continue
        at = pos
        head = part(pos, min(_HEADER_READ, chunk.size - pos))
        try:
            fields, size = page_fields(head, 0)
        except Truncated:
            head = part(pos, chunk.size - pos)
            fields, size = page_fields(head, 0)
        kind, stored = field_int(fields, 1), field_int(fields, 3)
        if kind == DATA_PAGE_V2:
            n = _skipped(fields, part, pos + size, stored, starts, ends, first, lay.max_def)
            if n is not None:  # no value asked is in this page: its values are not read
                pos += size + stored
                lay.note(chunk.row_group, at, pos, n)
                first += n
                continue
        body = part(pos + size, stored, body=True)  # valid until the next page is read
        pos += size + stored
        if kind == DICTIONARY_PAGE:
            dictionary = _dictionary(fields, body, chunk.codec, lay.dtype)
            if narrow and _NARROW_DICTIONARY * int(lengths.sum()) >= len(dictionary):
                dictionary = narrow_ids(dictionary)
            if chunk.codec is None and dictionary.dtype == lay.dtype:
                dictionary = dictionary.copy()  # not a view of the page's buffer
        elif kind in (DATA_PAGE, DATA_PAGE_V2):
            found = None
            if kind == DATA_PAGE and chunk.codec in _PREFIX_CODECS:
                found = _prefix(fields, body, chunk.codec, lay, starts, ends, first, dictionary)
            if found is None:
                n, encoding, values = _data_page(fields, body, chunk.codec, lay.max_def)
            else:
                n, picked = found  # the values of the ranges in the page, from its prefix
            lay.note(chunk.row_group, at, pos, n)
            lo, hi = np.maximum(starts, first), np.minimum(ends, first + n)
            if first == 0 and n >= need:  # every range in this page: the common case
                if found is not None:
                    return picked
                return _values(encoding, values, starts, ends, dictionary, lay.dtype, n)
            inside = hi > lo
            if inside.any():
                lo, hi = lo[inside], hi[inside]
                if found is not None:
                    got = picked
                else:
                    got = _values(
                        encoding, values, lo - first, hi - first, dictionary, lay.dtype, n
                    )
                if out is None:  # at the values' dtype: uint16 from a dictionary narrowed
                    out = np.empty(int(lengths.sum()), got.dtype)
                elif out.dtype != got.dtype:  # plain pages after a narrowed dictionary's
                    out = out.astype(np.promote_types(out.dtype, got.dtype))
                if ordered:
                    at = int(placed[inside][0] + lo[0] - starts[inside][0])
                    out[at : at + len(got)] = got
                else:
                    out[rle.ranges(placed[inside] + lo - starts[inside], hi - lo)] = got
            first += n
        elif kind != INDEX_PAGE:
            raise Unsupported(f"page type {kind}")
    assert out is not None
    return out


def _short(chunk: Chunk, ends: np.ndarray) -> bool:
    """Whether the values asked all lie in the chunk's first 1/_SHORT: then its pages are
    read one by one up to the last of them, not the whole chunk (a file's first read, of a
    few rows, reads about what it uses; pages after the last value asked are never read)."""
    return int(ends.max()) * _SHORT <= chunk.num_values


def _wanted(starts: np.ndarray, ends: np.ndarray, first: int, n: int) -> bool:
    """Whether any range [starts, ends) holds a value of the page of values [first, first+n)."""
    return bool((np.maximum(starts, first) < np.minimum(ends, first + n)).any())


def _skipped(fields: dict, part, at: int, stored: int, starts, ends, first: int, max_def: int):
    """The levels of a V2 data page none of whose values is asked (None if one is): its
    levels, stored uncompressed before the values, are read and checked (level n must be
    value n), its values are not."""
    head = field_struct(fields, 8)
    n, rep_bytes, def_bytes = field_int(head, 1), field_int(head, 6), field_int(head, 5)
    if _wanted(starts, ends, first, n):
        return None
    if field_int(head, 2) != 0 or rep_bytes + def_bytes > stored:
        raise Unsupported("page holds nulls")
    levels = part(at, rep_bytes + def_bytes)
    if not rle.all_equal(levels[rep_bytes:], max_def.bit_length(), n, max_def):
        raise Unsupported("page holds a null or an empty list")
    return n


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
    if not rle.all_equal(dfn, max_def.bit_length(), n, max_def):
        raise Unsupported("page holds a null or an empty list")
    return n, field_int(head, 4 if field_int(fields, 1) == DATA_PAGE_V2 else 2), values


def _prefix(fields: dict, body, codec: str, lay: Layout, starts, ends, first: int, dictionary):
    """(values in the page, the values of the ranges [starts, ends) within it) of a v1 data
    page decompressed only through the last value asked (through its levels where none is
    asked: they must still all be at the maximum), or None where the whole page is
    decompressed instead: the values asked reach its end, or the prefix does not serve (a
    guess of its length fell short, or anything that does not parse, which the whole page
    then decides). The values picked from a prefix are the whole page's: every byte they
    are read from lies in it, and the decoders check that."""
    head = field_struct(fields, 5)
    n, size, encoding = field_int(head, 1), field_int(fields, 2), field_int(head, 2)
    lo, hi = np.maximum(starts, first), np.minimum(ends, first + n)
    inside = hi > lo
    stop = int(hi[inside].max()) - first if inside.any() else 0
    if stop * _PREFIX_CODECS[codec] >= n or size > _MAX_PAGE:
        return None
    if field_int(head, 3) != RLE or field_int(head, 4) != RLE:
        return None
    if encoding == _PLAIN:
        per_value = None
    elif encoding in (_PLAIN_DICTIONARY, _RLE_DICTIONARY):
        per_value = 0
    else:
        return None

    def need(out) -> int:
        end = levels_end(out)
        if end > size:
            raise Unsupported("level data runs past the page")
        if len(out) < end or not stop:
            return end
        if per_value is None:
            return min(size, end + stop * lay.dtype.itemsize)
        if len(out) == end:
            return end + 1  # the width of the dictionary indices
        # bit-packed runs of 8-value groups, a one-byte header at most every group: enough
        # for what writers make; an RLE run takes fewer bytes, a longer header more (then
        # the picking below finds the prefix short and the whole page is decompressed)
        width = out[end]
        return min(size, end + 1 + -(-stop // 8) * (width + 1) + 16)

    try:
        data = PREFIX_DECODERS[codec](body, need)
        data = data.cast("B") if data.format != "B" else data  # pyarrow's buffers are signed
        _rep, pos = length_prefixed(data, 0)
        dfn, pos = length_prefixed(data, pos)
        if not rle.all_equal(dfn, lay.max_def.bit_length(), n, lay.max_def):
            raise Unsupported("page holds a null or an empty list")
        if not inside.any():
            return n, None
        values = data[pos:]
        picked = _values(
            encoding, values, lo[inside] - first, hi[inside] - first, dictionary, lay.dtype, stop
        )
    except (Unsupported, Truncated):
        return None
    return n, picked


def _values(encoding: int, data: memoryview, starts, ends, dictionary, dtype, n: int):
    """The page's values in ranges [starts, ends) of its `n`, concatenated."""
    if encoding == _PLAIN:
        if len(data) < n * dtype.itemsize:
            raise Unsupported("page shorter than its values")
        return np.frombuffer(data, dtype=dtype, count=n)[rle.ranges(starts, ends - starts)]
    if encoding not in (_PLAIN_DICTIONARY, _RLE_DICTIONARY) or dictionary is None:
        raise Unsupported(f"value encoding {encoding}")
    if not len(data) or data[0] > 32:
        raise Unsupported("bad dictionary index width")
    indices = rle.values(data[1:], data[0], starts, ends)  # unsigned: never below zero
    try:
        return dictionary.take(indices)  # raises on an index past the end
    except IndexError:
        raise Unsupported("dictionary index out of range") from None


def planned_reads(
    lay: Layout, group: int, starts: np.ndarray, ends: np.ndarray, most: int = WHOLE_CHUNK
) -> list[tuple[int, int]]:
    """The byte ranges (file offsets, in order) that `read_rows` of values [starts, ends) of
    row group `group` will read, as far as they can be told before reading: the whole
    chunk where it is read at once; else the pages before the first one an earlier read
    noted (the dictionary), the noted pages (`Layout.checked`) that hold a value asked,
    and from the end of the noted pages on, the share of the rest of the chunk the values
    asked reach (by their count, with a margin). A read object's pages can then be asked
    for together (`object_read_ahead`)."""
    chunk = lay.chunk(group)
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    if chunk is None or not len(ends):
        return []
    base, need = chunk.start, int(ends.max())
    if not _short(chunk, ends) and chunk.size <= most:
        return [(base, base + chunk.size)]
    checked = lay.checked(group)
    out: list[tuple[int, int]] = []
    pos = first = 0
    while first < need and pos < chunk.size:
        known = checked.get(pos)
        if known is None:  # the dictionary page, or the pages after the noted ones
            later = [at for at in checked if at > pos]
            if not later:
                break
            out.append((pos, min(later)))
            pos = min(later)
            continue
        after, n = known
        if _wanted(starts, ends, first, n):  # its header's read may go past a short page
            out.append((pos, min(chunk.size, max(after, pos + _HEADER_READ))))
        pos, first = after, first + n
    if first < need and pos < chunk.size:
        share = (need - first) / max(1, chunk.num_values - first)
        guess = int((chunk.size - pos) * min(1.0, share * 1.125)) + 4 * _HEADER_READ
        out.append((pos, min(chunk.size, pos + guess)))
    return [(base + lo, base + hi) for lo, hi in out]
