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

One module per format (`parquet`, `arrow`, `jsonl` for JSONL and JSONL.zst, `megatron`,
`webdataset` for tar shards), over what they share (`base`); this one opens the reader a
source's format calls for. Image-text sources (WebDataset, Parquet, JSONL) give `ImageText`
payloads: the text and the images' encoded bytes.
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
from mds.executor.readers.base import Handle, ImageText, Payload
from mds.executor.readers.jsonl import JsonlReader, JsonlZstReader
from mds.executor.readers.megatron import MegatronReader
from mds.executor.readers.parquet import ParquetImageTextReader, ParquetReader
from mds.executor.readers.webdataset import WebDatasetReader

__all__ = [
    "FORMATS",
    "PAYLOAD_KINDS",
    "ArrowObjectReader",
    "ArrowReader",
    "IMAGE_TEXT",
    "FileReader",
    "ImageText",
    "JsonlReader",
    "JsonlZstReader",
    "MegatronReader",
    "ParquetImageTextReader",
    "ParquetReader",
    "WebDatasetReader",
    "open_reader",
]


IMAGE_TEXT = "image_text"  # the payload kind of image-text sources (docs/vision.md)
# image-text layouts and the formats that carry them
IMAGE_TEXT_LAYOUTS = {"webdataset": ("webdataset",), "parquet": ("parquet",)}
IMAGE_TEXT_LAYOUTS["jsonl"] = ("jsonl", "jsonl.zst")


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
    images: str | None = None,
    root: Path | str | None = None,
) -> FileReader:
    """Open the reader for a manifest source `fmt`; SourceDataError if the file is unusable.
    An image-text source (`payload_kind` "image_text") reads `column` as its text and
    `images` as its images (member extensions, column, or key of paths under `root`)."""
    if payload_kind == IMAGE_TEXT:
        return _open_image_text(fmt, path, column, images, blocks, display, root)
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


def _open_image_text(fmt, path, text, images, blocks, display, root) -> FileReader:
    if not text or not images or not isinstance(images, str):
        raise ValueError("an image-text reader needs the text and images of the payload")
    if fmt == "webdataset":
        return WebDatasetReader(path, text, images, display, blocks)
    if fmt == "parquet":
        return ParquetImageTextReader(path, text, images, blocks, display, root)
    if fmt == "jsonl":
        return JsonlReader(path, IMAGE_TEXT, text, display, blocks, images, root)
    if fmt == "jsonl.zst":
        return JsonlZstReader(path, IMAGE_TEXT, text, blocks, display, images, root)
    raise ValueError(f"format {fmt!r} holds no image-text samples (webdataset, parquet, jsonl)")
