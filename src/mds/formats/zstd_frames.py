"""Random access into a zstd file: a table of its frames, then reads that decompress only
the frames a byte range touches.

A zstd file is a sequence of independent frames; only a frame can be decompressed on its
own. The frame table is built by walking frame and block headers (RFC 8878), which costs
one small read per 128 KiB block and no decompression, except for a frame whose header
lacks Frame_Content_Size: that one is decompressed once to measure it. Skippable frames
(pzstd's size hints, the seekable format's seek table) are stepped over.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zstandard

from mds.core import metacache, storage
from mds.core.lru import LRU, version_key
from mds.errors import SourceDataError

__all__ = ["FrameTable", "ZstdSeekFile", "read_frame_table"]

_MAGIC = 0xFD2FB528
_SKIPPABLE_MASK, _SKIPPABLE = 0xFFFFFFF0, 0x184D2A50
_MAX_HEADER = 18  # magic 4 + descriptor 1 + window 1 + dictionary id 4 + content size 8
_BLOCK_MAX = 128 << 10  # RFC 8878: no block holds more than 128 KiB
_DID_SIZES = (0, 1, 2, 4)
_STREAM_READ = 1 << 20

Where = Callable[[int], str]


@dataclass(frozen=True, eq=False)
class FrameTable:
    """Where each data frame lies in the file and in the decompressed stream."""

    offsets: np.ndarray  # int64[n]: byte offset of the frame in the file
    sizes: np.ndarray  # int64[n]: compressed bytes of the frame
    starts: np.ndarray  # int64[n + 1]: decompressed offset of each frame; starts[-1] = total
    has_content_size: np.ndarray  # bool[n]: the header records Frame_Content_Size
    file_size: int
    skippable: int  # skippable frames stepped over

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def nbytes(self) -> int:
        """Memory held by the table's arrays."""
        arrays = (self.offsets, self.sizes, self.starts, self.has_content_size)
        return sum(a.nbytes for a in arrays)

    @property
    def total(self) -> int:
        """Bytes of the decompressed stream (all frames concatenated)."""
        return int(self.starts[-1])

    def content_size(self, i: int) -> int:
        return int(self.starts[i + 1] - self.starts[i])

    def frame_of(self, position: int) -> int:
        """The frame holding decompressed byte `position` (0 <= position < total)."""
        return int(np.searchsorted(self.starts, position, side="right")) - 1


Pread = Callable[[int, int], bytes]  # (size, offset) -> bytes, short at the end of the data


def _pread_of(fd: int) -> Pread:
    return lambda n, pos: os.pread(fd, n, pos)


class _Slice:
    """A read-only file-like window [start, start + size) of a file or an object."""

    def __init__(self, pread: Pread, start: int, size: int):
        self._pread, self._pos, self._end = pread, start, start + size

    def read(self, n: int = -1) -> bytes:
        n = self._end - self._pos if n < 0 else min(n, self._end - self._pos)
        data = self._pread(n, self._pos) if n > 0 else b""
        self._pos += len(data)
        return data


def _frame_header(head: bytes, pos: int, display: str, n: int) -> tuple[int, int | None, bool]:
    """Parse a frame header: (header size, content size or None, has checksum)."""
    if len(head) < 5:
        raise _truncated(display, n, pos)
    descriptor = head[4]
    if descriptor & 0x08:
        raise SourceDataError(
            f"{display}: corrupt zstd frame {n} at byte {pos} (reserved header bit set)"
        )
    single_segment = bool(descriptor & 0x20)
    fcs_size = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
    fcs_at = 5 + (0 if single_segment else 1) + _DID_SIZES[descriptor & 0x03]
    size = fcs_at + fcs_size
    if len(head) < size:
        raise _truncated(display, n, pos)
    if fcs_size == 0:
        return size, None, bool(descriptor & 0x04)
    content = int.from_bytes(head[fcs_at:size], "little") + (256 if fcs_size == 2 else 0)
    return size, content, bool(descriptor & 0x04)


def _truncated(display: str, n: int, pos: int) -> SourceDataError:
    return SourceDataError(
        f"{display}: truncated zstd file (frame {n} at byte {pos} is cut off by the end of file)"
    )


def _skip_blocks(pread: Pread, pos: int, file_size: int, display: str, n: int, start: int) -> int:
    """Walk a frame's block headers from `pos`; return the offset after its last block."""
    while True:
        head = pread(3, pos)
        if len(head) < 3:
            raise _truncated(display, n, start)
        value = int.from_bytes(head, "little")
        kind, size = (value >> 1) & 3, value >> 3
        if kind == 3 or size > _BLOCK_MAX:
            what = "reserved block type" if kind == 3 else f"block of {size} bytes"
            raise SourceDataError(
                f"{display}: corrupt zstd frame {n} at byte {start} ({what} at byte {pos})"
            )
        pos += 3 + (1 if kind == 1 else size)  # an RLE block stores its one byte
        if pos > file_size:
            raise _truncated(display, n, start)
        if value & 1:
            return pos


def _measure(
    dctx: zstandard.ZstdDecompressor, pread: Pread, start: int, size: int, where: str
) -> int:
    """Decompressed size of a frame whose header does not record it: decompress and count."""
    total = 0
    try:
        with dctx.stream_reader(_Slice(pread, start, size), read_across_frames=False) as reader:
            while chunk := reader.read(_STREAM_READ):
                total += len(chunk)
    except zstandard.ZstdError as exc:
        raise SourceDataError(f"{where} ({exc})") from None
    return total


def _walk(
    pread: Pread, file_size: int, display: str, dctx: zstandard.ZstdDecompressor
) -> FrameTable:
    """Build the frame table; the walk must end exactly at the end of the file."""
    offsets, sizes, contents, known = [], [], [], []
    pos = skippable = 0
    while pos < file_size:
        n = len(offsets)
        head = pread(_MAX_HEADER, pos)
        if len(head) < 4:
            raise _truncated(display, n, pos)
        magic = int.from_bytes(head[:4], "little")
        if magic & _SKIPPABLE_MASK == _SKIPPABLE:
            if len(head) < 8 or pos + 8 + int.from_bytes(head[4:8], "little") > file_size:
                raise SourceDataError(f"{display}: truncated skippable zstd frame at byte {pos}")
            pos += 8 + int.from_bytes(head[4:8], "little")
            skippable += 1
            continue
        if magic != _MAGIC:
            raise SourceDataError(
                f"{display}: not zstd data at byte {pos} (no frame magic number; "
                "corrupt, or not a zstd file)"
            )
        header, content, checksum = _frame_header(head, pos, display, n)
        end = _skip_blocks(pread, pos + header, file_size, display, n, pos) + (4 if checksum else 0)
        if end > file_size:
            raise _truncated(display, n, pos)
        known.append(content is not None)
        if content is None:
            where = f"{display}: corrupt zstd frame {n} at byte {pos}"
            content = _measure(dctx, pread, pos, end - pos, where)
        offsets.append(pos)
        sizes.append(end - pos)
        contents.append(content)
        pos = end
    starts = np.zeros(len(offsets) + 1, dtype=np.int64)
    np.cumsum(np.asarray(contents, dtype=np.int64), out=starts[1:])
    return FrameTable(
        offsets=np.asarray(offsets, dtype=np.int64),
        sizes=np.asarray(sizes, dtype=np.int64),
        starts=starts,
        has_content_size=np.asarray(known, dtype=bool),
        file_size=file_size,
        skippable=skippable,
    )


def _open(path: Path, display: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise SourceDataError(f"{display}: cannot open ({exc.strerror or exc})") from None


def read_frame_table(path: str | os.PathLike[str], display: str | None = None) -> FrameTable:
    """The frame table of a zstd file; SourceDataError if it is not well-formed zstd."""
    display = display or str(path)
    fd = _open(Path(path), display)
    try:
        return _walk(_pread_of(fd), os.fstat(fd).st_size, display, zstandard.ZstdDecompressor())
    finally:
        os.close(fd)


class ZstdSeekFile:
    """Byte ranges of a zstd file's decompressed stream, decompressing only the frames needed.

    Decompressed frames go into `blocks` under (path, "frame", i). A frame larger than the
    cache can hold is stream-decompressed up to the furthest byte a call needs, every call.

    Of an object (s3:// URL) reads are range requests: the frame table is walked over
    windows of _WALK_READ bytes read in order (one pass over the object, once per process
    while `metacache` keeps the table), a frame is read from the bytes staged for the fetch
    (`spans`) or with one request.
    """

    def __init__(self, path: Path | str, display: str, blocks: LRU):
        self.path, self.display, self._blocks = path, display, blocks
        self._dctx = zstandard.ZstdDecompressor()
        self._fd, self.object = -1, None
        if storage.is_url(path):
            from mds.core.object_ranges import RangeFile

            st = storage.stat(path)
            self.object = RangeFile(str(path), blocks)
            self._pread: Pread = lambda n, pos: self.object.read_at(n, pos)  # type: ignore[union-attr]
            walk: Pread = _Window(self.object.read_at)
        else:
            self._fd = _open(Path(path), display)
            st = os.fstat(self._fd)
            self._pread = walk = _pread_of(self._fd)
        # The frame table is kept in `metacache` (in `blocks` if larger than that cache)
        # apart from the handle, keyed by the file's identity and version: reopening the
        # file does not walk its headers again.
        key = version_key("zstd-frames", path, st)
        table = metacache.lookup(key, blocks)
        if table is None:
            try:
                table = _walk(walk, st.st_size, display, self._dctx)
            except BaseException:
                self.close()
                raise
            metacache.keep(key, table, table.nbytes, blocks)
        self.table = table

    def spans(self, offsets: np.ndarray, lengths: np.ndarray) -> list[tuple[int, int]]:
        """File byte spans of the frames these stream ranges touch that the block cache
        lacks (for staging an object's reads)."""
        out = []
        for frame in sorted(self._pieces(offsets, lengths)):
            if (self.path, "frame", frame) not in self._blocks:
                lo = int(self.table.offsets[frame])
                out.append((lo, lo + int(self.table.sizes[frame])))
        return out

    @property
    def size(self) -> int:
        """Bytes of the decompressed stream."""
        return self.table.total

    @property
    def fd(self) -> int:
        """The open file's descriptor (-1 for an object)."""
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self.object is not None:
            self.object.close()
            self.object = None

    def read_ranges(self, offsets: np.ndarray, lengths: np.ndarray, where: Where) -> list[bytes]:
        """Bytes [offset, offset + length) of the stream for each request, in request order.

        Ranges must lie inside the stream; `where(i)` describes request i for error messages.
        """
        if len(offsets) and (
            (offsets < 0).any() or (lengths < 0).any() or (offsets + lengths > self.size).any()
        ):
            raise ValueError(f"{self.display}: a range lies outside the {self.size}-byte stream")
        pieces = self._pieces(offsets, lengths)
        parts: list[list[bytes]] = [[] for _ in range(len(offsets))]
        for frame in sorted(pieces):
            requests = pieces[frame]
            for request, data in zip(
                requests, self._frame_pieces(frame, requests, where), strict=True
            ):
                parts[request[0]].append(data)
        return [b"".join(p) for p in parts]

    def _pieces(self, offsets: np.ndarray, lengths: np.ndarray) -> dict[int, list]:
        """Split each range by frame: {frame: [(request, lo, hi) within the frame]}."""
        starts = self.table.starts
        out: dict[int, list] = {}
        ends = offsets + lengths
        nonempty = np.flatnonzero(lengths > 0)
        first = np.searchsorted(starts, offsets[nonempty], side="right") - 1
        last = np.searchsorted(starts, ends[nonempty] - 1, side="right") - 1
        for i, a, b in zip(nonempty.tolist(), first.tolist(), last.tolist(), strict=True):
            lo, hi = int(offsets[i]), int(ends[i])
            for frame in range(a, b + 1):
                base, stop = int(starts[frame]), int(starts[frame + 1])
                if stop > base:
                    out.setdefault(frame, []).append(
                        (i, max(lo, base) - base, min(hi, stop) - base)
                    )
        return out

    def _frame_pieces(self, frame: int, requests: list, where: Where) -> list[bytes]:
        size = self.table.content_size(frame)
        if self._blocks.fits(size):
            data = self._frame_bytes(frame, requests[0][0], where)
            return [data[lo:hi] for _, lo, hi in requests]
        return self._stream_pieces(frame, requests, where)

    def _frame_error(self, frame: int, request: int, where: Where, exc: Exception) -> Exception:
        return SourceDataError(
            f"{self.display} {where(request)}: corrupt zstd frame {frame} at byte "
            f"{int(self.table.offsets[frame])} ({exc})"
        )

    def _frame_bytes(self, frame: int, request: int, where: Where) -> bytes:
        """The whole decompressed frame, from the cache or decompressed (and cached) now."""
        key = (self.path, "frame", frame)
        data = self._blocks.get(key)
        if data is not None:
            return data
        size = self.table.content_size(frame)
        compressed = self._pread(int(self.table.sizes[frame]), int(self.table.offsets[frame]))
        try:
            data = self._dctx.decompress(compressed, max_output_size=size)
        except zstandard.ZstdError as exc:
            raise self._frame_error(frame, request, where, exc) from None
        if len(data) != size:
            reason = f"{len(data)} bytes decompressed, {size} expected (file changed?)"
            raise self._frame_error(frame, request, where, ValueError(reason))
        self._blocks.put(key, data, len(data))
        return data

    def _stream_pieces(self, frame: int, requests: list, where: Where) -> list[bytes]:
        """Decompress the frame as a stream, once, keeping only the requested spans.

        It stops after the last span, so a checksum is only verified when that is the end.
        """
        spans = _merge(sorted((lo, hi) for _, lo, hi in requests))
        got: dict[int, bytes] = {}
        source = _Slice(self._pread, int(self.table.offsets[frame]), int(self.table.sizes[frame]))
        position = 0
        try:
            with self._dctx.stream_reader(source, read_across_frames=False) as reader:
                for lo, hi in spans:
                    _skip(reader, lo - position)
                    got[lo] = _read_exact(reader, hi - lo)
                    position = hi
                if position == self.table.content_size(frame) and reader.read(1):
                    raise EOFError("frame holds more data than its header says")
        except (zstandard.ZstdError, EOFError) as exc:
            raise self._frame_error(frame, requests[0][0], where, exc) from None
        starts = [lo for lo, _ in spans]
        out = []
        for _, lo, hi in requests:
            span = starts[int(np.searchsorted(starts, lo, side="right")) - 1]
            out.append(got[span][lo - span : hi - span])
        return out


_WALK_READ = 8 << 20


class _Window:
    """Reads in order through a window of _WALK_READ bytes: walking an object's frame and
    block headers costs a request per window, not one per header."""

    def __init__(self, read_at: Pread):
        self._read_at, self._lo, self._data = read_at, 0, b""

    def __call__(self, n: int, pos: int) -> bytes:
        if not (self._lo <= pos and pos + n <= self._lo + len(self._data)):
            self._lo, self._data = pos, self._read_at(max(n, _WALK_READ), pos)
        return self._data[pos - self._lo : pos - self._lo + n]


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Union of sorted half-open spans."""
    merged: list[tuple[int, int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _skip(reader, n: int) -> None:
    while n > 0:
        chunk = reader.read(min(n, _STREAM_READ))
        if not chunk:
            raise EOFError("frame ends early")
        n -= len(chunk)


def _read_exact(reader, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = reader.read(n - len(out))
        if not chunk:
            raise EOFError("frame ends early")
        out += chunk
    return bytes(out)
