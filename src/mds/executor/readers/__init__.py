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

One module per format (`parquet`, `arrow`, `jsonl` for JSONL and JSONL.zst, `megatron`),
over what they share (`base`); this one opens the reader a source's format calls for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from mds.core import object_ranges as ranges
from mds.core import storage
from mds.core.index_manifest import FORMATS, PAYLOAD_KINDS
from mds.core.lru import LRU
from mds.executor.readers.arrow import ArrowObjectReader, ArrowReader
from mds.executor.readers.base import Handle, Payload
from mds.executor.readers.jsonl import JsonlReader, JsonlZstReader
from mds.executor.readers.megatron import MegatronReader
from mds.executor.readers.parquet import ParquetReader

__all__ = [
    "FORMATS",
    "PAYLOAD_KINDS",
    "ArrowObjectReader",
    "ArrowReader",
    "FileReader",
    "JsonlReader",
    "JsonlZstReader",
    "MegatronReader",
    "ParquetReader",
    "open_reader",
]


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
