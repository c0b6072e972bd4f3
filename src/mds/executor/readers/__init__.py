"""Fetch sample payloads from one source file by location: random access for training.

One reader per open file, for the five source formats of the index (`open_reader`). Requests
come in any order, repeats allowed; each reader groups them by the unit it decodes (Parquet
row group, Arrow record batch, zstd frame) so one call decodes each unit at most once, and
keeps decoded units in the shared `blocks` cache. Every problem with the data raises
SourceDataError naming the file (as `display`) and the row or line. A reader, like the
cache, serves one thread at a time.

Of an object (s3://, gs://) every format is read by byte ranges (ranges.RangeFile): a
reader says which spans a fetch will need (`spans`), the catalog fetches every object's
spans together, and the reader decodes from those bytes as it would from a file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow._parquet as _pq
import pyarrow.parquet as pq

from mds.core import metacache, storage
from mds.core import object_ranges as ranges
from mds.core.index_manifest import FORMATS, PAYLOAD_KINDS
from mds.core.lru import LRU, version_key
from mds.errors import SourceDataError
from mds.formats import arrow_ipc as ipc_ranges
from mds.formats import megatron
from mds.formats.parquet import pages as parquet_pages
from mds.formats.zstd_frames import ZstdSeekFile

__all__ = ["FORMATS", "PAYLOAD_KINDS", "FileReader", "open_reader"]


Payload = np.ndarray | str
Handle = int | ranges.RangeFile | Path


class FileReader(Protocol):
    """Payloads of one file: `fetch` returns them in request order; `close` frees the file.

    Of an object, `object` is its RangeFile and `spans` the byte spans a `fetch` of the same
    rows would read that are not cached: fetched together with the other objects' spans
    (ranges.prefetch) before the fetch. For a file, `object` is None.
    """

    object: ranges.RangeFile | None

    def spans(
        self, file_rows: np.ndarray, offsets: np.ndarray | None, lengths: np.ndarray | None
    ) -> list[tuple[int, int]]: ...

    def fetch(
        self, file_rows: np.ndarray, offsets: np.ndarray | None, lengths: np.ndarray | None
    ) -> list[Payload]: ...

    def handles(self) -> list[tuple[int, Handle]]: ...

    def close(self) -> None: ...


class _Reader:
    """What every reader has: a file reader reads nothing ahead (`spans` is empty)."""

    object: ranges.RangeFile | None = None

    def spans(self, file_rows, offsets=None, lengths=None) -> list[tuple[int, int]]:
        return []

    def handles(self) -> list[tuple[int, Handle]]:
        """What the reader reads, for the catalog's re-checks that the data is still the
        version it pinned: (0 for the file, 1 for its companion, and an open descriptor, a
        RangeFile, or the path of a memory-mapped file, whose replacement the map hides)."""
        return []


def open_reader(
    fmt: str,
    path: Path,
    *,
    payload_kind: str,
    column: str,
    companion: Path | None,
    blocks: LRU,
    display: str,
) -> FileReader:
    """Open the reader for a manifest source `fmt`; SourceDataError if the file is unusable."""
    if payload_kind not in PAYLOAD_KINDS:
        raise ValueError(f"unknown payload kind {payload_kind!r} (expected one of {PAYLOAD_KINDS})")
    if fmt == "megatron":
        if companion is None or payload_kind != "token_ids":
            raise ValueError("a Megatron reader needs the .idx companion and token_ids payloads")
        return MegatronReader(path, companion, display, blocks)
    if not column:
        raise ValueError(f"a {fmt} reader needs the payload column")
    if fmt == "parquet":
        return ParquetReader(path, payload_kind, column, blocks, display)
    if fmt == "arrow" and storage.is_url(path):
        return ArrowObjectReader(str(path), payload_kind, column, blocks, display)
    if fmt == "arrow":
        return ArrowReader(path, payload_kind, column, display)
    if fmt == "jsonl":
        return JsonlReader(path, payload_kind, column, display, blocks)
    if fmt == "jsonl.zst":
        return JsonlZstReader(path, payload_kind, column, blocks, display)
    raise ValueError(f"unknown source format {fmt!r} (expected one of {FORMATS})")


# --- shared checks ----------------------------------------------------------------------


def _cannot_open(display: str, exc: OSError) -> SourceDataError:
    # pyarrow's OSError carries its own long text as strerror; errno says it plainly.
    reason = os.strerror(exc.errno) if exc.errno else (exc.strerror or _first_line(exc))
    return SourceDataError(f"{display}: cannot open ({reason})")


def _version(kind: str, path: Path, display: str) -> tuple:
    """The `lru.version_key` of what is parsed (`kind`) from the file's current version;
    SourceDataError if the file cannot be stat'ed."""
    try:
        return version_key(kind, path, storage.stat(path))
    except OSError as exc:
        raise _cannot_open(display, exc) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _check_rows(rows: np.ndarray, n: int, display: str, unit: str = "row") -> np.ndarray:
    """Rows as int64; SourceDataError naming the first one outside [0, n)."""
    rows = np.asarray(rows, dtype=np.int64)
    if not len(rows) or (rows.min() >= 0 and rows.max() < n):
        return rows
    bad = np.flatnonzero((rows < 0) | (rows >= n))
    if len(bad):
        r = int(rows[bad[0]])
        raise SourceDataError(
            f"{display} {unit} {r} is beyond the file's {n} {unit}s (file changed since indexing?)"
        )
    return rows


def _check_column_type(type_: pa.DataType, kind: str, column: str, display: str) -> None:
    """The payload column must hold integer lists (token_ids) or strings (text)."""
    if kind == "token_ids":
        ok = (pa.types.is_list(type_) or pa.types.is_large_list(type_)) and pa.types.is_integer(
            type_.value_type
        )
        want = "a list of integer token ids"
    else:
        if pa.types.is_dictionary(type_):
            type_ = type_.value_type
        ok = pa.types.is_string(type_) or pa.types.is_large_string(type_)
        ok = ok or pa.types.is_string_view(type_)
        want = "text"
    if not ok:
        raise SourceDataError(f"{display}: column '{column}' is {type_}, not {want}")


def _missing_column(display: str, column: str, names: list[str]) -> SourceDataError:
    shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
    return SourceDataError(f"{display} has no column '{column}' (columns: {shown})")


# --- decoded blocks of Arrow data -------------------------------------------------------


class _TokenBlock:
    """A list<int> column of one block as numpy offsets and values, so a row is a slice.

    `own`: copy the values out of Arrow's memory (a decoded Parquet row group kept in the
    block cache: the Arrow buffers are freed at once and `nbytes` is exactly what stays);
    otherwise keep views. `views`: rows are handed out as views (a memory-mapped Arrow
    file: nothing is copied); otherwise each row is a copy of its own, so a payload never
    holds on to a whole block (a Parquet row group read once and not cached).
    """

    def __init__(self, array: pa.Array, own: bool, views: bool = False):
        offsets = array.offsets.to_numpy()
        values = array.values  # the whole child; the offsets index into it
        if own:  # keep only the values the rows use, offsets relative to them
            lo, hi = int(offsets[0]), int(offsets[-1])
            offsets, values = offsets - lo, values.slice(lo, hi - lo)
        self.offsets = offsets
        self.bad_values = None
        if values.null_count:
            self.bad_values = values.is_null().to_numpy(zero_copy_only=False)
            values = values.fill_null(0)
        self.values = np.array(values.to_numpy(), copy=True) if own else values.to_numpy()
        self.nulls = array.is_null().to_numpy(zero_copy_only=False) if array.null_count else None
        self.rows = len(array)
        self.copy = not views
        self.nbytes = self.offsets.nbytes + self.values.nbytes
        for mask in (self.bad_values, self.nulls):
            self.nbytes += mask.nbytes if mask is not None else 0

    def take(self, local: np.ndarray, rows: np.ndarray, where: Callable[[int], str]) -> list:
        offsets, values = self.offsets, self.values
        if self.nulls is None and self.bad_values is None:  # nothing to check row by row
            starts, ends = offsets[local].tolist(), offsets[local + 1].tolist()
            if self.copy:
                return [values[a:b].copy() for a, b in zip(starts, ends, strict=True)]
            return [values[a:b] for a, b in zip(starts, ends, strict=True)]
        out = []
        for i, r in zip(local.tolist(), rows.tolist(), strict=True):
            if self.nulls is not None and self.nulls[i]:
                raise SourceDataError(f"{where(r)} is null")
            a, b = int(offsets[i]), int(offsets[i + 1])
            if self.bad_values is not None and self.bad_values[a:b].any():
                raise SourceDataError(f"{where(r)} holds a null token id")
            out.append(values[a:b].copy() if self.copy else values[a:b])
        return out


class _TextBlock:
    """A string column of one block, kept as Arrow; only the requested rows become str."""

    def __init__(self, array: pa.Array):
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        self.array = array
        self.rows = len(array)
        self.nbytes = array.nbytes

    def take(self, local: np.ndarray, rows: np.ndarray, where: Callable[[int], str]) -> list:
        values = self.array.take(pa.array(local, type=pa.int64())).to_pylist()
        for value, r in zip(values, rows.tolist(), strict=True):
            if value is None:
                raise SourceDataError(f"{where(r)} is null")
        return values


def _block(
    array: pa.Array | pa.ChunkedArray, kind: str, own: bool, views: bool = False
) -> _TokenBlock | _TextBlock:
    if isinstance(array, pa.ChunkedArray):
        array = array.chunk(0) if array.num_chunks == 1 else array.combine_chunks()
    return _TokenBlock(array, own, views) if kind == "token_ids" else _TextBlock(array)


def _gather(
    rows: np.ndarray,
    starts: np.ndarray,
    load: Callable[[int, int, int], _TokenBlock | _TextBlock],
    where: Callable[[int], str],
) -> list[Payload]:
    """Group rows by block (`starts` = first row of each block, then the total), load each
    needed block once, at least up to the last row asked of it, and return the rows'
    payloads in request order."""
    if len(starts) == 2 and len(rows):  # one block (a file of one row group): no grouping
        block = load(0, int(rows.max()) + 1, int(rows[0]))
        return block.take(rows, rows, where)
    out: list = [None] * len(rows)
    blocks = np.searchsorted(starts, rows, side="right") - 1
    order = np.argsort(blocks, kind="stable")
    cuts = np.flatnonzero(np.diff(blocks[order])) + 1
    for group in np.split(order, cuts) if len(order) else []:
        b = int(blocks[group[0]])
        local = rows[group] - starts[b]
        block = load(b, int(local.max()) + 1, int(rows[group[0]]))
        for i, value in zip(group.tolist(), block.take(local, rows[group], where), strict=True):
            out[i] = value
    return out


def _row_starts(counts: list[int]) -> np.ndarray:
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.asarray(counts, dtype=np.int64), out=starts[1:])
    return starts


# --- Parquet ----------------------------------------------------------------------------


class _ColumnReader(_Reader):
    """A column read in units of rows (row groups, record batches) that start at `starts`."""

    display: str
    column: str
    starts: np.ndarray

    def fetch(self, file_rows, offsets=None, lengths=None, keep: bool = True) -> list[Payload]:
        """Payloads of `file_rows`; `keep=False`: the caller will not ask again for rows of
        the units these rows are in, so units decoded for them are not cached."""
        rows = _check_rows(file_rows, int(self.starts[-1]), self.display)

        def unit(i: int, need: int, row: int) -> _TokenBlock | _TextBlock:
            return self._unit(i, need, row, keep)

        return _gather(rows, self.starts, unit, self._where)

    def _where(self, row: int) -> str:
        return f"{self.display} row {row}: column '{self.column}'"

    def _unit(self, i: int, need: int, row: int, keep: bool = True) -> _TokenBlock | _TextBlock:
        """Unit `i`, holding at least its first `need` rows (`row`: one asked, for errors;
        `keep`: whether a decoded unit is worth caching)."""
        raise NotImplementedError


# Rows holding under 1/_SPARSE of a row group's values are read from its pages, at most
# _PAGED_READS times per group before it is decoded whole instead (`_paged`).
_SPARSE = 4
_PAGED_READS = 2

# Parsed footers take about 4-9 times their serialized size in memory (measured with
# pyarrow 26 on 0.5-47 KB footers); they are counted at 9 times plus a fixed 4 KiB.
_FOOTER_FACTOR, _FOOTER_FIXED = 9, 4096


_FOOTER_TAIL = 4096  # bytes read from a file's end at once: the footer of a few columns fits


def _footer(source: pa.NativeFile) -> pq.FileMetaData | None:
    """The footer of a local Parquet file, parsed from its last bytes without a ParquetFile
    (9 against 25 us a file: most of what opening a file for a page read costs), or None
    where this does not apply (an encrypted or damaged footer, a pyarrow without the
    parser): pq.ParquetFile then parses it and names any problem. The parser is the one
    pyarrow unpickles metadata with."""
    parse = getattr(_pq, "_reconstruct_filemetadata", None)
    try:
        size = source.size()
        if parse is None or size < 12:
            return None
        first = min(size, _FOOTER_TAIL)
        tail = source.read_at(first, size - first)
        n = int.from_bytes(tail[-8:-4], "little")
        if tail[-4:] != b"PAR1" or n + 12 > size:
            return None
        if n + 8 > len(tail):
            tail = source.read_at(n + 8, size - n - 8)
        return parse(pa.py_buffer(tail[len(tail) - 8 - n : len(tail) - 8]))
    except (OSError, ValueError, pa.ArrowException):
        return None


class _ParquetMeta:
    """What reopening a Parquet file needs: its parsed footer, where its row groups start,
    and the (column, payload kind) pairs already checked against its schema."""

    def __init__(self, metadata: pq.FileMetaData):
        self.metadata = metadata
        counts = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        self.starts = _row_starts(counts)
        self.checked: set[tuple[str, str]] = set()
        self._arrow_schema: pa.Schema | None = None
        self.paged: dict[tuple[str, int], int] = {}  # (column, row group): reads from pages
        self._layouts: dict[str, parquet_pages.Layout | None] = {}
        self._sizes: dict[str, np.ndarray] = {}
        self._spans: dict[str, list[list[tuple[int, int]]]] = {}
        self.nbytes = _FOOTER_FACTOR * metadata.serialized_size + _FOOTER_FIXED
        self.nbytes += self.starts.nbytes

    def _leaves(self, column: str) -> list[int]:
        return parquet_pages.leaves(self.metadata, column)

    def arrow_schema(self) -> pa.Schema:
        """The footer's schema as Arrow's, made once (the schema check and the page layout
        both want it)."""
        if self._arrow_schema is None:
            self._arrow_schema = self.metadata.schema.to_arrow_schema()
        return self._arrow_schema

    def chunk_spans(self, column: str) -> list[list[tuple[int, int]]]:
        """Per row group, the byte spans [lo, hi) of top-level `column`'s column chunks
        (dictionary page first, if any), from the footer: what reading it reads."""
        spans = self._spans.get(column)
        if spans is None:
            leaves, meta = self._leaves(column), self.metadata
            spans = [
                [parquet_pages.chunk_span(meta.row_group(i).column(j)) for j in leaves]
                for i in range(meta.num_row_groups)
            ]
            self._spans[column] = spans
        return spans

    def layout(self, column: str) -> parquet_pages.Layout | None:
        """How rows of token-list `column` are read from its pages (None: decoded whole)."""
        if column not in self._layouts:
            value_type = self.arrow_schema().field(column).type.value_type
            self._layouts[column] = parquet_pages.layout(self.metadata, column, value_type)
        return self._layouts[column]

    def column_sizes(self, column: str) -> np.ndarray:
        """Uncompressed bytes of top-level `column` in each row group, from the footer."""
        sizes = self._sizes.get(column)
        if sizes is None:
            meta = self.metadata
            leaves = self._leaves(column)
            sizes = np.array(
                [
                    sum(meta.row_group(i).column(j).total_uncompressed_size for j in leaves)
                    for i in range(meta.num_row_groups)
                ],
                dtype=np.int64,
            )
            self._sizes[column] = sizes
        return sizes


class ParquetReader(_ColumnReader):
    """Rows of one column, read a row group at a time; decoded row groups are cached.

    The parsed footer is kept in `metacache`, apart from the handle and the decoded blocks:
    reopening a file after its handle was evicted costs an open, not another footer parse
    or schema check. A local file's reader holds one `pq.ParquetFile` without pre-buffering
    (which keeps no column bytes between decodes); an object's wraps the handle in a
    pre-buffering `pq.ParquetFile` per decode (one coalesced request), closed straight after
    (an open one keeps its last column chunk's bytes, ~0.4 MB a file here). A decoded row
    group keeps only the payload column, as numpy arrays.
    """

    def __init__(self, path: Path, kind: str, column: str, blocks: LRU, display: str):
        self.path, self.kind, self.column, self.display = path, kind, column, display
        self._blocks = blocks
        self._held: pq.ParquetFile | None = None
        self._local = not storage.is_url(path)
        key = _version("parquet-footer", path, display)
        meta = metacache.get(key)
        try:
            if storage.is_url(path):  # an object: byte-range requests, staged per fetch
                self.object = ranges.RangeFile(str(path), blocks)
                self._source = self.object.arrow_file()
            else:
                self._source = storage.open_input(path)
        except OSError as exc:
            raise _cannot_open(display, exc) from None
        try:
            # The file may have changed between the stat and the open: its footer is then
            # parsed afresh from the file held open, and not kept.
            if _version("parquet-footer", path, display) != key:
                meta, key = None, None
            if meta is None:
                footer = _footer(self._source) if self._local else None
                if footer is None:
                    file = self._parquet(None)
                    try:
                        footer = file.metadata
                    finally:
                        if self._local:
                            self._held = file
                        else:
                            file.close()
                meta = _ParquetMeta(footer)
                if key is not None:
                    metacache.put(key, meta, meta.nbytes)
            if (column, kind) not in meta.checked:
                self._check_schema(meta.arrow_schema())
                meta.checked.add((column, kind))
        except BaseException:
            self.close()
            raise
        self._meta = meta
        self.starts = meta.starts

    def handles(self) -> list[tuple[int, Handle]]:
        if self.object is not None:
            return [(0, self.object)]
        return [(0, self._source.fileno())]

    def _parquet(self, metadata: pq.FileMetaData | None) -> pq.ParquetFile:
        """A ParquetFile over the descriptor held (closing it leaves the descriptor open)."""
        try:
            return pq.ParquetFile(self._source, metadata=metadata, pre_buffer=not self._local)
        except OSError as exc:
            if exc.errno is not None:
                raise _cannot_open(self.display, exc) from None
            raise SourceDataError(
                f"{self.display}: not a readable Parquet file ({_first_line(exc)})"
            ) from None
        except pa.ArrowException as exc:
            raise SourceDataError(
                f"{self.display}: not a readable Parquet file ({_first_line(exc)})"
            ) from None

    def _check_schema(self, schema: pa.Schema) -> None:
        if self.column not in schema.names:
            raise _missing_column(self.display, self.column, schema.names)
        _check_column_type(schema.field(self.column).type, self.kind, self.column, self.display)

    def fetch(
        self, file_rows, offsets=None, lengths=None, keep: bool = True, pages=None
    ) -> list[Payload]:
        """Payloads of `file_rows`. Given where each row's values start in its row group and
        how many there are (`offsets`, `lengths`: a token list the plan locates by values),
        rows that are a small part of an uncached row group are read from its pages
        (`parquet_pages`; an object's from the bytes staged for the fetch); the rest decode
        row groups with pyarrow. `pages`: what `page_groups` just said for the same rows."""
        rows = _check_rows(file_rows, int(self.starts[-1]), self.display)
        if pages is None:
            pages = self._paged(rows, lengths, keep) if offsets is not None else {}
        if not pages:
            return super().fetch(rows, keep=keep)
        lay = self._meta.layout(self.column)
        source = self._source.fileno() if self._local else self.object
        out: list = [None] * len(rows)
        done = np.zeros(len(rows), dtype=bool)
        for i, pick in pages.items():
            values = parquet_pages.fetch_rows(
                source, lay, i, rows[pick], offsets[pick], lengths[pick], self.display
            )
            if values is not None:  # else decoded whole below, where problems are named
                for k, v in zip(pick.tolist(), values, strict=True):
                    out[k] = v
                done[pick] = True
                key = (self.column, i)
                self._meta.paged[key] = self._meta.paged.get(key, 0) + 1
        rest = np.flatnonzero(~done)
        if len(rest):
            for k, v in zip(rest.tolist(), super().fetch(rows[rest], keep=keep), strict=True):
                out[k] = v
        return out

    def page_groups(
        self, file_rows, offsets=None, lengths=None, keep: bool = True
    ) -> dict[int, np.ndarray]:
        """The row groups a `fetch` of these rows would read from pages (Python work that
        holds the GIL, unlike pyarrow's decoding), with the positions of their rows: empty
        for none."""
        if offsets is None:
            return {}
        rows = _check_rows(file_rows, int(self.starts[-1]), self.display)
        return self._paged(rows, lengths, keep)

    def _paged(self, rows: np.ndarray, lengths, keep: bool = True) -> dict[int, np.ndarray]:
        """Positions of `rows` by row group, for the groups read from pages: groups of the
        token-list column whose pages are read here, not cached, where the rows hold
        under a quarter of the group's values (beyond that a whole decode in native code is
        as quick, and it serves later rows from cache), and, while the cache has room for
        the group, read from pages fewer than `_PAGED_READS` times: each read decompresses
        the pages again, so a group asked for again and again is decoded whole and cached
        (a read from pages costs about a third of a whole decode: renting until it would
        have paid for buying keeps the total within about twice the best choice). Of an
        object each read from pages fetches the chunk again, so while the cache has room a
        group that may be asked for again (`keep`) is decoded whole at once."""
        if lengths is None or self.kind != "token_ids" or not len(rows):
            return {}
        lay = self._meta.layout(self.column)
        if lay is None:
            return {}
        out = {}
        for i, pick in self._by_group(rows).items():
            chunk = lay.chunk(i)
            if chunk is None or _SPARSE * int(lengths[pick].sum()) >= chunk.num_values:
                continue
            if (
                self._meta.paged.get((self.column, i), 0) >= _PAGED_READS
                or (keep and not self._local)
            ) and self._room(i):  # the cheap test first: a first read of a file skips this one
                continue
            if self._blocks.get((self.path, "rg", i, self.column, self.kind)) is None:
                out[i] = pick
        return out

    def _by_group(self, rows: np.ndarray) -> dict[int, np.ndarray]:
        """Positions of `rows` by the row group they are in."""
        if len(self.starts) == 2:
            return {0: np.arange(len(rows))}
        groups = np.searchsorted(self.starts, rows, side="right") - 1
        order = np.argsort(groups, kind="stable")
        cuts = np.flatnonzero(np.diff(groups[order])) + 1
        return {int(groups[p[0]]): p for p in np.split(order, cuts)}

    def spans(self, file_rows, offsets=None, lengths=None) -> list[tuple[int, int]]:
        """The payload column's chunks in the row groups these rows need that the block
        cache does not hold (far enough), for an object; nothing for a file."""
        if self.object is None:
            return []
        rows = np.asarray(file_rows, dtype=np.int64)
        rows = rows[(rows >= 0) & (rows < self.starts[-1])]
        groups = np.searchsorted(self.starts, rows, side="right") - 1
        chunks = self._meta.chunk_spans(self.column)
        out: list[tuple[int, int]] = []
        for i in np.unique(groups).tolist():
            need = int(rows[groups == i].max() - self.starts[i]) + 1
            block = self._blocks.get((self.path, "rg", i, self.column, self.kind))
            if block is None or block.rows < need:
                out.extend(chunks[i])
        return out

    def _unit(self, i: int, need: int, row: int, keep: bool = True) -> _TokenBlock | _TextBlock:
        key = (self.path, "rg", i, self.column, self.kind)
        block = self._blocks.get(key)
        if (block is None or block.rows < need) and not keep:
            # Not to be asked again: decode up to the last row asked and copy out only the
            # rows asked (`_TokenBlock.take`), not the whole group.
            whole = int(self.starts[i + 1] - self.starts[i])
            return self._read(i, need, whole, row, own=False)
        if block is None or block.rows < need:
            # While the cache has room, the whole row group is decoded: it stays to serve
            # later rows. Once the cache is full, a first read decodes only up to the last
            # row asked (decoding costs about in proportion to the rows decoded), since the
            # group may well be evicted before another of its rows is asked; a row beyond a
            # cached prefix then decodes the whole group, so no group is decoded more than
            # twice while it stays cached.
            whole = int(self.starts[i + 1] - self.starts[i])
            if block is not None or self._room(i):
                need = whole
            block = self._read(i, need, whole, row)
            self._blocks.put(key, block, block.nbytes)
        return block

    def _room(self, i: int) -> bool:
        """Whether the block cache can take row group `i` whole without evicting (estimated
        from the footer's uncompressed size of the payload column in the group)."""
        cache = self._blocks
        if cache.max_bytes is None:
            return True
        size = int(self._meta.column_sizes(self.column)[i])
        return cache.nbytes + size <= cache.max_bytes

    def _read(
        self, i: int, need: int, whole: int, row: int, own: bool = True
    ) -> _TokenBlock | _TextBlock:
        """The first `need` (or more) rows of row group `i`, copied out of Arrow (`own`), or
        kept there with each row copied as it is taken."""
        column = None
        if self._held is None:
            file = self._parquet(self._meta.metadata)
            if self._local:
                self._held = file
        else:
            file = self._held
        try:
            if need < whole:
                batches = file.iter_batches(
                    batch_size=need, row_groups=[i], columns=[self.column], use_threads=False
                )
                try:
                    column = next(batches).column(0)
                finally:
                    batches.close()
            if column is None or len(column) < need:
                column = file.read_row_group(i, columns=[self.column], use_threads=False)
                column = column.column(0)
            return _block(column, self.kind, own=own)
        except (OSError, pa.ArrowException) as exc:
            raise SourceDataError(
                f"{self.display} row {row} (row group {i}): cannot read ({_first_line(exc)})"
            ) from None
        finally:
            if file is not self._held:
                file.close()

    def close(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None
        self._source.close()
        if self.object is not None:
            self.object.close()


# --- Arrow IPC --------------------------------------------------------------------------


class ArrowReader(_ColumnReader):
    """Rows of an Arrow IPC file or stream, memory-mapped: batches are zero-copy views.

    A stream has no footer, so it is walked once at open to list its batches (views into
    the map, nothing is read into memory unless the IPC buffers are compressed).
    """

    def __init__(self, path: Path, kind: str, column: str, display: str):
        self.path, self.kind, self.column, self.display = path, kind, column, display
        try:
            self._map = pa.memory_map(str(path))
        except OSError as exc:
            raise _cannot_open(display, exc) from None
        try:
            self._open_batches()
        except BaseException:
            self.close()
            raise

    def handles(self) -> list[tuple[int, Handle]]:
        # the map reads the file it was made of in place: a rewrite shows in its fstat, a
        # replacement (a new file renamed over the path) only at the path
        return [(0, self._map.fileno()), (0, Path(self.path))]

    def _open_batches(self) -> None:
        try:
            try:
                file = pa.ipc.open_file(self._map)
                schema, self._get = file.schema, file.get_batch
                counts = [file.get_batch(i).num_rows for i in range(file.num_record_batches)]
            except pa.ArrowInvalid:
                self._map.seek(0)
                stream = pa.ipc.open_stream(self._map)
                schema, batches = stream.schema, list(stream)
                self._get = batches.__getitem__
                counts = [b.num_rows for b in batches]
        except (OSError, pa.ArrowException) as exc:
            raise SourceDataError(
                f"{self.display}: not a readable Arrow IPC file or stream ({_first_line(exc)})"
            ) from None
        if self.column not in schema.names:
            raise _missing_column(self.display, self.column, schema.names)
        _check_column_type(schema.field(self.column).type, self.kind, self.column, self.display)
        self._index = schema.get_field_index(self.column)
        self.starts = _row_starts(counts)

    def _unit(self, i: int, need: int, row: int, keep: bool = True) -> _TokenBlock | _TextBlock:
        try:
            return _block(self._get(i).column(self._index), self.kind, own=False, views=True)
        except (OSError, pa.ArrowException) as exc:
            raise SourceDataError(
                f"{self.display} row {row} (record batch {i}): cannot read ({_first_line(exc)})"
            ) from None

    def close(self) -> None:
        self._get = None
        self._map.close()


class ArrowObjectReader(_ColumnReader):
    """Rows of an Arrow IPC file or stream in object storage: its batches are listed once
    by a walk of the message headers (kept in `metacache` per version of the object), and
    a batch is one range read, decoded into the block cache (payload column only)."""

    def __init__(self, url: str, kind: str, column: str, blocks: LRU, display: str):
        self.path, self.kind, self.column, self.display = url, kind, column, display
        self._blocks = blocks
        key = _version("arrow-batches", url, display)  # type: ignore[arg-type]
        self.object = ranges.RangeFile(url, blocks)
        try:
            table = metacache.get(key)
            if table is None:
                table = ipc_ranges.read_batch_table(self.object.read_at, self.object.size, display)
                metacache.put(key, table, table.nbytes)
            schema = table.schema
            if column not in schema.names:
                raise _missing_column(display, column, schema.names)
            _check_column_type(schema.field(column).type, kind, column, display)
        except BaseException:
            self.close()
            raise
        self._table, self._index = table, schema.get_field_index(column)
        self.starts = _row_starts(table.rows.tolist())

    def handles(self) -> list[tuple[int, Handle]]:
        return [(0, self.object)] if self.object is not None else []

    def spans(self, file_rows, offsets=None, lengths=None) -> list[tuple[int, int]]:
        """The messages of the batches these rows need that the block cache lacks."""
        rows = np.asarray(file_rows, dtype=np.int64)
        rows = rows[(rows >= 0) & (rows < self.starts[-1])]
        out = []
        for i in np.unique(np.searchsorted(self.starts, rows, side="right") - 1).tolist():
            if (self.path, "batch", i, self.column, self.kind) not in self._blocks:
                lo = int(self._table.offsets[i])
                out.append((lo, lo + int(self._table.sizes[i])))
        return out

    def _unit(self, i: int, need: int, row: int, keep: bool = True) -> _TokenBlock | _TextBlock:
        key = (self.path, "batch", i, self.column, self.kind)
        block = self._blocks.get(key)
        if block is None:
            try:
                batch = ipc_ranges.read_batch(self._table, i, self.object.read_at)  # type: ignore[union-attr]
                block = _block(batch.column(self._index), self.kind, own=True)
            except (OSError, pa.ArrowException) as exc:
                raise SourceDataError(
                    f"{self.display} row {row} (record batch {i}): cannot read ({_first_line(exc)})"
                ) from None
            self._blocks.put(key, block, block.nbytes)
        return block

    def close(self) -> None:
        if self.object is not None:
            self.object.close()


# --- JSONL and JSONL.zst ----------------------------------------------------------------


def _describe(value: object) -> str:
    kinds = {str: "a string", bool: "a boolean", int: "an integer", float: "a number"}
    return kinds.get(type(value), "a list" if isinstance(value, list) else "an object")


def _json_tokens(value: object, where: str) -> np.ndarray:
    if not isinstance(value, list):
        raise SourceDataError(f"{where} is {_describe(value)}, not a list of integer token ids")
    if not value:
        return np.empty(0, dtype=np.int64)
    try:
        array = np.array(value)
    except (ValueError, OverflowError):
        array = np.empty(0, dtype=object)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        bad = next((v for v in value if type(v) is not int), None)
        got = f"{_describe(bad)} ({json.dumps(bad)[:40]})" if bad is not None else None
        got = got or "an integer that does not fit int64"
        raise SourceDataError(f"{where} is not a list of integer token ids (holds {got})")
    return array


def _parse_line(raw: bytes, kind: str, column: str, where: str) -> Payload:
    """The payload of one JSONL line: field `column` of the object, checked for `kind`."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SourceDataError(f"{where}: invalid UTF-8 at byte {exc.start} of the line") from None
    except json.JSONDecodeError as exc:
        raise SourceDataError(
            f"{where}: invalid JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})"
        ) from None
    if not isinstance(obj, dict):
        raise SourceDataError(f"{where}: expected a JSON object, got {_describe(obj)}")
    if column not in obj:
        raise SourceDataError(f"{where}: has no field '{column}'")
    value = obj[column]
    if value is None:
        raise SourceDataError(f"{where}: field '{column}' is null")
    if kind == "token_ids":
        return _json_tokens(value, f"{where}: field '{column}'")
    if not isinstance(value, str):
        raise SourceDataError(f"{where}: field '{column}' is {_describe(value)}, not text")
    return value


def _inner_line(raw: bytes, head: int, length: int, expected: int) -> bytes | None:
    """The line inside `raw` (read with one byte either side), or None unless newlines or the
    data's edges surround it and the read was complete."""
    if len(raw) != expected:
        return None
    tail = raw[head + length :]
    if raw[:head] not in (b"", b"\n") or tail not in (b"", b"\n"):
        return None
    return raw[head : head + length]


class _LineReader(_Reader):
    """Lines located by (byte offset, byte length); subclasses read raw byte ranges.

    Each line is read with one byte either side, which must be a newline (or the start or
    end of the data): a cheap check that the file still has its lines where the index says.
    """

    display: str
    kind: str
    column: str
    size: int
    what = "file"

    def _read(self, starts: np.ndarray, sizes: np.ndarray, where) -> list[bytes]:
        raise NotImplementedError

    def _around(self, offsets: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[lo, hi) of each line with the byte either side, within the data."""
        return np.maximum(offsets - 1, 0), np.minimum(offsets + lengths + 1, self.size)

    def _spans_around(self, offsets, lengths) -> tuple[np.ndarray, np.ndarray] | None:
        """(starts, sizes) of these lines with the byte either side, clipped to the data,
        for an object's staged reads; None for a file."""
        if self.object is None or offsets is None or lengths is None:
            return None
        offsets = np.clip(np.asarray(offsets, dtype=np.int64), 0, self.size)
        lengths = np.clip(np.asarray(lengths, dtype=np.int64), 0, self.size - offsets)
        lo, hi = self._around(offsets, lengths)
        return lo, hi - lo

    def fetch(self, file_rows, offsets, lengths) -> list[Payload]:
        if offsets is None or lengths is None:
            raise ValueError("JSONL readers need the byte offsets and lengths of the lines")
        rows = np.asarray(file_rows, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)

        def where(i: int) -> str:
            return f"line {int(rows[i]) + 1} (byte {int(offsets[i])})"

        # Compared without adding first: a forged offset + length can wrap around int64.
        bad = np.flatnonzero(
            (offsets < 0) | (lengths < 0) | (offsets > self.size) | (lengths > self.size - offsets)
        )
        if len(bad):
            raise SourceDataError(
                f"{self.display} {where(int(bad[0]))} is beyond the end of the {self.what} "
                f"({self.size} bytes; file changed since indexing?)"
            )
        lo, hi = self._around(offsets, lengths)
        raws = self._read(lo, hi - lo, where)
        out = []
        for i, raw in enumerate(raws):
            line = _inner_line(raw, int(offsets[i] - lo[i]), int(lengths[i]), int(hi[i] - lo[i]))
            if line is None:
                raise SourceDataError(
                    f"{self.display} {where(i)}: no line starts and ends there "
                    "(file changed since indexing?)"
                )
            out.append(_parse_line(line, self.kind, self.column, f"{self.display} {where(i)}"))
        return out


class JsonlReader(_LineReader):
    """Lines of a plain JSONL file, one positioned read each; of an object, the blocks that
    hold them, read together and kept in the block cache (ranges.RangeFile)."""

    def __init__(self, path: Path, kind: str, column: str, display: str, blocks: LRU):
        self.kind, self.column, self.display = kind, column, display
        self._fd = -1
        if storage.is_url(path):
            self.object = ranges.RangeFile(str(path), blocks)
            self.size = self.object.size
            return
        try:
            self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except OSError as exc:
            raise _cannot_open(display, exc) from None
        self.size = os.fstat(self._fd).st_size

    def handles(self) -> list[tuple[int, Handle]]:
        return [(0, self.object)] if self.object is not None else [(0, self._fd)]

    def spans(self, file_rows, offsets=None, lengths=None) -> list[tuple[int, int]]:
        """The blocks holding these lines that the block cache lacks, for an object."""
        around = self._spans_around(offsets, lengths)
        return [] if around is None else self.object.missing(*(a.tolist() for a in around))

    def _read(self, starts, sizes, where) -> list[bytes]:
        if self.object is not None:
            return self.object.read_ranges(starts, sizes)
        return [os.pread(self._fd, int(n), int(s)) for s, n in zip(starts, sizes, strict=True)]

    def close(self) -> None:
        if self.object is not None:
            self.object.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class JsonlZstReader(_LineReader):
    """Lines of a zstd-compressed JSONL file; offsets are in the decompressed stream."""

    what = "decompressed stream"

    def __init__(self, path: Path, kind: str, column: str, blocks: LRU, display: str):
        self.kind, self.column, self.display = kind, column, display
        self._file = ZstdSeekFile(path, display, blocks)
        self.size = self._file.size
        self.object = self._file.object

    def handles(self) -> list[tuple[int, Handle]]:
        return [(0, self.object if self.object is not None else self._file.fd)]

    def spans(self, file_rows, offsets=None, lengths=None) -> list[tuple[int, int]]:
        """The frames holding these lines that the block cache lacks, for an object."""
        around = self._spans_around(offsets, lengths)
        return [] if around is None else self._file.spans(*around)

    @property
    def frames(self):
        """The file's zstd frame table."""
        return self._file.table

    def _read(self, starts, sizes, where) -> list[bytes]:
        return self._file.read_ranges(starts, sizes, where)

    def close(self) -> None:
        self._file.close()


# --- Megatron ---------------------------------------------------------------------------


def _relabel(exc: SourceDataError, path: Path, display: str) -> SourceDataError:
    """The megatron module names files by path; say `display` instead."""
    text = str(exc)
    prefix = f"{path}: "
    return SourceDataError(display + text[len(prefix) - 2 :] if text.startswith(prefix) else text)


class MegatronReader(_Reader):
    """Sequences of a Megatron `.bin`, located through its `.idx`, read with `pread`: opening
    and memory cost the same for ten sequences or a billion (see megatron.SequenceFile)."""

    def __init__(self, path: Path, companion: Path, display: str, blocks: LRU | None = None):
        self.display = display
        self._idx_display = str(PurePosixPath(display).with_name(PurePosixPath(companion).name))
        self._paths = (path, companion)
        for p, shown in ((companion, self._idx_display), (path, display)):
            if not storage.is_url(p) and not p.exists():
                raise SourceDataError(f"{shown}: cannot open (No such file or directory)")
        try:
            self._file: megatron.SequenceFile | None = megatron.SequenceFile(
                companion, path, blocks
            )
        except SourceDataError as exc:
            raise self._relabel(exc) from None
        self.object = self._file.bin_object
        dtype = self._file.dtype
        if dtype.kind not in "iu":
            self.close()
            raise SourceDataError(f"{display}: Megatron dtype is {dtype}, not integer token ids")

    def _relabel(self, exc: SourceDataError) -> SourceDataError:
        path, companion = self._paths
        exc = _relabel(exc, companion, self._idx_display)
        return _relabel(exc, path, self.display)

    def handles(self) -> list[tuple[int, Handle]]:
        return self._file.handles() if self._file is not None else []

    def spans(self, file_rows, offsets=None, lengths=None) -> list[tuple[int, int]]:
        """The .bin spans of these sequences, for an object (their .idx entries are read
        now, through the block cache)."""
        if self._file is None or self.object is None:
            return []
        try:
            return self._file.bin_spans(np.asarray(file_rows, dtype=np.int64).tolist())
        except SourceDataError:
            return []  # raised by the fetch, with the sequence it concerns

    def fetch(self, file_rows, offsets=None, lengths=None) -> list[Payload]:
        assert self._file is not None, "fetch after close"
        rows = _check_rows(file_rows, self._file.count, self.display, unit="sequence")
        try:
            return [self._file.read(r) for r in rows.tolist()]
        except SourceDataError as exc:
            raise self._relabel(exc) from None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
