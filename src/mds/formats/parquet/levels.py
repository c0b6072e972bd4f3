"""Per-row list lengths of a Parquet column from its pages' repetition/definition levels alone.

Indexing needs token counts at >1 GB/s; a full decode (polars ``list.len()``) must first
materialise every token id."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mds.errors import SourceDataError
from mds.formats.parquet import footer, page_reads, rle
from mds.formats.parquet.compression import PREFIX_DECODERS, decompress, levels_end
from mds.formats.parquet.footer import Chunk
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

__all__ = ["find_column", "lengths", "list_lengths"]

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
class _Page:
    type: int
    header_size: int
    compressed_size: int
    uncompressed_size: int
    num_values: int = 0
    num_rows: int | None = None  # DATA_PAGE_V2 only
    rep_bytes: int = 0  # DATA_PAGE_V2 only
    def_bytes: int = 0  # DATA_PAGE_V2 only


def lengths(
    path: str | os.PathLike,
    column: str,
    meta: pq.FileMetaData | None = None,
    display: str | None = None,
) -> np.ndarray | None:
    """Per-row lengths (int64, -1 for a null list) of the list column `column`, as
    MDS_PAGE_READS says (`page_reads`): `on`, `list_lengths` (None where it declines: the
    caller then decodes the column); `off`, pyarrow's decode; `check`, both where
    `list_lengths` reads the file, compared: SourceDataError naming the file (`display`,
    else `path`) and the first row that differs."""
    setting = page_reads.mode()
    if setting == "off":
        return _pyarrow_lengths(path, column, meta)
    got = list_lengths(path, column, meta)
    if setting == "check" and got is not None:
        want = _pyarrow_lengths(path, column, meta)
        if got.size != want.size or not np.array_equal(got, want):
            n = min(got.size, want.size)
            row = int(np.argmax(got[:n] != want[:n])) if np.any(got[:n] != want[:n]) else n
            if meta is None:
                meta = pq.read_metadata(path)
            ends = np.cumsum([meta.row_group(i).num_rows for i in range(meta.num_row_groups)])
            group = int(np.searchsorted(ends, row, side="right"))
            where = display or os.fspath(path)
            raise page_reads.mismatch(where, group, column, row, "list lengths")
    return got


def _pyarrow_lengths(
    path: str | os.PathLike, column: str, meta: pq.FileMetaData | None
) -> np.ndarray:
    """Per-row lengths of list column `column` (-1 for a null list) from pyarrow's decode of
    it, a row group at a time."""
    parts = []
    with pq.ParquetFile(os.fspath(path), metadata=meta) as parquet:
        for i in range(parquet.num_row_groups):
            lists = parquet.read_row_group(i, columns=[column], use_threads=False).column(0)
            parts.append(pc.list_value_length(lists).fill_null(-1).to_numpy().astype(np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


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
            data_end = footer.data_end(fd)
            if data_end is None:
                return None

            def read(chunk: Chunk) -> np.ndarray:
                return _chunk_lengths(path, fd, data_end, chunk, col)

            if _WORKERS > 1 and len(chunks) > 1:
                with ThreadPoolExecutor(_WORKERS) as pool:
                    parts = list(pool.map(read, chunks))
            else:
                parts = [read(chunk) for chunk in chunks]
    except Unsupported:
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
    leaves = footer.leaves(meta, column)
    if len(leaves) != 1:
        return None
    leaf = meta.schema.column(leaves[0])
    list_def = int(field.nullable)
    element_def = list_def + 1  # the repeated level: the list has this element
    max_def = element_def + int(field.type.value_field.nullable)
    if leaf.max_repetition_level != 1 or leaf.max_definition_level != max_def:
        return None
    return _Column(leaves[0], list_def, max_def)


def _chunks(meta: pq.FileMetaData, col: _Column) -> list[Chunk]:
    chunks = []
    for i in range(meta.num_row_groups):
        chunk = footer.chunk(meta, i, col.index)
        if chunk is None:
            raise Unsupported("column chunk in another file or with a codec not read here")
        chunks.append(chunk)
    return chunks


def _chunk_lengths(path: str, fd: int, data_end: int, chunk: Chunk, col: _Column):
    where = f"{path}: row group {chunk.row_group}"
    if chunk.num_rows == 0 and chunk.num_values == 0:
        return np.zeros(0, np.int64)  # writers leave its offsets at 0
    if chunk.start < 4 or chunk.size < 0 or chunk.start + chunk.size > data_end:
        raise SourceDataError(f"{where}: column chunk runs past the data (truncated file?)")
    reader = ChunkReader(fd, chunk.start, chunk.size, where)
    levels = _chunk_levels(reader, chunk.codec, col.max_def, col.list_def)
    if levels.size != chunk.num_values:
        raise Unsupported("level count differs from the column chunk's num_values")
    lengths = _lengths(levels, col.list_def)
    if lengths.size != chunk.num_rows:
        raise Unsupported("row count differs from the row group's num_rows")
    return lengths


class ChunkReader:
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

    def __init__(self, reader: ChunkReader, pos: int, size: int, head: bytes) -> None:
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


def _chunk_levels(reader: ChunkReader, codec: str | None, max_def: int, list_def: int) -> _Levels:
    """Row starts and their definition levels over all data pages of one column chunk."""
    pages = _Pages()
    pos = 0
    while pos < reader.size:
        head = reader.read(pos, _READ_AHEAD)
        while True:
            try:
                page = _page_header(memoryview(head), 0)
                break
            except Truncated:
                if pos + len(head) >= reader.size:
                    raise Unsupported("page header runs past the column chunk") from None
                head = reader.read(pos, 2 * len(head))
        body_start = pos + page.header_size
        pos = body_start + page.compressed_size
        if pos > reader.size:
            # Old parquet-mr left the dictionary header out of total_compressed_size
            # (PARQUET-816); a truncated file was already caught against the footer.
            raise Unsupported("page runs past the column chunk")
        if page.type in (DICTIONARY_PAGE, INDEX_PAGE):
            continue
        body = _Body(reader, body_start, page.compressed_size, head[page.header_size :])
        if page.type == DATA_PAGE:
            pages.add(page, *_v1_levels(body, page, codec))
        elif page.type == DATA_PAGE_V2:
            pages.add(page, *_v2_levels(body, page))
        else:
            raise Unsupported(f"page type {page.type}")
    return pages.levels(max_def, list_def)


def _v1_levels(body: _Body, page: _Page, codec: str | None) -> tuple[memoryview, memoryview]:
    """DATA_PAGE: the whole page is compressed; each level run is prefixed by its length.

    Only the start of the page is decompressed, as far as the levels go; when that fails
    for any reason the whole page is, which then decides."""
    if codec is None and page.compressed_size != page.uncompressed_size:
        raise Unsupported("page size differs from its header")
    data = None
    decode = PREFIX_DECODERS.get(codec)
    if decode is not None:
        try:
            data = _read_prefix(body, decode, page.uncompressed_size)
        except Unsupported:
            pass
    if data is None:
        data = _decompress(body.load(body.size), page, codec)
    rep, pos = length_prefixed(data, 0)
    dfn, _ = length_prefixed(data, pos)
    return rep, dfn


def _decompress(body: bytes, page: _Page, codec: str | None) -> memoryview:
    """The whole page, decompressed."""
    return decompress(body, page.uncompressed_size, codec)


def _read_prefix(body: _Body, decode, page_size: int) -> memoryview:
    """The start of the decompressed page through its level data, reading more of the body
    while the decoder runs out of input."""

    def need(out) -> int:
        end = levels_end(out)
        if end > page_size:
            raise Unsupported("level data runs past the page")
        return end

    while True:
        try:
            return decode(body.data, need)
        except Truncated:
            if body.complete:
                raise Unsupported("compressed page ends before its level data") from None
            body.load(2 * max(len(body.data), _READ_AHEAD))


def _v2_levels(body: _Body, page: _Page) -> tuple[memoryview, memoryview]:
    """DATA_PAGE_V2: levels come first, never compressed, lengths given in the header."""
    split, end = page.rep_bytes, page.rep_bytes + page.def_bytes
    if end > body.size:
        raise Unsupported("level data runs past the page")
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
        rep = rle.decode_pages(
            np.frombuffer(self.rep, np.uint8), np.array(self.rep_ends), values, 1
        )
        dfn = rle.decode_pages(
            np.frombuffer(self.dfn, np.uint8), np.array(self.def_ends), values, max_def
        )
        starts = rep.positions_of(0)
        page_starts = np.concatenate([[0], np.cumsum(values)])
        rows = np.diff(np.searchsorted(starts, page_starts))
        claimed = np.array(self.num_rows, np.int64)
        if np.any((claimed >= 0) & (claimed != rows)):
            raise Unsupported("DATA_PAGE_V2 num_rows differs from its levels")
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
        raise Unsupported("column chunk does not start a row")
    lengths = np.diff(starts, append=levels.size)
    no_element = head <= list_def  # a null or an empty list: exactly one level, no element
    if levels.no_element != np.count_nonzero(no_element):
        raise Unsupported("a list continues with a null or empty-list level")
    if np.any(lengths[no_element] != 1):
        raise Unsupported("a null or empty list spans several levels")
    lengths[head == list_def] = 0
    lengths[head < list_def] = -1
    return lengths


# --- Page headers (the Thrift parser is parquet_thrift's) ---


def _page_header(buf: memoryview, pos: int) -> _Page:
    """Parse the PageHeader at `pos`; of its structs only data_page_header(_v2) are read."""
    fields, size = page_fields(buf, pos)
    kind = field_int(fields, 1)
    base = {
        "type": kind,
        "header_size": size,
        "uncompressed_size": field_int(fields, 2),
        "compressed_size": field_int(fields, 3),
    }
    if kind == DATA_PAGE:
        head = field_struct(fields, 5)
        # BIT_PACKED (deprecated) or an unknown level encoding.
        if field_int(head, 3) != RLE or field_int(head, 4) != RLE:
            raise Unsupported("level encoding is not RLE")
        return _Page(**base, num_values=field_int(head, 1))
    if kind == DATA_PAGE_V2:
        head = field_struct(fields, 8)
        return _Page(
            **base,
            num_values=field_int(head, 1),
            num_rows=field_int(head, 3),
            def_bytes=field_int(head, 5),
            rep_bytes=field_int(head, 6),
        )
    return _Page(**base)
