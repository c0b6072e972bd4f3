"""Parquet: rows of one column, read a row group at a time (or, for a few rows of a token
list, from the row group's pages), with the parsed footer kept apart from the handle.

Image-text rows (`ParquetImageTextReader`) read two columns: the text and the images, a
struct of `bytes` and `path` (what `datasets.Image` writes) or a list of them."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow._parquet as _pq
import pyarrow.parquet as pq

from mds.core import metacache, storage
from mds.core import object_ranges as ranges
from mds.core.lru import LRU
from mds.core.memory_budget import MemoryBudget, Reservation, TooLarge
from mds.core.object_read_ahead import ReadAhead
from mds.core.row_slices import RowSlices
from mds.errors import SourceDataError
from mds.executor.readers.base import ColumnReader, Handle, ImageText, Payload
from mds.executor.readers.base import TextBlock as _TextBlock
from mds.executor.readers.base import TokenBlock as _TokenBlock
from mds.executor.readers.base import cannot_open as _cannot_open
from mds.executor.readers.base import check_column_type as _check_column_type
from mds.executor.readers.base import check_rows as _check_rows
from mds.executor.readers.base import decoded_block as _block
from mds.executor.readers.base import file_version as _version
from mds.executor.readers.base import first_line as _first_line
from mds.executor.readers.base import image_files as _image_files
from mds.executor.readers.base import missing_column as _missing_column
from mds.executor.readers.base import row_starts as _row_starts
from mds.executor.readers.base import too_large as _too_large
from mds.formats.parquet import pages as parquet_pages

__all__ = ["ParquetImageTextReader", "ParquetReader", "footer_meta"]


# Rows holding under 1/_SPARSE of a row group's values are read from its pages, at most
# _PAGED_READS times per group before it is decoded whole instead (`_paged`).
_SPARSE = 4
_PAGED_READS = 2

# A whole decode of a row group's column holds its compressed chunk, the decoded Arrow
# arrays and their numpy copy: counted as the compressed size plus twice the decoded data
# (`_ParquetMeta.decode_sizes`).
_DECODE_FACTOR = 2
_WIDTHS = {"INT32": 4, "INT64": 8, "FLOAT": 4, "DOUBLE": 8, "INT96": 12, "BOOLEAN": 1}
# Groups whose whole decode would take over 1/_LARGE of the budget's room are never decoded
# whole where their pages can be read: rows are read from the pages that hold them.
_LARGE = 8
# A read from pages holds a page (decompressed) and the values asked, twice (decoded, then
# placed): reserved as this (or the group's uncompressed size, if less) plus three times
# the values.
_PAGE = 2 << 20

# An object's row group read from its pages with its requests made ahead (`_read_ahead`):
# the thread's buffer is cut into _PIECES requests in flight at once, of _MIN_PIECE bytes at
# least.
_PIECES, _MIN_PIECE = 8, 64 << 10

# Parsed footers take about 4-9 times their serialized size in memory (measured with
# pyarrow 26 on 0.5-47 KB footers); they are counted at 9 times plus a fixed 4 KiB.
_FOOTER_FACTOR, _FOOTER_FIXED = 9, 4096


_FOOTER_TAIL = 4096  # bytes read from a file's end at once: the footer of a few columns fits


def _footer(source: Any) -> pq.FileMetaData | None:
    """The footer of a Parquet file, parsed from its last bytes without a ParquetFile, or
    None where this does not apply (an encrypted or damaged footer, a pyarrow without the
    parser): pq.ParquetFile then parses it and names any problem. `source` is a pyarrow
    file or a RangeFile: a local file saves the ParquetFile (9 against 25 us), an object
    one suffix-range request (two if the footer is larger than _FOOTER_TAIL). The parser is
    the one pyarrow unpickles metadata with."""
    parse = getattr(_pq, "_reconstruct_filemetadata", None)
    try:
        size = source.size if isinstance(source, ranges.RangeFile) else source.size()
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


def _object_key(url: str, version: tuple) -> tuple:
    """The metadata cache key of an object's footer: its URL and the version (size, ETag or
    generation) the handle it is read through was opened at, so a rewritten object is
    parsed afresh with no request of its own."""
    return (url, "parquet-footer", *version)


def footer_meta(path: Path, display: str, owner: Any = None) -> tuple[tuple, _ParquetMeta] | None:
    """(version key, parsed footer) of a Parquet file or object, as a reader opening it
    finds them: from the metadata cache, else parsed now and kept there. None where that
    cannot be done (the reader's own open then names the problem). Lets a file's footer be
    parsed (an object's fetched: one or two range requests) before its first read asks for
    it (`first_reads`). An object's handle is kept (by `owner`) for its check and open
    (`object_ranges.keep_open`)."""
    if storage.is_url(path):
        return _object_footer_meta(str(path), owner)
    try:
        key = _version("parquet-footer", path, display)
    except SourceDataError:
        return None
    meta = metacache.get(key)
    if meta is None:
        try:
            source = storage.open_input(path)
        except OSError:
            return None
        try:
            footer = _footer(source)
        finally:
            source.close()
        if footer is None:
            return None
        meta = _ParquetMeta(footer)
        try:
            if _version("parquet-footer", path, display) != key:
                return None  # changed while read: left to the reader's open
        except SourceDataError:
            return None
        metacache.put(key, meta, meta.nbytes)
    return key, meta


def _object_footer_meta(url: str, owner: Any = None) -> tuple[tuple, _ParquetMeta] | None:
    """`footer_meta` of an object: one metadata request (the version, which keys the
    cache) and, if not cached, one suffix-range request for the footer. The handle is kept
    for the file's check and open, which then ask nothing more of the store."""
    try:
        source = storage.open_input(url)
    except SourceDataError:
        return None
    try:
        key = _object_key(url, storage.object_version(source, url))
        meta = metacache.get(key)
        if meta is None:
            footer = _footer(source)
            if footer is None:
                source.close()
                return None
            meta = _ParquetMeta(footer)
            metacache.put(key, meta, meta.nbytes)
    except SourceDataError:
        source.close()
        return None
    except BaseException:
        source.close()
        raise
    ranges.keep_open(url, source, owner)
    return key, meta


class _Schema:
    """What a footer's schema decides, the same for every file written with it: its Arrow
    schema, the leaves of each column, the (column, payload kind, images column) checked
    against it and each token-list column's page layout. Files parsed one after another
    with an equal schema and key-value metadata share one (`_schema_of`): a corpus's files
    mostly are written alike, and a file's first read then derives none of it again."""

    def __init__(self, metadata: pq.FileMetaData, kv: Any):
        self.metadata, self.parquet, self.kv = metadata, metadata.schema, kv
        self.checked: set[tuple[str, str, str | None]] = set()
        self._arrow: pa.Schema | None = None
        self._leaves: dict[str, list[int]] = {}
        self._layouts: dict[str, tuple | None] = {}

    def same(self, metadata: pq.FileMetaData, kv: Any) -> bool:
        """Whether `metadata` (whose key-value metadata is `kv`) has this schema: the Arrow
        schema comes from both."""
        return kv == self.kv and metadata.schema.equals(self.parquet)

    def arrow(self) -> pa.Schema:
        if self._arrow is None:
            self._arrow = self.parquet.to_arrow_schema()
        return self._arrow

    def leaves(self, column: str) -> list[int]:
        found = self._leaves.get(column)
        if found is None:
            found = self._leaves[column] = parquet_pages.leaves(self.metadata, column)
        return found

    def layout(self, column: str) -> tuple | None:
        """(leaf, dtype, max definition level) of token-list `column`'s pages, or None
        where they are not read here (`parquet_pages.layout`)."""
        if column not in self._layouts:
            value_type = self.arrow().field(column).type.value_type
            lay = parquet_pages.layout(self.metadata, column, value_type)
            self._layouts[column] = None if lay is None else (lay.leaf, lay.dtype, lay.max_def)
        return self._layouts[column]


_last_schema: _Schema | None = None


def _schema_of(metadata: pq.FileMetaData) -> _Schema:
    """The `_Schema` of a footer: the last one made, where it is the same."""
    global _last_schema
    kv, last = metadata.metadata, _last_schema
    if last is not None and last.same(metadata, kv):
        return last
    _last_schema = _Schema(metadata, kv)
    return _last_schema


class _ParquetMeta:
    """What reopening a Parquet file needs: its parsed footer, where its row groups start,
    and its schema's facts (`_Schema`: among them the columns already checked against it,
    shared with the files of the same schema)."""

    def __init__(self, metadata: pq.FileMetaData):
        self.metadata = metadata
        counts = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        self.starts = _row_starts(counts)
        self.schema = _schema_of(metadata)
        self.checked = self.schema.checked
        self.paged: dict[tuple[str, int], int] = {}  # (column, row group): reads from pages
        self._layouts: dict[str, parquet_pages.Layout | None] = {}
        self._sizes: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._spans: dict[str, list[list[tuple[int, int]]]] = {}
        self.nbytes = _FOOTER_FACTOR * metadata.serialized_size + _FOOTER_FIXED
        self.nbytes += self.starts.nbytes

    def _leaves(self, column: str) -> list[int]:
        return self.schema.leaves(column)

    def arrow_schema(self) -> pa.Schema:
        """The footer's schema as Arrow's, made once per schema (the schema check and the
        page layout both want it)."""
        return self.schema.arrow()

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
            shape = self.schema.layout(column)
            lay = None if shape is None else parquet_pages.Layout(self.metadata, *shape, column)
            self._layouts[column] = lay
        return self._layouts[column]

    def _column(self, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row group, bytes of top-level `column` from the footer, in one pass: what a
        whole decode holds (`decode_sizes`), compressed (`packed_sizes`), uncompressed
        (`column_sizes`)."""
        sizes = self._sizes.get(column)
        if sizes is None:
            meta, leaves = self.metadata, self._leaves(column)
            out, chunks, plain = [], [], []
            for i in range(meta.num_row_groups):
                rg = meta.row_group(i)
                packed, decoded, pages = 0, 8 * rg.num_rows, 0
                for j in leaves:
                    col = rg.column(j)
                    width = _WIDTHS.get(col.physical_type, 0)
                    size = col.total_uncompressed_size
                    packed += col.total_compressed_size
                    pages += size
                    decoded += max(size, width * col.num_values)
                out.append(packed + _DECODE_FACTOR * decoded)
                chunks.append(packed)
                plain.append(pages)
            sizes = tuple(np.array(v, dtype=np.int64) for v in (out, chunks, plain))
            self._sizes[column] = sizes  # type: ignore[assignment]
        return sizes  # type: ignore[return-value]

    def decode_sizes(self, column: str) -> np.ndarray:
        """Bytes a whole decode of top-level `column` holds in each row group, from the
        footer: the compressed chunk, and `_DECODE_FACTOR` x the decoded data (the larger of
        the uncompressed pages and the values at their width, which dictionary encoding
        makes several times larger, plus 8 bytes a row of offsets)."""
        return self._column(column)[0]

    def packed_sizes(self, column: str) -> np.ndarray:
        """Compressed bytes of top-level `column` in each row group (read whole by any
        decode of the group, whole or of its first rows)."""
        return self._column(column)[1]

    def column_sizes(self, column: str) -> np.ndarray:
        """Uncompressed bytes of top-level `column` in each row group, from the footer."""
        return self._column(column)[2]


class ParquetReader(ColumnReader):
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
        self._budget: MemoryBudget | None = getattr(blocks, "budget", None)
        self._pending: list[Reservation] = []  # decodes handed out uncached, this fetch
        self._held: pq.ParquetFile | None = None
        self._local = not storage.is_url(path)
        try:
            if self._local:
                key = _version("parquet-footer", path, display)
                self._source = storage.open_input(path)
            else:  # an object: byte-range requests, staged per fetch
                # One metadata request: the size and version the cache key, the footer
                # read and the catalog's re-check all use (a rewrite since shows in the
                # fetch's re-check, which asks the store again after these reads).
                self.object = ranges.RangeFile(str(path), blocks)
                self._source = self.object.arrow_file()
                key = _object_key(str(path), self.object.version)
        except OSError as exc:
            raise _cannot_open(display, exc) from None
        meta = metacache.get(key)
        try:
            # A file may have changed between the stat and the open: its footer is then
            # parsed afresh from the file held open, and not kept.
            if self._local and _version("parquet-footer", path, display) != key:
                meta, key = None, None
            if meta is None:
                footer = _footer(self._source if self._local else self.object)
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
            checked = (column, kind, getattr(self, "images_column", None))
            if checked not in meta.checked:
                self._check_schema(meta.arrow_schema())
                meta.checked.add(checked)
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
        self,
        file_rows,
        offsets=None,
        lengths=None,
        keep: bool = True,
        pages=None,
        rent: bool = False,
        narrow: bool = False,
    ) -> list[Payload] | RowSlices:
        """Payloads of `file_rows`. Given where each row's values start in its row group and
        how many there are (`offsets`, `lengths`: a token list the plan locates by values),
        rows that are a small part of an uncached row group are read from its pages
        (`parquet_pages`; an object's from the bytes staged for the fetch); the rest decode
        row groups with pyarrow. Where any row is read from pages, all of them come as one
        RowSlices (`narrow`: as uint16 where they fit; rows decoded whole are copied in).
        `pages`: what `page_groups` just said for the same rows; `rent`: see `_paged`."""
        rows = _check_rows(file_rows, int(self.starts[-1]), self.display)
        if pages is None:
            pages = self._paged(rows, lengths, keep, rent) if offsets is not None else {}
        if not pages:
            return self._decoded(rows, keep)
        lay = self._meta.layout(self.column)
        source = self._source.fileno() if self._local else self.object
        parts: list[tuple[np.ndarray, Any]] = []
        done = np.zeros(len(rows), dtype=bool)
        most = self._budget.buffer if self._budget is not None else parquet_pages.WHOLE_CHUNK
        for i, pick in pages.items():
            # all the rows, in order, in one row group (a file's usual read): no copies
            every = len(pages) == 1 and len(pick) == len(rows)
            at, size = (offsets, lengths) if every else (offsets[pick], lengths[pick])
            page = min(_PAGE, int(self._meta.column_sizes(self.column)[i]))
            need = page + 3 * int(size.sum()) * lay.dtype.itemsize
            row = int(rows[pick[size.argmax()]])
            with self._reserve(need, i, row, "a page and the rows asked of row group"):
                ahead = self._read_ahead(lay, i, at, size, most)
                try:
                    values = parquet_pages.fetch_rows(
                        ahead or source,
                        lay,
                        i,
                        rows if every else rows[pick],
                        at,
                        size,
                        self.display,
                        most,
                        narrow,
                    )
                finally:
                    if ahead is not None:
                        ahead.close()
            if values is not None:  # else decoded whole below, where problems are named
                key = (self.column, i)
                self._meta.paged[key] = self._meta.paged.get(key, 0) + 1
                if every:
                    return values
                parts.append((pick, values))
                done[pick] = True
        rest = np.flatnonzero(~done)
        if len(rest):
            parts.append((rest, self._decoded(rows[rest], keep)))
        if len(parts) == 1 and len(parts[0][0]) == len(rows):
            return parts[0][1]  # one row group's rows (or none from pages), as asked
        joined = RowSlices.joined(parts, len(rows))
        return joined.narrow() if narrow else joined

    def _read_ahead(
        self, lay: parquet_pages.Layout, i: int, offsets, lengths, most: int
    ) -> ReadAhead | None:
        """For an object's row group too large to be fetched whole (`spans` stages none of
        it), its pages' requests made ahead of the page reads, several at once, within the
        reading thread's buffer (`most`): `object_read_ahead`. None for a file, or a group
        whose chunk is staged."""
        if self.object is None:
            return None
        chunk = lay.chunk(i)
        if chunk is None or not self._large(i):
            return None
        ends = offsets + lengths
        planned = parquet_pages.planned_reads(lay, i, offsets, ends, most)
        piece = min(most, max(_MIN_PIECE, most // _PIECES))
        return ReadAhead(self.object, planned, most, piece, more=chunk.start + chunk.size)

    def _decoded(self, rows: np.ndarray, keep: bool) -> list[Payload]:
        """`ColumnReader.fetch`: rows from decoded row groups; the reservations of groups
        decoded for these rows alone are released once the rows are copied out."""
        try:
            return super().fetch(rows, keep=keep)
        finally:
            while self._pending:
                self._pending.pop().release()

    def _reserve(
        self, nbytes: int, i: int, row: int, what: str = "row group"
    ) -> Reservation | contextlib.nullcontext:
        """Reserve `nbytes` of the budget for a decode of `what` of row group `i` for file
        row `row`; ConfigError naming them if that can never fit."""
        if self._budget is None:
            return contextlib.nullcontext()
        try:
            return self._budget.reserve(nbytes)
        except TooLarge as exc:
            unit = f"{what} {i} of column '{self.column}'"
            raise _too_large(self.display, row, unit, exc, self._budget) from None

    def _large(self, i: int) -> bool:
        """Whether a whole decode of row group `i` would take over 1/_LARGE of the room."""
        budget = self._budget
        if budget is None:
            return False
        return int(self._meta.decode_sizes(self.column)[i]) * _LARGE > budget.room

    def page_groups(
        self, file_rows, offsets=None, lengths=None, keep: bool = True, rent: bool = False
    ) -> dict[int, np.ndarray]:
        """The row groups a `fetch` of these rows would read from pages (Python work that
        holds the GIL, unlike pyarrow's decoding), with the positions of their rows: empty
        for none."""
        if offsets is None:
            return {}
        rows = _check_rows(file_rows, int(self.starts[-1]), self.display)
        return self._paged(rows, lengths, keep, rent)

    def _paged(
        self, rows: np.ndarray, lengths, keep: bool = True, rent: bool = False
    ) -> dict[int, np.ndarray]:
        """Positions of `rows` by row group, for the groups read from pages: groups of the
        token-list column whose pages are read here, not cached, where the rows hold
        under a quarter of the group's values (beyond that a whole decode in native code is
        as quick, and it serves later rows from cache), and, while the cache has room for
        the group, read from pages fewer than `_PAGED_READS` times: each read decompresses
        the pages again, so a group asked for again and again is decoded whole and cached
        (a read from pages costs about a third of a whole decode: renting until it would
        have paid for buying keeps the total within about twice the best choice). Of an
        object each read from pages fetches the chunk again, so while the cache has room a
        group that may be asked for again (`keep`) is decoded whole at once. `rent`: the
        rows asked include later samples' rows read ahead (`early_rows`), so each read from
        pages serves many steps, and a group decoded whole and cached would hold mostly
        rows taken already: always read from pages (a 64-source run held every group, 128
        MB, for no time gained)."""
        if lengths is None or self.kind != "token_ids" or not len(rows):
            return {}
        lay = self._meta.layout(self.column)
        if lay is None:
            return {}
        out = {}
        for i, pick in self._by_group(rows).items():
            chunk = lay.chunk(i)
            if chunk is None:
                continue
            if self._large(i):  # never decoded whole: from pages, however many rows
                out[i] = pick
                continue
            if _SPARSE * int(lengths[pick].sum()) >= chunk.num_values:
                continue
            if (
                not rent
                and (
                    self._meta.paged.get((self.column, i), 0) >= _PAGED_READS
                    or (keep and not self._local)
                )
                and self._room(i)  # the cheap tests first: a first read of a file skips this
            ):
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
        paged = offsets is not None and self.kind == "token_ids"
        lay = self._meta.layout(self.column) if paged else None
        out: list[tuple[int, int]] = []
        for i in np.unique(groups).tolist():
            if lay is not None and lay.chunk(i) is not None and self._large(i):
                continue  # read from its pages, each fetched as read: never staged whole
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
            while self._pending:  # the group before's rows are copied out: it is dropped
                self._pending.pop().release()
            res = self._reserve(self._decode_bytes(i, need, whole), i, row)
            try:
                block = self._read(i, need, whole, row, own=False)
            except BaseException:
                res.__exit__(None, None, None)
                raise
            if isinstance(res, Reservation):
                self._pending.append(res)
            return block
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
            with self._reserve(self._decode_bytes(i, need, whole), i, row) as res:
                block = self._read(i, need, whole, row)
                if res is None:
                    self._blocks.put(key, block, block.nbytes)
                else:
                    res.keep(key, block, block.nbytes)
        return block

    def _decode_bytes(self, i: int, need: int, whole: int) -> int:
        """Bytes a decode of the first `need` of row group `i`'s `whole` rows holds."""
        size = int(self._meta.decode_sizes(self.column)[i])
        if need >= whole:
            return size
        packed = int(self._meta.packed_sizes(self.column)[i])
        return packed + -(-(size - packed) * need // max(whole, 1))

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


def _image_struct(type_: pa.DataType) -> bool:
    """A `datasets.Image` struct: a binary `bytes` field (and usually a string `path`)."""
    if not pa.types.is_struct(type_):
        return False
    names = [type_.field(i).name for i in range(type_.num_fields)]
    if "bytes" not in names:
        return False
    kind = type_.field(names.index("bytes")).type
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


class _ImageTextBlock:
    """The text and image columns of one row group, kept as Arrow; only the rows asked
    become Python values."""

    def __init__(self, text: pa.Array, images: pa.Array, reader: ParquetImageTextReader):
        if pa.types.is_dictionary(text.type):
            text = text.dictionary_decode()
        self.text, self.images, self.reader = text, images, reader
        self.rows = len(text)
        self.nbytes = text.nbytes + images.nbytes

    def take(self, local: np.ndarray, rows: np.ndarray, where) -> list[ImageText]:
        index = pa.array(local, type=pa.int64())
        texts = self.text.take(index).to_pylist()
        images = self.images.take(index).to_pylist()
        column = self.reader.images_column
        out = []
        for text, value, r in zip(texts, images, rows.tolist(), strict=True):
            at = f"{self.reader.display} row {r}"
            if text is None:
                raise SourceDataError(f"{where(r)} is null")
            items = [] if value is None else value if isinstance(value, list) else [value]
            data, names = [], []
            for k, item in enumerate(items):
                name = f"{at}: column '{column}'[{k}]"
                if item is None:
                    continue  # a null image: none there
                if item.get("bytes") is not None:
                    data.append(item["bytes"])
                elif item.get("path"):
                    data.extend(_image_files(self.reader.root, [item["path"]], name))
                else:
                    raise SourceDataError(f"{name}: an image with neither bytes nor path")
                names.append(name)
            out.append(ImageText(text, data, names, at))
        return out


class ParquetImageTextReader(ParquetReader):
    """Image-text rows: the text column and the image column of each row group (images
    given by path, not bytes, are read under the data root)."""

    def __init__(self, path: Path, text: str, images: str, blocks: LRU, display: str, root=None):
        self.images_column, self.root = images, root
        super().__init__(path, "image_text", text, blocks, display)

    def _check_schema(self, schema: pa.Schema) -> None:
        for column in (self.column, self.images_column):
            if column not in schema.names:
                raise _missing_column(self.display, column, schema.names)
        _check_column_type(schema.field(self.column).type, "text", self.column, self.display)
        type_ = schema.field(self.images_column).type
        if pa.types.is_list(type_) or pa.types.is_large_list(type_):
            type_ = type_.value_type
        if not _image_struct(type_):
            raise SourceDataError(
                f"{self.display}: column '{self.images_column}' is "
                f"{schema.field(self.images_column).type}, not images (a struct of bytes and "
                "path, or a list of them)"
            )

    def spans(self, file_rows, offsets=None, lengths=None) -> list[tuple[int, int]]:
        if self.object is None:
            return []
        rows = np.asarray(file_rows, dtype=np.int64)
        rows = rows[(rows >= 0) & (rows < self.starts[-1])]
        groups = np.searchsorted(self.starts, rows, side="right") - 1
        out: list[tuple[int, int]] = []
        for i in np.unique(groups).tolist():
            need = int(rows[groups == i].max() - self.starts[i]) + 1
            block = self._blocks.get((self.path, "rg", i, self.column, self.kind))
            if block is None or block.rows < need:
                for column in (self.column, self.images_column):
                    out.extend(self._meta.chunk_spans(column)[i])
        return out

    def _room(self, i: int) -> bool:
        cache = self._blocks
        if cache.max_bytes is None:
            return True
        size = sum(int(self._meta.column_sizes(c)[i]) for c in (self.column, self.images_column))
        return cache.nbytes + size <= cache.max_bytes

    def _read(self, i: int, need: int, whole: int, row: int, own: bool = True):
        """Row group `i`'s text and images (whole: a row group of images is read as such)."""
        file = self._held if self._held is not None else self._parquet(self._meta.metadata)
        if self._local:
            self._held = file
        try:
            table = file.read_row_group(
                i, columns=[self.column, self.images_column], use_threads=False
            )
            text, images = (table.column(k).combine_chunks() for k in (0, 1))
            return _ImageTextBlock(text, images, self)
        except (OSError, pa.ArrowException) as exc:
            raise SourceDataError(
                f"{self.display} row {row} (row group {i}): cannot read ({_first_line(exc)})"
            ) from None
        finally:
            if file is not self._held:
                file.close()
