"""Integer columns packed into one zstd frame: what a version-3 plan stores its blocks, file
tables and sections as (docs/plan-format.md, "Packed columns").

Each column is stored at the fewest whole bytes that hold its largest value, as byte planes
(every value's lowest byte, then every value's next byte, ...), so zstd sees runs of alike
bytes: the high planes of small or sorted values, the zeros of a sparse one. The frame is
made at a fixed level, single-threaded, with its content size: the same columns give the
same bytes. A reader refuses a frame whose declared size exceeds what the caller expects, so
a forged plan cannot make it allocate more than its own bytes justify.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence

import numpy as np
import zstandard

__all__ = ["LEVEL", "frame_limit", "pack", "unpack", "unzigzag", "zigzag"]

LEVEL = 9  # zstd level: fixed, it is part of the plan's bytes
_COUNT = struct.Struct("<B")
_COLUMN = struct.Struct("<BQ")  # width in bytes (0..8), number of values
_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    cctx = getattr(_local, "cctx", None)
    if cctx is None:
        cctx = zstandard.ZstdCompressor(
            level=LEVEL, write_content_size=True, write_checksum=False, threads=0
        )
        _local.cctx = cctx
    return cctx


def _decompressor() -> zstandard.ZstdDecompressor:
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


def zigzag(x: np.ndarray) -> np.ndarray:
    """Signed int64 to uint64, small magnitudes to small values: 0, -1, 1, -2 -> 0, 1, 2, 3."""
    x = np.asarray(x, dtype=np.int64)
    return ((x << 1) ^ (x >> 63)).view(np.uint64)


def unzigzag(u: np.ndarray) -> np.ndarray:
    u = np.asarray(u, dtype=np.uint64)
    return ((u >> np.uint64(1)).view(np.int64)) ^ -((u & np.uint64(1)).view(np.int64))


def _width(values: np.ndarray) -> int:
    peak = int(values.max(initial=0)) if len(values) else 0
    return (peak.bit_length() + 7) // 8


def compress(raw: bytes) -> bytes:
    return _compressor().compress(raw)


def frame_limit(stored: int) -> int:
    """The most a frame of `stored` bytes may decompress to when nothing else bounds it:
    2048 times its size, or 8 MiB."""
    return max(2048 * stored, 8 << 20)


def decompress(data: bytes | memoryview, limit: int) -> bytes:
    """The frame's content; ValueError if it is not one zstd frame of at most `limit` bytes
    (its declared content size is checked before anything is allocated)."""
    try:
        size = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise ValueError(f"not a zstd frame ({exc})") from None
    if size < 0 or size > limit:
        raise ValueError("zstd frame of unknown or too large size")
    try:
        raw = _decompressor().decompress(data)
    except zstandard.ZstdError as exc:
        raise ValueError(f"bad zstd frame ({exc})") from None
    if len(raw) != size:
        raise ValueError("zstd frame shorter than its declared size")
    return raw


def pack(columns: Sequence[np.ndarray]) -> bytes:
    """One zstd frame holding `columns` (non-negative integers, each of any length)."""
    head = [_COUNT.pack(len(columns))]
    planes = []
    for column in columns:
        values = np.ascontiguousarray(column, dtype="<u8")
        width = _width(values)
        head.append(_COLUMN.pack(width, len(values)))
        if width:
            planes.append(values.view(np.uint8).reshape(-1, 8)[:, :width].T.tobytes())
    return compress(b"".join(head + planes))


def unpack(data: bytes | memoryview, count: int, limit: int) -> list[np.ndarray]:
    """The `count` uint64 columns of a pack() frame of at most `limit` bytes, each of at
    most `limit` bytes unpacked; ValueError for anything malformed."""
    raw = memoryview(decompress(data, limit))
    if len(raw) < _COUNT.size or _COUNT.unpack_from(raw)[0] != count:
        raise ValueError("packed columns: wrong number of columns")
    pos, shapes = _COUNT.size + count * _COLUMN.size, []
    if pos > len(raw):
        raise ValueError("packed columns: truncated header")
    for k in range(count):
        width, n = _COLUMN.unpack_from(raw, _COUNT.size + k * _COLUMN.size)
        if width > 8 or n * 8 > limit:
            raise ValueError("packed columns: bad column width or length")
        shapes.append((width, n))
    out = []
    for width, n in shapes:
        if pos + width * n > len(raw):
            raise ValueError("packed columns: truncated")
        planes = np.frombuffer(raw[pos : pos + width * n], dtype=np.uint8).reshape(width, n)
        values = planes[0].astype(np.uint64) if width else np.zeros(n, dtype=np.uint64)
        for k in range(1, width):  # whole planes at a time: no strided byte copies
            values |= planes[k].astype(np.uint64) << np.uint64(8 * k)
        out.append(values)
        pos += width * n
    if pos != len(raw):
        raise ValueError("packed columns: trailing bytes")
    return out
