"""WebDataset tar shards: a sample is read by its byte range in the tar (from its first
member's header, long-name or pax header included, to the end of its last member's padded
data), whose headers are parsed without extracting anything (`mds.formats.tar`).

The sample's text is the member with the source's text extension (`txt`), or a key of its
`.json` member (`json:KEY`); its images are the members whose extension's last dot-part is
one of the source's image extensions, in archive order. A range that does not start with a
tar header, holds members of more than one key, or is cut off means the file is not what
was indexed: SourceDataError naming the file and the sample.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from mds.core import object_ranges as ranges
from mds.core import storage
from mds.core.lru import LRU
from mds.errors import SourceDataError
from mds.executor.readers.base import BaseReader, Handle, ImageText
from mds.executor.readers.base import cannot_open as _cannot_open
from mds.formats import tar

__all__ = ["WebDatasetReader", "image_extensions", "text_spec"]


def text_spec(text: str) -> tuple[str, str | None]:
    """(member extension, JSON key or None) of a source's `text`: "txt" or "json:caption"."""
    if text.startswith("json:"):
        return "json", text[len("json:") :]
    return text.lower(), None


def image_extensions(images: str) -> frozenset[str]:
    """The `;`-separated image extensions of a source, lower case."""
    return frozenset(e.strip().lower().lstrip(".") for e in images.split(";") if e.strip())


class WebDatasetReader(BaseReader):
    """Samples of one tar shard by byte range: one positioned read each for a file; for an
    object, the blocks that hold them, read together and kept in the block cache."""

    def __init__(self, path: Path | str, text: str, images: str, display: str, blocks: LRU):
        self.display = display
        self.text_ext, self.json_key = text_spec(text)
        self.image_exts = image_extensions(images)
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
        """The blocks holding these samples that the block cache lacks, for an object."""
        if self.object is None or offsets is None or lengths is None:
            return []
        offsets = np.clip(np.asarray(offsets, dtype=np.int64), 0, self.size)
        lengths = np.clip(np.asarray(lengths, dtype=np.int64), 0, self.size - offsets)
        return self.object.missing(offsets.tolist(), lengths.tolist())

    def fetch(self, file_rows, offsets, lengths) -> list[ImageText]:
        if offsets is None or lengths is None:
            raise ValueError("a WebDataset reader needs the byte offsets and lengths of samples")
        rows = np.asarray(file_rows, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        bad = np.flatnonzero(
            (offsets < 0) | (lengths <= 0) | (offsets > self.size) | (lengths > self.size - offsets)
        )
        if len(bad):
            i = int(bad[0])
            raise SourceDataError(
                f"{self.display} sample {int(rows[i])} (bytes {int(offsets[i])}+{int(lengths[i])}) "
                f"is beyond the end of the file ({self.size} bytes; file changed since indexing?)"
            )
        if self.object is not None:
            raws = self.object.read_ranges(offsets, lengths)
        else:
            raws = [
                os.pread(self._fd, int(n), int(s)) for s, n in zip(offsets, lengths, strict=True)
            ]
        return [
            self._sample(raw, int(rows[i]), int(offsets[i]), int(lengths[i]))
            for i, raw in enumerate(raws)
        ]

    def _sample(self, raw: bytes, row: int, offset: int, length: int) -> ImageText:
        where = f"{self.display} sample {row} (bytes {offset}+{length})"
        if len(raw) != length:
            raise SourceDataError(f"{where}: read {len(raw)} bytes (file changed since indexing?)")

        def read(pos: int, size: int) -> bytes:
            return raw[pos : pos + size]

        key = None
        text: str | None = None
        images: list[bytes] = []
        names: list[str] = []
        try:
            for m in tar.members(read, 0, length, where):
                k, ext = tar.split_key(m.name)
                if key is None:
                    key = k
                    where = f"{self.display} sample {key!r} (bytes {offset}+{length})"
                elif k != key:
                    raise SourceDataError(
                        f"{where}: holds members of another sample ({m.name!r}; file changed "
                        "since indexing?)"
                    )
                if m.offset + m.size > length:
                    raise SourceDataError(f"{where}: member {m.name!r} is cut off")
                ext = ext.lower()
                if ext.rsplit(".", 1)[-1] in self.image_exts:
                    images.append(raw[m.offset : m.offset + m.size])
                    names.append(f"{where} member {m.name!r}")
                elif ext == self.text_ext:
                    text = self._text(raw[m.offset : m.offset + m.size], f"{where} {m.name!r}")
        except SourceDataError as exc:
            if str(exc).startswith(where):
                raise
            raise SourceDataError(f"{exc} (file changed since indexing?)") from None
        if key is None:
            raise SourceDataError(f"{where}: no tar member there (file changed since indexing?)")
        return ImageText(text if text is not None else "", images, names, where)

    def _text(self, data: bytes, where: str) -> str:
        try:
            value = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SourceDataError(f"{where}: invalid UTF-8 at byte {exc.start}") from None
        if self.json_key is None:
            return value
        try:
            obj = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SourceDataError(f"{where}: invalid JSON ({exc.msg})") from None
        text = obj.get(self.json_key) if isinstance(obj, dict) else None
        if not isinstance(text, str):
            raise SourceDataError(f"{where}: has no text at key {self.json_key!r}")
        return text

    def close(self) -> None:
        if self.object is not None:
            self.object.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
