"""Arrow IPC: rows of a file or stream, memory-mapped (`ArrowReader`) or, in object storage,
a record batch per range read (`ArrowObjectReader`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from mds.core import metacache
from mds.core import object_ranges as ranges
from mds.core.lru import LRU
from mds.errors import SourceDataError
from mds.executor.readers.base import ColumnReader, Handle
from mds.executor.readers.base import TextBlock as _TextBlock
from mds.executor.readers.base import TokenBlock as _TokenBlock
from mds.executor.readers.base import cannot_open as _cannot_open
from mds.executor.readers.base import check_column_type as _check_column_type
from mds.executor.readers.base import decoded_block as _block
from mds.executor.readers.base import file_version as _version
from mds.executor.readers.base import first_line as _first_line
from mds.executor.readers.base import missing_column as _missing_column
from mds.executor.readers.base import row_starts as _row_starts
from mds.formats import arrow_ipc as ipc_ranges

__all__ = ["ArrowObjectReader", "ArrowReader"]


class ArrowReader(ColumnReader):
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


class ArrowObjectReader(ColumnReader):
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
