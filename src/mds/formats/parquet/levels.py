"""Per-row list lengths of a Parquet column from its pages' repetition/definition levels alone.

Indexing needs token counts at >1 GB/s; a full decode (polars ``list.len()``) must first
materialise every token id."""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from mds.errors import SourceDataError
from mds.formats.parquet.thrift import CODECS as _CODECS
from mds.formats.parquet.thrift import DATA_PAGE as _DATA_PAGE
from mds.formats.parquet.thrift import DATA_PAGE_V2 as _DATA_PAGE_V2
from mds.formats.parquet.thrift import DICTIONARY_PAGE as _DICTIONARY_PAGE
from mds.formats.parquet.thrift import INDEX_PAGE as _INDEX_PAGE
from mds.formats.parquet.thrift import RLE as _RLE
from mds.formats.parquet.thrift import Truncated as _Truncated
from mds.formats.parquet.thrift import Unsupported as _Unsupported
from mds.formats.parquet.thrift import decompress, length_prefixed, page_fields, ranges
from mds.formats.parquet.thrift import field_int as _field_int
from mds.formats.parquet.thrift import field_struct as _field_struct

__all__ = ["find_column", "list_lengths"]

_MAX_VARINT = 5  # a 32-bit ULEB128 varint, the run headers of the RLE/bit-packed hybrid
_WORKERS = min(2, os.cpu_count() or 1)
# First read at each page: its header and, mostly, all the compressed level data it holds.
_READ_AHEAD = 1 << 15
# Below this many levels per row (on a column big enough to matter) level runs are nearly as
# many as the values, and a full decode in native code is at least as fast as this path.
_DENSE_MEAN_LEVELS = 16
_DENSE_MIN_LEVELS = 1 << 22


@dataclass(frozen=True)
class _Column:
    """Where the leaf of the list column is and how its definition levels read."""

    index: int
    list_def: int  # definition level of a present but empty list; below it the list is null
    max_def: int


@dataclass(frozen=True)
class _Chunk:
    """One row group's column chunk of the list column: its bytes and what it must hold."""

    row_group: int
    start: int
    size: int
    codec: str | None
    num_values: int
    num_rows: int


@dataclass(frozen=True)
class _Page:
    type: int
    header_size: int
    compressed_size: int
    uncompressed_size: int
    num_values: int = 0
    num_rows: int | None = None  # DATA_PAGE_V2 only
    rep_bytes: int = 0  # DATA_PAGE_V2 only
    def_bytes: int = 0  # DATA_PAGE_V2 only


def list_lengths(
    path: str | os.PathLike, column: str, meta: pq.FileMetaData | None = None
) -> np.ndarray | None:
    """Per-row lengths (int64) of the list column `column`, decoded from page levels only.

    Returns None when the file uses a feature this fast path does not handle (the caller then
    falls back to a full decode); never returns wrong numbers. Null lists are reported as -1.
    Large columns of very short lists (< 16 levels per row) also return None: there a full
    decode is as fast.
    """
    path = os.fspath(path)
    if meta is None:  # else the caller's parse of the file's footer
        with pq.ParquetFile(path) as parquet:
            meta = parquet.metadata
    col = find_column(meta, column)
    if col is None:
        return None
    try:
        chunks = _chunks(meta, col)
        levels = sum(c.num_values for c in chunks)
        if levels > _DENSE_MIN_LEVELS and levels < _DENSE_MEAN_LEVELS * meta.num_rows:
            return None  # short lists: the runs are as many as the values; decoding them wins
        with open(path, "rb") as fh:
            fd = fh.fileno()
            data_end = _data_end(fd)
            if data_end is None:
                return None

            def read(chunk: _Chunk) -> np.ndarray:
                return _chunk_lengths(path, fd, data_end, chunk, col)

            if _WORKERS > 1 and len(chunks) > 1:
                with ThreadPoolExecutor(_WORKERS) as pool:
                    parts = list(pool.map(read, chunks))
            else:
                parts = [read(chunk) for chunk in chunks]
    except _Unsupported:
        return None
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def find_column(meta: pq.FileMetaData, column: str) -> _Column | None:
    """The leaf of a top-level list<integer> column, or None if `column` is anything else."""
    # Converting without the stored ARROW:schema gives nullability straight from the
    # Parquet schema, so it always agrees with the definition levels.
    try:
        arrow = meta.schema.to_arrow_schema()
    except pa.ArrowException:
        return None
    index = arrow.get_field_index(column)
    if index < 0:
        return None
    field = arrow.field(index)
    if not (pa.types.is_list(field.type) or pa.types.is_large_list(field.type)):
        return None
    if not pa.types.is_integer(field.type.value_type):
        return None
    leaves = [
        i
        for i in range(meta.num_columns)
        if (p := meta.schema.column(i).path) == column or p.startswith(column + ".")
    ]
    if len(leaves) != 1:
        return None
    leaf = meta.schema.column(leaves[0])
    list_def = int(field.nullable)
    element_def = list_def + 1  # the repeated level: the list has this element
    max_def = element_def + int(field.type.value_field.nullable)
    if leaf.max_repetition_level != 1 or leaf.max_definition_level != max_def:
        return None
    return _Column(leaves[0], list_def, max_def)


def _data_end(fd: int) -> int | None:
    """Offset where the footer starts (column chunks must end before it)."""
    size = os.fstat(fd).st_size
    tail = os.pread(fd, 8, size - 8) if size >= 12 else b""
    if len(tail) != 8 or tail[4:] != b"PAR1":
        return None
    return size - 8 - int.from_bytes(tail[:4], "little")


def _chunks(meta: pq.FileMetaData, col: _Column) -> list[_Chunk]:
    chunks = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        chunk = rg.column(col.index)
        if chunk.file_path or chunk.compression not in _CODECS:
            raise _Unsupported(f"column chunk in another file or codec {chunk.compression}")
        start = chunk.data_page_offset
        dict_offset = chunk.dictionary_page_offset
        if dict_offset is not None and 0 < dict_offset < start:
            start = dict_offset
        chunks.append(
            _Chunk(
                row_group=i,
                start=start,
                size=chunk.total_compressed_size,
                codec=_CODECS[chunk.compression],
                num_values=chunk.num_values,
                num_rows=rg.num_rows,
            )
        )
    return chunks


def _chunk_lengths(path: str, fd: int, data_end: int, chunk: _Chunk, col: _Column):
    where = f"{path}: row group {chunk.row_group}"
    if chunk.num_rows == 0 and chunk.num_values == 0:
        return np.zeros(0, np.int64)  # writers leave its offsets at 0
    if chunk.start < 4 or chunk.size < 0 or chunk.start + chunk.size > data_end:
        raise SourceDataError(f"{where}: column chunk runs past the data (truncated file?)")
    reader = _ChunkReader(fd, chunk.start, chunk.size, where)
    levels = _chunk_levels(reader, chunk.codec, col.max_def, col.list_def)
    if levels.size != chunk.num_values:
        raise _Unsupported("level count differs from the column chunk's num_values")
    lengths = _lengths(levels, col.list_def)
    if lengths.size != chunk.num_rows:
        raise _Unsupported("row count differs from the row group's num_rows")
    return lengths


class _ChunkReader:
    """Reads parts of one column chunk: only page headers and level data are needed, a few
    KB of each ~1 MB page, so the chunk is never read whole."""

    def __init__(self, fd: int, start: int, size: int, where: str) -> None:
        self.fd, self.start, self.size, self.where = fd, start, size, where

    def read(self, pos: int, n: int) -> bytes:
        """Bytes [pos, pos + n) of the chunk, fewer where the chunk ends first."""
        n = max(0, min(n, self.size - pos))
        data = os.pread(self.fd, n, self.start + pos)
        if len(data) != n:
            raise SourceDataError(f"{self.where}: column chunk is truncated")
        return data


class _Body:
    """A page's (compressed) body, read from the file only as far as it is needed."""

    def __init__(self, reader: _ChunkReader, pos: int, size: int, head: bytes) -> None:
        self.reader, self.pos, self.size = reader, pos, size
        self.data = head[:size]  # what has been read so far, from the start of the body

    @property
    def complete(self) -> bool:
        return len(self.data) == self.size

    def load(self, n: int) -> bytes:
        """At least the first n bytes (all of a shorter body)."""
        n = min(n, self.size)
        if len(self.data) < n:
            self.data = self.reader.read(self.pos, n)
        return self.data


def _chunk_levels(reader: _ChunkReader, codec: str | None, max_def: int, list_def: int) -> _Levels:
    """Row starts and their definition levels over all data pages of one column chunk."""
    pages = _Pages()
    pos = 0
    while pos < reader.size:
        head = reader.read(pos, _READ_AHEAD)
        while True:
            try:
                page = _page_header(memoryview(head), 0)
                break
            except _Truncated:
                if pos + len(head) >= reader.size:
                    raise _Unsupported("page header runs past the column chunk") from None
                head = reader.read(pos, 2 * len(head))
        body_start = pos + page.header_size
        pos = body_start + page.compressed_size
        if pos > reader.size:
            # Old parquet-mr left the dictionary header out of total_compressed_size
            # (PARQUET-816); a truncated file was already caught against the footer.
            raise _Unsupported("page runs past the column chunk")
        if page.type in (_DICTIONARY_PAGE, _INDEX_PAGE):
            continue
        body = _Body(reader, body_start, page.compressed_size, head[page.header_size :])
        if page.type == _DATA_PAGE:
            pages.add(page, *_v1_levels(body, page, codec))
        elif page.type == _DATA_PAGE_V2:
            pages.add(page, *_v2_levels(body, page))
        else:
            raise _Unsupported(f"page type {page.type}")
    return pages.levels(max_def, list_def)


def _v1_levels(body: _Body, page: _Page, codec: str | None) -> tuple[memoryview, memoryview]:
    """DATA_PAGE: the whole page is compressed; each level run is prefixed by its length.

    Only the start of the page is decompressed, as far as the levels go; when that fails
    for any reason the whole page is, which then decides."""
    if codec is None and page.compressed_size != page.uncompressed_size:
        raise _Unsupported("page size differs from its header")
    data = None
    decode = _PREFIX_DECODERS.get(codec)
    if decode is not None:
        try:
            data = _read_prefix(body, decode, page.uncompressed_size)
        except _Unsupported:
            pass
    if data is None:
        data = _decompress(body.load(body.size), page, codec)
    rep, pos = length_prefixed(data, 0)
    dfn, _ = length_prefixed(data, pos)
    return rep, dfn


def _decompress(body: bytes, page: _Page, codec: str | None) -> memoryview:
    """The whole page, decompressed."""
    return decompress(body, page.uncompressed_size, codec)


def _levels_end(out) -> int:
    """Bytes the level sections of a v1 page take, as far as `out` (its start) tells."""
    if len(out) < 4:
        return 4
    rep_end = 8 + int.from_bytes(out[:4], "little")
    if len(out) < rep_end:
        return rep_end
    return rep_end + int.from_bytes(out[rep_end - 4 : rep_end], "little")


def _read_prefix(body: _Body, decode, page_size: int) -> memoryview:
    """The start of the decompressed page through its level data, reading more of the body
    while the decoder runs out of input."""

    def need(out) -> int:
        end = _levels_end(out)
        if end > page_size:
            raise _Unsupported("level data runs past the page")
        return end

    while True:
        try:
            return decode(body.data, need)
        except _Truncated:
            if body.complete:
                raise _Unsupported("compressed page ends before its level data") from None
            body.load(2 * max(len(body.data), _READ_AHEAD))


# Each prefix decoder takes the start of a page body and `need`, which maps the output so
# far to the number of output bytes wanted (it only grows); it returns at least that many,
# raises _Truncated if the input ran out first and _Unsupported for anything else.


def _plain_prefix(src: bytes, need) -> memoryview:
    if len(src) < need(src):
        raise _Truncated
    return memoryview(src)


def _snappy_tables() -> list[tuple[int, int]]:
    """Per snappy tag byte: the bytes its element takes and the bytes it outputs; (0, 0) for
    the literals whose length follows the tag."""
    table = []
    for tag in range(256):
        kind, high = tag & 3, tag >> 2
        if kind == 0:  # literal of high + 1 bytes, or of a length in high - 59 more bytes
            table.append((2 + high, high + 1) if high < 60 else (0, 0))
        else:  # copy with a 1-, 2- or 4-byte offset
            table.append(((0, 2, 3, 5)[kind], 4 + (high & 7) if kind == 1 else high + 1))
    return table


_SNAPPY_TAGS = _snappy_tables()
_SNAPPY_LONGEST = 61  # bytes of the longest element whose length is in its tag


def _snappy_prefix(src: bytes, need) -> memoryview:
    """The start of a raw snappy stream (format_description.txt in google/snappy).

    The elements are parsed here (a Python loop over bytes is cheaper than numpy for the few
    thousand elements of a page's levels), stopping at the first element that reaches
    `need`; pyarrow then decompresses just those, re-framed as a stream of that length.
    It does the copies (overlapping ones too) and rejects offsets of 0 or past the output,
    so a corrupt stream cannot return wrong bytes. A literal that runs past `src` is taken
    as far as it goes.
    """
    total, pos = _uvarint(src)
    base, made, wanted, size = pos, 0, need(_snappy_head(src, pos)), len(src)
    tags, safe = _SNAPPY_TAGS, size - _SNAPPY_LONGEST  # before `safe` no bounds to check
    while True:
        if wanted > total:
            raise _Unsupported("snappy stream shorter than the level data")
        cut = -1  # where the literal that runs past `src` starts
        while made < wanted:
            if pos < safe:
                taken, out_bytes = tags[src[pos]]
                if taken:
                    pos += taken
                    made += out_bytes
                    continue
            if pos >= size:
                raise _Truncated
            tag = src[pos]
            taken, length = tags[tag]
            if taken:
                if pos + taken <= size:
                    pos += taken
                    made += length
                    continue
                if tag & 3:
                    raise _Truncated
                start = pos + 1
            else:
                start = pos + (tag >> 2) - 58  # the tag, then (tag >> 2) - 59 length bytes
                if start > size:
                    raise _Truncated
                length = int.from_bytes(src[pos + 1 : start], "little") + 1
                if start + length <= size:
                    pos = start + length
                    made += length
                    continue
            if made + length > total:
                raise _Unsupported("snappy literal past the stream's length")
            cut = start
            break
        if made > total:
            raise _Unsupported("snappy elements past the stream's length")
        out = _snappy_elements(src[base:pos], made)
        if cut >= 0:
            out = memoryview(bytes(out) + src[cut:])
        wanted = need(out)
        if len(out) >= wanted:
            return out
        if cut >= 0:
            raise _Truncated


def _snappy_head(src: bytes, pos: int) -> bytes:
    """The bytes of the literal at `pos` (as far as `src` goes), if one is there: the start
    of the output, which often tells `need` enough without decompressing anything."""
    if pos >= len(src) or src[pos] & 3:
        return b""
    high = src[pos] >> 2
    if high < 60:
        return src[pos + 1 : pos + 2 + high]
    start = pos + high - 58
    return src[start : start + int.from_bytes(src[pos + 1 : start], "little") + 1]


def _snappy_elements(elements: bytes, size: int) -> memoryview:
    """Decompress whole snappy elements that output `size` bytes."""
    if size == 0:
        return memoryview(b"")
    stream = _uvarint_bytes(size) + elements
    try:
        return memoryview(pa.decompress(stream, decompressed_size=size, codec="snappy"))
    except (pa.ArrowException, OSError) as exc:  # pyarrow raises a plain OSError for these
        raise _Unsupported(f"corrupt snappy data: {exc}") from None


def _uvarint(src: bytes) -> tuple[int, int]:
    """A 32-bit ULEB128 varint at the start of `src` and its length."""
    value = shift = 0
    for pos in range(min(len(src), _MAX_VARINT)):
        byte = src[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if value >> 32:
                raise _Unsupported("varint too large")
            return value, pos + 1
        shift += 7
    if len(src) < _MAX_VARINT:
        raise _Truncated
    raise _Unsupported("varint too long")


def _uvarint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _zstd_prefix(src: bytes, need) -> memoryview:
    out = b""
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(src)
        while len(out) < (wanted := need(out)):
            piece = reader.read(wanted - len(out))
            if not piece:
                raise _Truncated  # or the frame ended: then the whole page decides
            out += piece
    except zstandard.ZstdError as exc:
        raise _Unsupported(f"corrupt zstd data: {exc}") from None
    return memoryview(out)


def _gzip_prefix(src: bytes, need) -> memoryview:
    out, pending = b"", src
    stream = zlib.decompressobj(wbits=47)  # a gzip or zlib header, as pyarrow accepts
    try:
        while len(out) < (wanted := need(out)):
            piece = stream.decompress(pending, wanted - len(out))
            if not piece and len(stream.unconsumed_tail) >= len(pending):
                if stream.eof:
                    raise _Unsupported("gzip stream ends before the level data")
                raise _Truncated
            pending = stream.unconsumed_tail
            out += piece
    except (zlib.error, EOFError) as exc:
        raise _Unsupported(f"corrupt gzip data: {exc}") from None
    return memoryview(out)


# Codecs whose pages can be decompressed partway; the others are decompressed whole.
_PREFIX_DECODERS = {
    None: _plain_prefix,
    "snappy": _snappy_prefix,
    "zstd": _zstd_prefix,
    "gzip": _gzip_prefix,
}


def _v2_levels(body: _Body, page: _Page) -> tuple[memoryview, memoryview]:
    """DATA_PAGE_V2: levels come first, never compressed, lengths given in the header."""
    split, end = page.rep_bytes, page.rep_bytes + page.def_bytes
    if end > body.size:
        raise _Unsupported("level data runs past the page")
    data = memoryview(body.load(end))
    return data[:split], data[split:end]


class _Pages:
    """The level data of a column chunk's pages, gathered to be decoded in one go."""

    def __init__(self) -> None:
        self.rep, self.dfn = bytearray(), bytearray()
        self.rep_ends: list[int] = []
        self.def_ends: list[int] = []
        self.num_values: list[int] = []
        self.num_rows: list[int] = []  # -1 for DATA_PAGE, which does not say

    def add(self, page: _Page, rep: memoryview, dfn: memoryview) -> None:
        self.rep += rep
        self.dfn += dfn
        self.rep_ends.append(len(self.rep))
        self.def_ends.append(len(self.dfn))
        self.num_values.append(page.num_values)
        self.num_rows.append(-1 if page.num_rows is None else page.num_rows)

    def levels(self, max_def: int, list_def: int) -> _Levels:
        values = np.array(self.num_values, np.int64)
        rep = _hybrid(np.frombuffer(self.rep, np.uint8), np.array(self.rep_ends), values, 1)
        dfn = _hybrid(np.frombuffer(self.dfn, np.uint8), np.array(self.def_ends), values, max_def)
        starts = rep.positions_of(0)
        page_starts = np.concatenate([[0], np.cumsum(values)])
        rows = np.diff(np.searchsorted(starts, page_starts))
        claimed = np.array(self.num_rows, np.int64)
        if np.any((claimed >= 0) & (claimed != rows)):
            raise _Unsupported("DATA_PAGE_V2 num_rows differs from its levels")
        return _Levels(starts, dfn.at(starts), rep.size, dfn.count_at_most(list_def))


@dataclass(frozen=True)
class _Levels:
    """What row lengths need from a level stream: where rows start and their def levels."""

    starts: np.ndarray  # level index of each repetition level 0
    heads: np.ndarray  # definition level at each start
    size: int  # number of levels
    no_element: int  # number of levels that hold no list element (null or empty list)


def _lengths(levels: _Levels, list_def: int) -> np.ndarray:
    """Row lengths from levels: a row starts at each repetition level 0."""
    starts, head = levels.starts, levels.heads
    if levels.size == 0:
        return np.zeros(0, np.int64)
    if starts.size == 0 or starts[0] != 0:
        raise _Unsupported("column chunk does not start a row")
    lengths = np.diff(starts, append=levels.size)
    no_element = head <= list_def  # a null or an empty list: exactly one level, no element
    if levels.no_element != np.count_nonzero(no_element):
        raise _Unsupported("a list continues with a null or empty-list level")
    if np.any(lengths[no_element] != 1):
        raise _Unsupported("a null or empty list spans several levels")
    lengths[head == list_def] = 0
    lengths[head < list_def] = -1
    return lengths


# --- RLE/bit-packed hybrid (Parquet "Encodings": Run Length Encoding / Bit-Packing Hybrid) ---


@dataclass(frozen=True)
class _Runs:
    """A decoded level stream kept as runs, so long RLE runs cost nothing per level."""

    start: np.ndarray  # level index of each run's first value
    end: np.ndarray  # level index just past each run
    value: np.ndarray  # the RLE run's value, -1 for a bit-packed run
    packed_start: np.ndarray  # index into `packed` of a bit-packed run's first value
    packed: np.ndarray  # the values of all bit-packed runs, in order
    size: int

    def positions_of(self, level: int) -> np.ndarray:
        rle = self.value == level
        in_rle = ranges(self.start[rle], self.end[rle] - self.start[rle])
        hits = np.flatnonzero(self.packed == level)  # indices into `packed`
        if not hits.size:
            return in_rle
        bp = np.flatnonzero(self.value < 0)
        run = bp[np.searchsorted(self.packed_start[bp], hits, side="right") - 1]
        in_bp = self.start[run] + hits - self.packed_start[run]
        return np.sort(np.concatenate([in_rle, in_bp]), kind="stable")  # merges two sorted runs

    def at(self, positions: np.ndarray) -> np.ndarray:
        run = np.searchsorted(self.end, positions, side="right")
        values = self.value[run]
        bp = values < 0
        if bp.any():
            r = run[bp]
            values[bp] = self.packed[self.packed_start[r] + positions[bp] - self.start[r]]
        return values

    def count_at_most(self, level: int) -> int:
        rle = (self.value >= 0) & (self.value <= level)
        in_rle = int((self.end[rle] - self.start[rle]).sum())
        return in_rle + int(np.count_nonzero(self.packed <= level))


def _hybrid(data: np.ndarray, section_ends: np.ndarray, counts: np.ndarray, max_level: int):
    """Decode consecutive RLE/bit-packed hybrid sections (one per page, no length prefix).

    Section i ends at byte section_ends[i] and holds counts[i] levels; levels are numbered
    across sections. Every run must lie inside its section.
    """
    width = max_level.bit_length()
    starts, header_len, header, clean = _runs(data, width)
    if not clean:
        raise _Unsupported("level data overruns its page")
    if np.any(_find(starts, section_ends[section_ends < data.size]) < 0):
        raise _Unsupported("a run crosses a page boundary")
    packed = (header & 1) == 1
    groups_or_count = header >> 1
    run_counts = np.where(packed, groups_or_count * 8, groups_or_count)
    section = np.searchsorted(section_ends, starts, side="right")
    excess = np.bincount(section, run_counts, minlength=counts.size)[: counts.size]
    excess = excess.astype(np.int64) - counts
    last = np.searchsorted(section, np.flatnonzero(excess), side="right") - 1
    # Only the last bit-packed group of a page may be padded past the page's values.
    if np.any(excess < 0) or np.any(excess[excess > 0] >= 8) or not np.all(packed[last]):
        raise _Unsupported("level count differs from the page's num_values")
    trimmed = run_counts.copy()
    trimmed[last] -= excess[excess > 0]
    payload = starts + header_len
    value = np.full(starts.size, -1, np.int16)
    value[~packed] = _rle_values(data, payload[~packed], width)
    values = _unpack(_slices(data, payload[packed], groups_or_count[packed] * width), width)
    padding_end = np.cumsum(np.where(packed, run_counts, 0))[last]
    values = np.delete(values, ranges(padding_end - excess[excess > 0], excess[excess > 0]))
    kept = np.where(packed, trimmed, 0)
    if max(int(value.max(initial=0)), int(values.max(initial=0))) > max_level:
        raise _Unsupported("level above the column's maximum")
    end = np.cumsum(trimmed)
    return _Runs(
        start=end - trimmed,
        end=end,
        value=value,
        packed_start=np.cumsum(kept) - kept,
        packed=values,
        size=int(counts.sum()),
    )


def _runs(data: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Start offset, header length and header of every run, and whether the last run ends
    exactly at the end of `data`; without a Python loop per run.

    Reading a header as if one began at every byte gives each byte's successor; the runs are
    the chain of successors from byte 0. Parses that start at a wrong byte nearly always join
    that chain within a few runs, so the bytes reachable in 8 steps are the runs plus a few
    strays. Those bytes, in order, fall into stretches that follow each other; linking the
    stretches (pointer doubling, log2 rounds) keeps the ones on the chain from byte 0.
    """
    n = data.size
    if n == 0:
        return (np.zeros(0, np.int64),) * 3 + (True,)
    header, length = _varints(data)
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
    return chain, length[chain], header[chain], bool(succ[chain[-1]] == n)


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
    taken[_chain(jump, count)] = True
    return taken[stretch]


def _chain(jump: np.ndarray, end: int) -> np.ndarray:
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


def _varints(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ULEB128 value and byte length of a varint starting at each byte (length 0: invalid)."""
    # Masks multiply instead of indexing: random masks make np.where and boolean indexing slow.
    n = data.size
    padded = np.concatenate([data, np.zeros(_MAX_VARINT, np.uint8)])
    value = (padded[:n] & 0x7F).astype(np.int64)
    length = np.ones(n, np.uint8)
    more = padded[:n] >= 0x80
    for i in range(1, _MAX_VARINT):
        if not more.any():
            break
        byte = padded[i : n + i]
        value |= ((byte & 0x7F) * more.view(np.uint8)).astype(np.int64) << (7 * i)
        length += more.view(np.uint8)
        more &= byte >= 0x80
    length[more] = 0
    return value, length


def _rle_values(data: np.ndarray, payload: np.ndarray, width: int) -> np.ndarray:
    """The repeated value of RLE runs: ceil(width / 8) little-endian bytes."""
    values = np.zeros(payload.size, np.int64)
    for i in range((width + 7) // 8):
        values |= data[payload + i].astype(np.int64) << (8 * i)
    if np.any(values > 255):
        raise _Unsupported("level does not fit a byte")
    return values


def _unpack(packed: np.ndarray, width: int) -> np.ndarray:
    """Bit-packed values, least significant bit first, `width` bits each."""
    bits = np.unpackbits(packed, bitorder="little")
    if width == 1:
        return bits
    if width > 8:
        raise _Unsupported("level wider than a byte")
    weights = (1 << np.arange(width)).astype(np.uint8)
    return bits.reshape(-1, width) @ weights


def _slices(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of data[s : s + n] for each (s, n); the slices must not overlap."""
    keep = lengths > 0
    edges = np.zeros(data.size + 1, np.int8)
    edges[starts[keep]] = 1
    edges[starts[keep] + lengths[keep]] -= 1
    return data[np.cumsum(edges[:-1], dtype=np.int8).view(bool)]


# --- Page headers (the Thrift parser is parquet_thrift's) ---


def _page_header(buf: memoryview, pos: int) -> _Page:
    """Parse the PageHeader at `pos`; of its structs only data_page_header(_v2) are read."""
    fields, size = page_fields(buf, pos)
    kind = _field_int(fields, 1)
    base = {
        "type": kind,
        "header_size": size,
        "uncompressed_size": _field_int(fields, 2),
        "compressed_size": _field_int(fields, 3),
    }
    if kind == _DATA_PAGE:
        head = _field_struct(fields, 5)
        # BIT_PACKED (deprecated) or an unknown level encoding.
        if _field_int(head, 3) != _RLE or _field_int(head, 4) != _RLE:
            raise _Unsupported("level encoding is not RLE")
        return _Page(**base, num_values=_field_int(head, 1))
    if kind == _DATA_PAGE_V2:
        head = _field_struct(fields, 8)
        return _Page(
            **base,
            num_values=_field_int(head, 1),
            num_rows=_field_int(head, 3),
            def_bytes=_field_int(head, 5),
            rep_bytes=_field_int(head, 6),
        )
    return _Page(**base)
