"""JSONL and zstd-compressed JSONL: lines located by byte offset and length (in the
decompressed stream for .zst), each checked to be a whole line and parsed for its payload.

An image-text line names its images by path (relative to the data root) or URL, under the
source's images key (a string or a list); they are read after the line (`image_files`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from mds.core import object_ranges as ranges
from mds.core import storage
from mds.core.lru import LRU
from mds.errors import SourceDataError
from mds.executor.readers.base import BaseReader, Handle, ImageText, Payload
from mds.executor.readers.base import cannot_open as _cannot_open
from mds.executor.readers.base import image_files as _image_files
from mds.formats.zstd_frames import ZstdSeekFile

__all__ = ["JsonlReader", "JsonlZstReader"]


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


def _parse_line(
    raw: bytes, kind: str, column: str, where: str, images: str | None = None
) -> Payload | tuple[str, list[str]]:
    """The payload of one JSONL line: field `column` of the object, checked for `kind`; an
    image-text line's (text, image paths), `images` naming the key of its paths."""
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
    if kind == "image_text":
        paths = obj.get(images or "")
        paths = [] if paths is None else [paths] if isinstance(paths, str) else paths
        if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
            raise SourceDataError(
                f"{where}: field '{images}' is {_describe(paths)}, not an image path or a "
                "list of them"
            )
        return value, paths
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


class _LineReader(BaseReader):
    """Lines located by (byte offset, byte length); subclasses read raw byte ranges.

    Each line is read with one byte either side, which must be a newline (or the start or
    end of the data): a cheap check that the file still has its lines where the index says.
    """

    display: str
    kind: str
    column: str
    size: int
    what = "file"
    images: str | None = None  # image_text: the key of the image paths
    root: Path | str | None = None  # image_text: what relative image paths are under

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
            at = f"{self.display} {where(i)}"
            payload = _parse_line(line, self.kind, self.column, at, self.images)
            if isinstance(payload, tuple):
                text, paths = payload
                data = _image_files(self.root, paths, at)
                names = [f"{at} image {p!r}" for p in paths]
                payload = ImageText(text, data, names, at)
            out.append(payload)
        return out


class JsonlReader(_LineReader):
    """Lines of a plain JSONL file, one positioned read each; of an object, the blocks that
    hold them, read together and kept in the block cache (ranges.RangeFile)."""

    def __init__(
        self, path: Path, kind: str, column: str, display: str, blocks: LRU, images=None, root=None
    ):
        self.kind, self.column, self.display = kind, column, display
        self.images, self.root = images, root
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

    def __init__(
        self, path: Path, kind: str, column: str, blocks: LRU, display: str, images=None, root=None
    ):
        self.kind, self.column, self.display = kind, column, display
        self.images, self.root = images, root
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
