"""An image's size in pixels from its header alone, without decoding it: JPEG (the first
start-of-frame segment, found by walking the segments), PNG (IHDR), WebP (VP8, VP8L,
VP8X), GIF (the logical screen) and BMP (the DIB header).

The size is the stored one, as Pillow's `Image.open(...).size` reports it (a JPEG's EXIF
orientation is not applied). Damaged or unknown data raises ImageHeaderError; data cut off
before the size raises its subclass Truncated, which says how many leading bytes the
parse needs to go on (`read_image_size` reads a prefix of a file and grows it on that).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["FIRST_READ", "ImageHeaderError", "Truncated", "image_size", "read_image_size"]

# Leading bytes read first: every header but a JPEG's after a large EXIF/ICC segment fits.
FIRST_READ = 64 << 10
# JPEG start-of-frame markers: C0..CF except DHT (C4), JPG (C8) and DAC (CC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# JPEG markers without a length field: TEM, RST0..7, SOI (a second one) and fill.
_STANDALONE = frozenset([0x01, *range(0xD0, 0xD9)])


_SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"RIFF", b"GIF87a", b"GIF89a", b"BM")


class ImageHeaderError(ValueError):
    """The bytes are not an image whose size this module reads."""


class Truncated(ImageHeaderError):
    """The data ends before the size: `needed` leading bytes let the parse go on."""

    def __init__(self, what: str, needed: int):
        super().__init__(f"{what} is cut off (needs {needed} bytes to read its size)")
        self.needed = needed


def _need(data: bytes, n: int, what: str) -> None:
    if len(data) < n:
        raise Truncated(what, n)


def _u16be(data: bytes, at: int) -> int:
    return (data[at] << 8) | data[at + 1]


def _u16le(data: bytes, at: int) -> int:
    return data[at] | (data[at + 1] << 8)


def _jpeg(data: bytes) -> tuple[int, int]:
    pos = 2
    while True:
        _need(data, pos + 2, "JPEG")
        if data[pos] != 0xFF:
            raise ImageHeaderError(f"JPEG: no marker at byte {pos}")
        while data[pos + 1] == 0xFF:  # fill bytes before a marker
            pos += 1
            _need(data, pos + 2, "JPEG")
        marker = data[pos + 1]
        if marker in _STANDALONE:
            pos += 2
            continue
        if marker in (0x00, 0xD9, 0xDA):
            raise ImageHeaderError(f"JPEG: no frame header before marker FF{marker:02X}")
        _need(data, pos + 4, "JPEG")
        length = _u16be(data, pos + 2)
        if length < 2:
            raise ImageHeaderError(f"JPEG: segment FF{marker:02X} has length {length}")
        if marker in _SOF:
            _need(data, pos + 9, "JPEG")
            if length < 7:
                raise ImageHeaderError(f"JPEG: frame header of length {length}")
            height, width = _u16be(data, pos + 5), _u16be(data, pos + 7)
            return width, height
        pos += 2 + length


def _png(data: bytes) -> tuple[int, int]:
    _need(data, 24, "PNG")
    if data[12:16] != b"IHDR":
        raise ImageHeaderError("PNG: the first chunk is not IHDR")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _webp(data: bytes) -> tuple[int, int]:
    _need(data, 16, "WebP")
    chunk = data[12:16]
    if chunk == b"VP8 ":
        _need(data, 30, "WebP")
        if data[23:26] != b"\x9d\x01\x2a":
            raise ImageHeaderError("WebP: VP8 frame without its start code")
        return _u16le(data, 26) & 0x3FFF, _u16le(data, 28) & 0x3FFF
    if chunk == b"VP8L":
        _need(data, 25, "WebP")
        if data[20] != 0x2F:
            raise ImageHeaderError("WebP: VP8L chunk without its signature")
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        _need(data, 30, "WebP")
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    raise ImageHeaderError(f"WebP: unknown first chunk {bytes(chunk)!r}")


def _bmp(data: bytes) -> tuple[int, int]:
    _need(data, 18, "BMP")
    header = int.from_bytes(data[14:18], "little")
    if header == 12:  # OS/2 BITMAPCOREHEADER: unsigned 16-bit sides
        _need(data, 22, "BMP")
        return _u16le(data, 18), _u16le(data, 20)
    if header < 40:
        raise ImageHeaderError(f"BMP: unknown header size {header}")
    _need(data, 26, "BMP")
    width = int.from_bytes(data[18:22], "little", signed=True)
    height = int.from_bytes(data[22:26], "little", signed=True)
    return width, abs(height)  # a negative height is a top-down bitmap


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels of the image whose leading bytes are `data`."""
    if data[:3] == b"\xff\xd8\xff":
        size = _jpeg(data)
    elif data[:8] == b"\x89PNG\r\n\x1a\n":
        size = _png(data)
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        size = _webp(data)
    elif data[:6] in (b"GIF87a", b"GIF89a"):
        _need(data, 10, "GIF")
        size = _u16le(data, 6), _u16le(data, 8)
    elif data[:2] == b"BM":
        size = _bmp(data)
    elif len(data) < 12 and (
        data[:4] == b"RIFF" or any(sig.startswith(bytes(data)) for sig in _SIGNATURES)
    ):
        raise Truncated("image", 12)
    else:
        raise ImageHeaderError("not a JPEG, PNG, WebP, GIF or BMP image")
    if size[0] <= 0 or size[1] <= 0:
        raise ImageHeaderError(f"image of {size[0]}x{size[1]} pixels")
    return size


def read_image_size(read: Callable[[int], bytes]) -> tuple[int, int]:
    """image_size of a file or object of which `read(n)` returns the first n bytes (fewer
    at its end): FIRST_READ bytes first, more only when the header needs them."""
    want = FIRST_READ
    while True:
        data = read(want)
        try:
            return image_size(data)
        except Truncated as exc:
            if len(data) < want or exc.needed <= len(data):
                raise
            want = max(exc.needed, 2 * want)
