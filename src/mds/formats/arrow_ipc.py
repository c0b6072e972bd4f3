"""Arrow IPC files and streams read by byte ranges (objects in a store, where a memory map
is not to be had): a walk over the message headers lists the record batches, where each
lies and how many rows it holds; a batch is then one range read, decoded on its own.

The walk reads each message's metadata (a flatbuffer, parsed here for the message kind,
its body length and a batch's row count) and steps over the body, so it costs a small read
per batch, or one per 64 KiB window of small batches, never the bodies. Dictionary batches
(dictionary-encoded columns) would need the batches before them: refused.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from mds.errors import SourceDataError

__all__ = ["BatchTable", "read_batch", "read_batch_table"]

Pread = Callable[[int, int], bytes]  # (size, offset) -> bytes

_MAGIC = b"ARROW1"
_CONTINUATION = b"\xff\xff\xff\xff"
_SCHEMA, _DICTIONARY, _RECORD_BATCH = 1, 2, 3
_WINDOW = 64 << 10


@dataclass(frozen=True, eq=False)
class BatchTable:
    """The record batches of an IPC file or stream: schema, where each message lies, rows."""

    schema: pa.Schema
    offsets: np.ndarray  # int64: byte offset of each record batch's message
    sizes: np.ndarray  # int64: bytes of the message (prefix, metadata and body)
    rows: np.ndarray  # int64: rows of each batch

    @property
    def nbytes(self) -> int:
        return self.offsets.nbytes + self.sizes.nbytes + self.rows.nbytes + 1024


class _Window:
    """Reads through a window of at least _WINDOW bytes, so small messages cost no request
    each."""

    def __init__(self, read: Pread):
        self._read, self._lo, self._data = read, 0, b""

    def __call__(self, n: int, pos: int) -> bytes:
        if not (self._lo <= pos and pos + n <= self._lo + len(self._data)):
            self._lo, self._data = pos, self._read(max(n, _WINDOW), pos)
        return self._data[pos - self._lo : pos - self._lo + n]


def _field(buf: bytes, table: int, i: int) -> int | None:
    """Position of field `i` of the flatbuffer table at `table`, or None if absent."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    at = 4 + 2 * i
    if at >= struct.unpack_from("<H", buf, vtable)[0]:
        return None
    offset = struct.unpack_from("<H", buf, vtable + at)[0]
    return table + offset if offset else None


def _message_facts(meta: bytes) -> tuple[int, int, int]:
    """(header kind, body length, rows of a record batch) of a Message flatbuffer."""
    root = struct.unpack_from("<I", meta, 0)[0]
    kind_at, header_at, body_at = (_field(meta, root, i) for i in (1, 2, 3))
    kind = meta[kind_at] if kind_at is not None else 0
    body = struct.unpack_from("<q", meta, body_at)[0] if body_at is not None else 0
    rows = 0
    if kind == _RECORD_BATCH and header_at is not None:
        header = header_at + struct.unpack_from("<I", meta, header_at)[0]
        length_at = _field(meta, header, 0)
        rows = struct.unpack_from("<q", meta, length_at)[0] if length_at is not None else 0
    return kind, body, rows


def read_batch_table(read: Pread, size: int, display: str) -> BatchTable:
    """Walk the messages of an IPC file or stream of `size` bytes; SourceDataError naming
    `display` if it is not well-formed."""
    end = size
    pos = 0
    if size >= 8 and read(6, 0) == _MAGIC:  # the file format: a stream between magics
        tail = read(10, size - 10)
        if len(tail) < 10 or tail[4:] != _MAGIC:
            raise SourceDataError(f"{display}: not a readable Arrow IPC file (no footer)")
        end = size - 10 - struct.unpack_from("<i", tail, 0)[0]
        pos = 8
    window = _Window(read)
    schema = None
    offsets, sizes, rows = [], [], []
    try:
        while pos + 4 <= end:
            head = window(8, pos)
            prefix = 8 if head[:4] == _CONTINUATION else 4
            meta_len = struct.unpack_from("<i", head, prefix - 4)[0]
            if meta_len == 0:  # end of stream
                break
            meta = window(meta_len, pos + prefix)
            if meta_len < 0 or len(meta) < meta_len:
                raise ValueError(f"message at byte {pos} is cut off")
            kind, body, count = _message_facts(meta)
            total = prefix + meta_len + body
            if pos + total > end or body < 0:
                raise ValueError(f"message at byte {pos} runs past the end")
            if kind == _SCHEMA:
                schema = pa.ipc.read_schema(pa.py_buffer(head[:prefix] + meta))
            elif kind == _DICTIONARY:
                raise SourceDataError(
                    f"{display}: dictionary-encoded Arrow IPC data is not read from object "
                    "storage; copy it to a file system and point the data root there"
                )
            elif kind == _RECORD_BATCH:
                offsets.append(pos)
                sizes.append(total)
                rows.append(count)
            pos += total
    except (ValueError, struct.error, IndexError, pa.ArrowException) as exc:
        raise SourceDataError(
            f"{display}: not a readable Arrow IPC file or stream ({exc})"
        ) from None
    if schema is None:
        raise SourceDataError(f"{display}: not a readable Arrow IPC file or stream (no schema)")
    as_array = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731
    return BatchTable(schema, as_array(offsets), as_array(sizes), as_array(rows))


def read_batch(table: BatchTable, i: int, read: Pread) -> pa.RecordBatch:
    """Record batch `i`: one range read of its message, decoded."""
    data = read(int(table.sizes[i]), int(table.offsets[i]))
    message = pa.ipc.read_message(pa.py_buffer(data))
    return pa.ipc.read_record_batch(message, table.schema)
