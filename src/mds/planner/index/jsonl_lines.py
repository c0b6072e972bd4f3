"""The bytes of a JSONL source: a file or an object, plain or a concatenation of zstd
frames, read in pieces that end on a newline; where its lines start and end (LF positions
found a block at a time), which lines are blank, and refusal of bare-CR line endings.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
import zstandard

from mds.core import storage
from mds.errors import SourceDataError
from mds.planner.index.discover import DataFile

__all__ = [
    "BARE_CR",
    "ZstdFrames",
    "blank_lines",
    "line_spans",
    "newline_chunks",
    "newlines",
    "open_jsonl",
    "refuse_cr_only",
    "spans",
]

_RAW_READ = 1 << 20


class ZstdFrames:
    """Read a concatenation of zstd frames, raising on a truncated last frame.

    zstandard's stream_reader returns a short read on truncation; this does not.
    """

    def __init__(self, raw: BinaryIO, name: str):
        self._raw, self._name = raw, name
        self._dctx = zstandard.ZstdDecompressor()
        self._obj = None
        self._pending = b""

    def read(self, _size: int = -1) -> bytes:
        while True:
            data = self._pending or self._raw.read(_RAW_READ)
            self._pending = b""
            if not data:
                if self._obj is not None and not self._obj.eof:
                    raise SourceDataError(f"{self._name}: truncated zstd frame")
                return b""
            if self._obj is None or self._obj.eof:
                self._obj = self._dctx.decompressobj()
            try:
                out = self._obj.decompress(data)
            except zstandard.ZstdError as exc:
                raise SourceDataError(f"{self._name}: corrupt zstd data ({exc})") from None
            if self._obj.eof:
                self._pending = self._obj.unused_data
            if out:
                return out


def newline_chunks(stream, chunk_bytes: int) -> Iterator[tuple[int, bytes]]:
    """Yield (offset, bytes) pieces of the stream that end on a newline (or at EOF)."""
    base, carry = 0, b""
    while True:
        block = stream.read(chunk_bytes)
        if not block:
            if carry:
                yield base, carry
            return
        buf = carry + block if carry else block
        if len(buf) < chunk_bytes:
            carry = buf
            continue
        cut = buf.rfind(b"\n")
        if cut < 0:
            carry = buf
            continue
        yield base, buf[: cut + 1]
        base += cut + 1
        carry = buf[cut + 1 :]


_NEWLINE_BLOCK = 1 << 20


def newlines(arr: np.ndarray) -> np.ndarray:
    """Positions of the LF bytes, compared a block at a time so the mask stays in cache.

    Lines are mostly far longer than 8 bytes, so a block's mask is first read as 64-bit
    words and only the few words holding an LF are searched byte by byte: a nonzero over an
    eighth of the elements, plus a small gather. A block dense with LFs is searched whole.
    """
    mask = np.empty(min(len(arr), _NEWLINE_BLOCK), dtype=bool)
    found = []
    for at in range(0, len(arr), _NEWLINE_BLOCK):
        m = mask[: min(_NEWLINE_BLOCK, len(arr) - at)]
        np.equal(arr[at : at + len(m)], 10, out=m)
        whole = len(m) & ~7
        words = np.flatnonzero(m[:whole].view(np.uint64) != 0)
        if len(words) > whole >> 5:  # over a quarter of the words: search every byte
            found.append(np.flatnonzero(m) + at)
            continue
        hits = np.flatnonzero(m[:whole].reshape(-1, 8)[words])
        found.append((words[hits >> 3] << 3) + (hits & 7) + at)
        if whole < len(m):
            found.append(np.flatnonzero(m[whole:]) + (at + whole))
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def line_spans(chunk) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each line of a bytes-like buffer; the last may end without LF."""
    return spans(newlines(np.frombuffer(chunk, dtype=np.uint8)), len(chunk))


def spans(ends: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each line of `size` bytes with LFs at `ends`."""
    if not len(ends) or ends[-1] != size - 1:
        ends = np.append(ends, size)
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    return starts.astype(np.int64), (ends - starts).astype(np.int64)


_WHITESPACE = np.frombuffer(b" \t\r\x0b\x0c", dtype=np.uint8)


def blank_lines(chunk: bytes, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Lines that hold only whitespace: not samples, but they keep their line numbers.

    Only a line that starts with whitespace can be blank, so only those few are inspected.
    """
    blank = lengths == 0
    if len(starts) == 0:
        return blank
    arr = np.frombuffer(chunk, dtype=np.uint8)
    first = np.zeros(len(starts), dtype=bool)
    present = ~blank
    first[present] = np.isin(arr[starts[present]], _WHITESPACE)
    for i in np.flatnonzero(first):
        if not chunk[starts[i] : starts[i] + lengths[i]].strip():
            blank[i] = True
    return blank


def open_jsonl(file: DataFile):
    if storage.is_url(file.path):  # an object: read in order, a range request per chunk
        raw = storage.open_input(file.path)
        return raw, (ZstdFrames(raw, file.rel) if file.format == "jsonl.zst" else raw)
    try:
        raw = open(file.path, "rb")  # noqa: SIM115 - closed by the caller
    except OSError as exc:
        raise SourceDataError(f"{file.rel}: cannot open ({exc.strerror or exc})") from None
    return raw, (ZstdFrames(raw, file.rel) if file.format == "jsonl.zst" else raw)


BARE_CR = re.compile(rb"\r[ \t\r]*[^\s]")


def refuse_cr_only(chunk: bytes, file: DataFile) -> None:
    """Refuse a file whose lines end in a bare CR (classic Mac OS): read as one line it would
    fail far from the cause. A chunk holds no LF only when the whole rest of the file has none."""
    if b"\n" not in chunk and BARE_CR.search(chunk):
        raise SourceDataError(
            f"{file.rel}: lines end in a bare CR (classic Mac OS line endings), which JSONL "
            "does not support; convert them to LF (or CRLF)"
        )
