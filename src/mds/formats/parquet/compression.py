"""Page bodies decompressed: whole (`decompress`), or only as far as a reader needs
(`PREFIX_DECODERS`: the level reader wants a v1 page's first few KB, its levels, not the
~1 MB of values that follow)."""

from __future__ import annotations

import threading
import zlib

import pyarrow as pa
import zstandard

from mds.formats.parquet.thrift import Truncated, Unsupported, varint

__all__ = ["PREFIX_DECODERS", "decompress", "levels_end"]

_LENGTH_BYTES = 5  # snappy's uncompressed length: a 32-bit ULEB128 varint


# pa.decompress makes a Codec a call; one is made per thread instead (a gzip Codec keeps a
# stream between calls, so threads do not share them)
_codecs = threading.local()


def decompress(body, size: int, codec: str | None) -> memoryview:
    """A page body (or a v2 page's values) decompressed to its `size` bytes, as unsigned
    bytes."""
    if codec is None:
        data = memoryview(body)
    else:
        try:
            made = getattr(_codecs, codec, None)
            if made is None:
                made = pa.Codec(codec)
                setattr(_codecs, codec, made)
            data = memoryview(made.decompress(body, decompressed_size=size))
        except (pa.ArrowException, OSError) as exc:  # e.g. an LZ4 framing we do not expect
            raise Unsupported(f"cannot decompress a page: {exc}") from None
    if len(data) != size:
        raise Unsupported("page size differs from its header")
    return data.cast("B") if data.format != "B" else data


def levels_end(out) -> int:
    """Bytes the level sections of a v1 page take, as far as `out` (its start) tells."""
    if len(out) < 4:
        return 4
    rep_end = 8 + int.from_bytes(out[:4], "little")
    if len(out) < rep_end:
        return rep_end
    return rep_end + int.from_bytes(out[rep_end - 4 : rep_end], "little")


# Each prefix decoder takes the start of a page body and `need`, which maps the output so
# far to the number of output bytes wanted (it only grows); it returns at least that many,
# raises Truncated if the input ran out first and Unsupported for anything else.


def _plain_prefix(src: bytes, need) -> memoryview:
    if len(src) < need(src):
        raise Truncated
    return memoryview(src)


def _snappy_tables() -> list[tuple[int, int]]:
    """Per snappy tag byte: the bytes its element takes and the bytes it outputs; (0, 0) for
    the literals whose length follows the tag."""
    table = []
    for tag in range(256):
        kind, high = tag & 3, tag >> 2
        if kind == 0:  # literal of high + 1 bytes, or of a length in high - 59 more bytes
            table.append((2 + high, high + 1) if high < 60 else (0, 0))
        else:  # copy with a 1-, 2- or 4-byte offset
            table.append(((0, 2, 3, 5)[kind], 4 + (high & 7) if kind == 1 else high + 1))
    return table


_SNAPPY_TAGS = _snappy_tables()
_SNAPPY_LONGEST = 61  # bytes of the longest element whose length is in its tag


def _snappy_prefix(src: bytes, need) -> memoryview:
    """The start of a raw snappy stream (format_description.txt in google/snappy).

    The elements are parsed here (a Python loop over bytes is cheaper than numpy for the few
    thousand elements of a page's levels), stopping at the first element that reaches
    `need`; pyarrow then decompresses just those, re-framed as a stream of that length.
    It does the copies (overlapping ones too) and rejects offsets of 0 or past the output,
    so a corrupt stream cannot return wrong bytes. A literal that runs past `src` is taken
    as far as it goes.
    """
    total, pos = varint(src, 0, _LENGTH_BYTES)
    if total >> 32:
        raise Unsupported("snappy length too large")
    base, made, wanted, size = pos, 0, need(_snappy_head(src, pos)), len(src)
    tags, safe = _SNAPPY_TAGS, size - _SNAPPY_LONGEST  # before `safe` no bounds to check
    while True:
        if wanted > total:
            raise Unsupported("snappy stream shorter than the level data")
        cut = -1  # where the literal that runs past `src` starts
        while made < wanted:
            if pos < safe:
                taken, out_bytes = tags[src[pos]]
                if taken:
                    pos += taken
                    made += out_bytes
                    continue
            if pos >= size:
                raise Truncated
            tag = src[pos]
            taken, length = tags[tag]
            if taken:
                if pos + taken <= size:
                    pos += taken
                    made += length
                    continue
                if tag & 3:
                    raise Truncated
                start = pos + 1
            else:
                start = pos + (tag >> 2) - 58  # the tag, then (tag >> 2) - 59 length bytes
                if start > size:
                    raise Truncated
                length = int.from_bytes(src[pos + 1 : start], "little") + 1
                if start + length <= size:
                    pos = start + length
                    made += length
                    continue
            if made + length > total:
                raise Unsupported("snappy literal past the stream's length")
            cut = start
            break
        if made > total:
            raise Unsupported("snappy elements past the stream's length")
        out = _snappy_elements(src[base:pos], made)
        if cut >= 0:
            out = memoryview(bytes(out) + src[cut:])
        wanted = need(out)
        if len(out) >= wanted:
            return out
        if cut >= 0:
            raise Truncated


def _snappy_head(src: bytes, pos: int) -> bytes:
    """The bytes of the literal at `pos` (as far as `src` goes), if one is there: the start
    of the output, which often tells `need` enough without decompressing anything."""
    if pos >= len(src) or src[pos] & 3:
        return b""
    high = src[pos] >> 2
    if high < 60:
        return src[pos + 1 : pos + 2 + high]
    start = pos + high - 58
    return src[start : start + int.from_bytes(src[pos + 1 : start], "little") + 1]


def _snappy_elements(elements: bytes, size: int) -> memoryview:
    """Decompress whole snappy elements that output `size` bytes."""
    if size == 0:
        return memoryview(b"")
    stream = _uvarint_bytes(size) + elements
    try:
        return memoryview(pa.decompress(stream, decompressed_size=size, codec="snappy"))
    except (pa.ArrowException, OSError) as exc:  # pyarrow raises a plain OSError for these
        raise Unsupported(f"corrupt snappy data: {exc}") from None


def _uvarint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _zstd_prefix(src: bytes, need) -> memoryview:
    out = b""
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(src)
        while len(out) < (wanted := need(out)):
            piece = reader.read(wanted - len(out))
            if not piece:
                raise Truncated  # or the frame ended: then the whole page decides
            out += piece
    except zstandard.ZstdError as exc:
        raise Unsupported(f"corrupt zstd data: {exc}") from None
    return memoryview(out)


def _gzip_prefix(src: bytes, need) -> memoryview:
    out, pending = b"", src
    stream = zlib.decompressobj(wbits=47)  # a gzip or zlib header, as pyarrow accepts
    try:
        while len(out) < (wanted := need(out)):
            piece = stream.decompress(pending, wanted - len(out))
            if not piece and len(stream.unconsumed_tail) >= len(pending):
                if stream.eof:
                    raise Unsupported("gzip stream ends before the level data")
                raise Truncated
            pending = stream.unconsumed_tail
            out += piece
    except (zlib.error, EOFError) as exc:
        raise Unsupported(f"corrupt gzip data: {exc}") from None
    return memoryview(out)


# Codecs whose pages can be decompressed partway; the others are decompressed whole.
PREFIX_DECODERS = {
    None: _plain_prefix,
    "snappy": _snappy_prefix,
    "zstd": _zstd_prefix,
    "gzip": _gzip_prefix,
}
