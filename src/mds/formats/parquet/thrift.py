"""Parquet page headers: just enough of the Thrift compact protocol to read a PageHeader; the
one ULEB128 varint reader (Thrift's integers, the RLE/bit-packed hybrid's run headers,
snappy's length); and the split of a v1 page's level sections.

Shared by the indexer (list lengths from levels) and the executor (rows from pages); both
fall back to pyarrow on anything they do not decode (`Unsupported`).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "DATA_PAGE",
    "DATA_PAGE_V2",
    "DICTIONARY_PAGE",
    "INDEX_PAGE",
    "RLE",
    "Compact",
    "Truncated",
    "Unsupported",
    "field_int",
    "field_struct",
    "length_prefixed",
    "page_fields",
    "varint",
    "varints",
]

# Enums of parquet.thrift: PageType and Encoding.
DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 1, 2, 3
RLE = 3

# Thrift compact protocol type ids.
_T_TRUE, _T_FALSE, _T_BYTE, _T_I16, _T_I32, _T_I64 = 1, 2, 3, 4, 5, 6
_T_DOUBLE, _T_BINARY, _T_LIST, _T_SET, _T_MAP, _T_STRUCT, _T_UUID = 7, 8, 9, 10, 11, 12, 13
_MAX_NESTING = 32


class Unsupported(Exception):
    """The file uses something this fast path does not decode; the caller falls back."""


class Truncated(Exception):
    """A page header or a page's compressed start runs past the bytes read so far."""


class Compact:
    """A Thrift compact-protocol reader over `buf` from `pos`."""

    def __init__(self, buf: memoryview, pos: int):
        self.buf, self.pos = buf, pos

    def byte(self) -> int:
        if self.pos >= len(self.buf):
            raise Truncated
        value = self.buf[self.pos]
        self.pos += 1
        return value

    def skip_bytes(self, n: int) -> None:
        if n < 0:
            raise Unsupported("negative length")
        if self.pos + n > len(self.buf):
            raise Truncated
        self.pos += n

    def varint(self) -> int:
        value, self.pos = varint(self.buf, self.pos)
        return value

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def struct(self, nested: frozenset[int] = frozenset(), depth: int = 0) -> dict:
        """Integer and bool fields by id; the ids in `nested` are read as structs too."""
        fields, self.pos = _struct(self.buf, self.pos, nested, depth)
        return fields

    def skip(self, kind: int, depth: int) -> None:
        if depth > _MAX_NESTING:
            raise Unsupported("Thrift nesting too deep")
        if kind in (_T_BYTE, _T_TRUE, _T_FALSE):  # bools take a byte only inside containers
            self.skip_bytes(1)
        elif kind in (_T_I16, _T_I32, _T_I64):
            self.varint()
        elif kind == _T_DOUBLE:
            self.skip_bytes(8)
        elif kind == _T_UUID:
            self.skip_bytes(16)
        elif kind == _T_BINARY:
            self.skip_bytes(self.varint())
        elif kind in (_T_LIST, _T_SET):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self.skip(head & 0x0F, depth + 1)
        elif kind == _T_MAP:
            size = self.varint()
            types = self.byte() if size else 0
            for _ in range(size):
                self.skip(types >> 4, depth + 1)
                self.skip(types & 0x0F, depth + 1)
        elif kind == _T_STRUCT:
            self.struct(depth=depth + 1)
        else:
            raise Unsupported(f"Thrift compact type {kind}")


def page_fields(buf: memoryview, pos: int) -> tuple[dict, int]:
    """The PageHeader at `pos` as fields by id (its data_page_header, dictionary_page_header
    and data_page_header_v2 as nested dicts) and the header's size in bytes."""
    fields, end = _struct(buf, pos, _PAGE_HEADER_STRUCTS, 0)
    return fields, end - pos


_PAGE_HEADER_STRUCTS = frozenset({5, 7, 8})


def varint(buf, pos: int, longest: int = 10) -> tuple[int, int]:
    """The unsigned (ULEB128) varint at `pos` and where it ends: Truncated where `buf` ends
    first, Unsupported where it is longer than `longest` bytes (10 hold 64 bits, 5 hold 32)."""
    value = shift = 0
    size, limit = len(buf), 7 * longest
    while True:
        if pos >= size:
            raise Truncated
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift >= limit:
            raise Unsupported("varint too long")


def varints(data: np.ndarray, longest: int) -> tuple[np.ndarray, np.ndarray]:
    """`varint` at every byte of `data` at once: the value and byte length of the varint
    starting there (length 0: none ends within `longest` bytes, at most 9: values below
    2^63). One that `data` cuts short is read as if zero bytes followed: its end (start +
    length) is then past the end of `data`, which the caller checks. For a reader that must
    parse a varint wherever one might start (`rle.scan`)."""
    # Masks multiply instead of indexing: random masks make np.where and boolean indexing slow.
    n = data.size
    padded = np.concatenate([data, np.zeros(longest, np.uint8)])
    value = (padded[:n] & 0x7F).astype(np.int64)
    length = np.ones(n, np.uint8)
    more = padded[:n] >= 0x80
    for i in range(1, longest):
        if not more.any():
            break
        byte = padded[i : n + i]
        value |= ((byte & 0x7F) * more.view(np.uint8)).astype(np.int64) << (7 * i)
        length += more.view(np.uint8)
        more &= byte >= 0x80
    length[more] = 0
    return value, length


def _struct(buf, pos: int, nested: frozenset[int], depth: int) -> tuple[dict, int]:
    """The struct at `pos` (`Compact.struct`) and where it ends. Written as functions over
    the bytes, not methods per byte: a page is read for a few rows, and a method call per
    byte made its two headers cost about as much as picking the rows' indices."""
    if depth > _MAX_NESTING:
        raise Unsupported("Thrift nesting too deep")
    size = len(buf)
    fields: dict = {}
    last = 0
    while True:
        if pos >= size:
            raise Truncated
        b = buf[pos]
        pos += 1
        if b == 0:
            return fields, pos
        kind, delta = b & 0x0F, b >> 4
        if delta:
            last += delta
        else:  # a field id that does not fit the delta: a zigzag i16 follows
            n, pos = varint(buf, pos)
            last = (n >> 1) ^ -(n & 1)
        if _T_I16 <= kind <= _T_I64 or kind == _T_BINARY:  # a varint: zigzag or a length
            if pos < size and buf[pos] < 0x80:  # one byte, the most common: no call
                n = buf[pos]
                pos += 1
            else:
                n, pos = varint(buf, pos)
            if kind == _T_BINARY:
                pos += n
                if pos > size:
                    raise Truncated
            else:
                fields[last] = (n >> 1) ^ -(n & 1)
        elif kind == _T_TRUE or kind == _T_FALSE:
            fields[last] = kind == _T_TRUE
        elif kind == _T_STRUCT:
            inner, pos = _struct(buf, pos, frozenset(), depth + 1)
            if last in nested:
                fields[last] = inner
        elif kind == _T_BYTE:
            if pos >= size:
                raise Truncated
            fields[last] = buf[pos]
            pos += 1
        else:
            reader = Compact(buf, pos)
            reader.skip(kind, depth)
            pos = reader.pos


def field_int(fields: dict, key: int) -> int:
    value = fields.get(key)
    if type(value) is not int or value < 0:
        raise Unsupported(f"PageHeader field {key} is missing or invalid")
    return value


def field_struct(fields: dict, key: int) -> dict:
    value = fields.get(key)
    if not isinstance(value, dict):
        raise Unsupported(f"PageHeader field {key} is missing")
    return value


def length_prefixed(data: memoryview, pos: int) -> tuple[memoryview, int]:
    """A v1 page's level section at `pos` (a 4-byte length, then the levels), and where the
    next section starts."""
    if pos + 4 > len(data):
        raise Unsupported("level data runs past the page")
    end = pos + 4 + int.from_bytes(data[pos : pos + 4], "little")
    if end > len(data):
        raise Unsupported("level data runs past the page")
    return data[pos + 4 : end], end
