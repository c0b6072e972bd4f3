"""Integer columns packed into one zstd frame: what a version-3 plan stores its blocks, file
tables and sections as (docs/plan-format.md, "Packed columns").

Each column is stored at the fewest whole bytes that hold its largest value, as byte planes
(every value's lowest byte, then every value's next byte, ...), so zstd sees runs of alike
bytes: the high planes of small or sorted values, the zeros of a sparse one. The frame is
made at a fixed level, single-threaded, with its content size: the same columns give the
same bytes. A plane of at least PLANE_BLOCK bytes gets a zstd block of its own, so its own
entropy code: the low byte of a row number and the high byte of a token count differ. A reader refuses a frame whose declared size exceeds what the caller expects, so
a forged plan cannot make it allocate more than its own bytes justify.
"""

from __future__ import annotations

import operator
import struct
import threading
from collections.abc import Sequence

import numpy as np
import zstandard

__all__ = [
    "LEVEL",
    "MAX_COLUMNS",
    "PLANE_BLOCK",
    "compress",
    "decompress",
    "frame_limit",
    "pack",
    "pack_raw",
    "raw_dictionary",
    "unpack",
    "unpack_raw",
    "unzigzag",
    "zigzag",
]

LEVEL = 9  # zstd level: fixed, it is part of the plan's bytes
PLANE_BLOCK = 2048  # a plane of at least this many bytes is a zstd block of its own
MAX_COLUMNS = 255  # columns a frame can hold (their number is a byte)
_COUNT = struct.Struct("<B")
_COLUMN = struct.Struct("<BQ")  # width in bytes (0..8), number of values
_HEADS: dict[int, struct.Struct] = {}
_EIGHT = np.uint64(8)
# A frame whose planes hold at most SMALL_PLANE values on average is decoded by one scatter
# of its planes into their values; larger planes are decoded plane by plane, which is then
# as fast (measured on 3, 4 and 8 columns of 9 to 512 values: break-even near 200).
SMALL_PLANE = 128
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


def _dict_decompressor(dictionary: zstandard.ZstdCompressionDict) -> zstandard.ZstdDecompressor:
    """A decompressor with `dictionary` loaded, kept for the next frame of the same one."""
    held = getattr(_local, "ddict", None)
    if held is None or held[0] is not dictionary:
        held = _local.ddict = (dictionary, zstandard.ZstdDecompressor(dict_data=dictionary))
    return held[1]


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


def raw_dictionary(content: bytes) -> zstandard.ZstdCompressionDict:
    """`content` as a zstd raw-content dictionary: earlier bytes a frame may copy from."""
    return zstandard.ZstdCompressionDict(content, dict_type=zstandard.DICT_TYPE_RAWCONTENT)


def compress(
    raw: bytes,
    dictionary: zstandard.ZstdCompressionDict | None = None,
    blocks: Sequence[bytes] = (),
) -> bytes:
    """One zstd frame of `raw` (or of the concatenated `blocks`, each ending a zstd block),
    at LEVEL, with its content size, copying from `dictionary` if given."""
    if dictionary is None:
        cctx = _compressor()
    else:
        cctx = zstandard.ZstdCompressor(
            level=LEVEL,
            dict_data=dictionary,
            write_content_size=True,
            write_checksum=False,
            write_dict_id=False,
            threads=0,
        )
    if not blocks:
        return cctx.compress(raw)
    cobj = cctx.compressobj(size=sum(len(b) for b in blocks))
    out = []
    for block in blocks:
        out.append(cobj.compress(block))
        out.append(cobj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))
    out.append(cobj.flush())
    return b"".join(out)


def frame_limit(stored: int) -> int:
    """The most a frame of `stored` bytes may decompress to when nothing else bounds it:
    2048 times its size, or 8 MiB."""
    return max(2048 * stored, 8 << 20)


def decompress(
    data: bytes | memoryview,
    limit: int,
    dictionary: zstandard.ZstdCompressionDict | None = None,
) -> bytes:
    """The frame's content; ValueError if it is not one zstd frame of at most `limit` bytes
    (its declared content size is checked before anything is allocated)."""
    try:
        size = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise ValueError(f"not a zstd frame ({exc})") from None
    if size < 0 or size > limit:
        raise ValueError("zstd frame of unknown or too large size")
    try:
        dctx = _decompressor() if dictionary is None else _dict_decompressor(dictionary)
        raw = dctx.decompress(data)
    except zstandard.ZstdError as exc:
        raise ValueError(f"bad zstd frame ({exc})") from None
    if len(raw) != size:
        raise ValueError("zstd frame shorter than its declared size")
    return raw


def pack_raw(columns: Sequence[np.ndarray]) -> list[bytes]:
    """The content of a pack() frame, as the parts it is compressed in: the head and the
    small planes run together, each plane of at least PLANE_BLOCK bytes on its own."""
    head = [_COUNT.pack(len(columns))]
    planes = []
    for column in columns:
        values = np.ascontiguousarray(column, dtype="<u8")
        width = _width(values)
        head.append(_COLUMN.pack(width, len(values)))
        if width:
            planes.extend(values.view(np.uint8).reshape(-1, 8)[:, :width].T)
    parts, run = [], [b"".join(head)]
    for plane in planes:
        if len(plane) >= PLANE_BLOCK:
            parts.append(b"".join(run))
            parts.append(plane.tobytes())
            run = []
        else:
            run.append(plane.tobytes())
    if run:
        parts.append(b"".join(run))
    return [part for part in parts if part]


def pack(columns: Sequence[np.ndarray]) -> bytes:
    """One zstd frame holding `columns` (non-negative integers, each of any length)."""
    parts = pack_raw(columns)
    return compress(parts[0], blocks=parts) if len(parts) > 1 else compress(parts[0])


def unpack(data: bytes | memoryview, count: int, limit: int) -> list[np.ndarray]:
    """The `count` uint64 columns of a pack() frame of at most `limit` bytes, each of at
    most `limit` bytes unpacked; ValueError for anything malformed."""
    return unpack_raw(decompress(data, limit), count, limit)


def _head(count: int) -> struct.Struct:
    """The struct of a frame's head for `count` columns: the count, each column's shape."""
    head = _HEADS.get(count)
    if head is None:
        head = _HEADS[count] = struct.Struct("<B" + "BQ" * count)
    return head


def unpack_raw(content: bytes | memoryview, count: int, limit: int) -> list[np.ndarray]:
    """The `count` uint64 columns of a pack() frame's content; ValueError if malformed."""
    if len(content) < _COUNT.size or content[0] != count:
        raise ValueError("packed columns: wrong number of columns")
    head = _head(count)
    if head.size > len(content):
        raise ValueError("packed columns: truncated header")
    fields = head.unpack_from(content)
    widths, lengths = fields[1::2], fields[2::2]
    if max(widths, default=0) > 8 or 8 * max(lengths, default=0) > limit:
        raise ValueError("packed columns: bad column width or length")
    end = head.size + sum(map(operator.mul, widths, lengths))
    if end > len(content):
        raise ValueError("packed columns: truncated")
    if end != len(content):
        raise ValueError("packed columns: trailing bytes")
    if end - head.size <= SMALL_PLANE * sum(widths):
        return _unpack_small(content, widths, lengths, head.size)
    raw = np.frombuffer(content, dtype=np.uint8)
    out, pos = [], head.size
    for width, n in zip(widths, lengths, strict=True):
        if not width:
            out.append(np.zeros(n, dtype=np.uint64))
            continue
        planes = raw[pos : pos + width * n].reshape(width, n)
        values = planes[width - 1].astype(np.uint64)
        for k in range(width - 2, -1, -1):  # whole planes, highest first: no strided copies
            values <<= _EIGHT
            values |= planes[k]
        out.append(values)
        pos += width * n
    return out


def _unpack_small(
    content: bytes | memoryview, widths: Sequence[int], lengths: Sequence[int], start: int
) -> list[np.ndarray]:
    """A small frame's columns (checked by unpack_raw) in one scatter of its planes into
    8-byte values: a few numpy calls, not two a plane (eight columns of 128 values: 15 us ->
    11)."""
    # Per plane, where its first byte goes in the values' bytes, less 8 times where it
    # starts in the planes: byte i of the planes goes to 8 i plus its plane's shift.
    shifts, sizes, at, pos = [], [], 0, 0
    for width, n in zip(widths, lengths, strict=True):
        for k in range(width):
            shifts.append(8 * at + k - 8 * pos)
            sizes.append(n)
            pos += n
        at += n
    values = np.zeros(at, dtype="<u8")
    if pos:
        where = np.repeat(np.array(shifts, dtype=np.intp), sizes)
        where += np.arange(0, 8 * pos, 8, dtype=np.intp)
        values.view(np.uint8)[where] = np.frombuffer(content, dtype=np.uint8, offset=start)
    out, at = [], 0
    for n in lengths:
        out.append(values[at : at + n])
        at += n
    return out
