"""Image sizes from headers agree with Pillow's `Image.open(...).size` for every format and
many sizes; damaged, cut-off and foreign data raise ImageHeaderError."""

from __future__ import annotations

import io
import struct

import pytest

from mds.formats.image_header import (
    FIRST_READ,
    ImageHeaderError,
    Truncated,
    image_size,
    read_image_size,
)

Image = pytest.importorskip("PIL.Image")

SIZES = [(1, 1), (2, 3), (32, 32), (17, 301), (640, 480), (1200, 800), (1, 4000), (3000, 7)]
FORMATS = {
    "jpeg": {},
    "jpeg-progressive": {"progressive": True, "optimize": True},
    "jpeg-cmyk": {},
    "png": {},
    "png-palette": {},
    "webp-lossy": {"lossless": False},
    "webp-lossless": {"lossless": True},
    "gif": {},
    "bmp": {},
}


def _encode(kind: str, size: tuple[int, int]) -> bytes:
    w, h = size
    mode = {"jpeg-cmyk": "CMYK", "png-palette": "P", "gif": "P"}.get(kind, "RGB")
    image = Image.new(mode, size)
    if mode == "RGB":  # some content, so encoders do not special-case a flat image
        image.putdata(
            [((x * 7) % 256, (y * 5) % 256, (x + y) % 256) for y in range(h) for x in range(w)]
        )
    out = io.BytesIO()
    fmt = kind.split("-")[0].upper()
    image.save(out, format=fmt, **FORMATS[kind])
    return out.getvalue()


@pytest.mark.parametrize("kind", list(FORMATS))
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_size_matches_pillow(kind: str, size: tuple[int, int]) -> None:
    if kind.startswith("webp") and max(size) > 16383:
        pytest.skip("beyond WebP's limit")
    data = _encode(kind, size)
    assert image_size(data) == Image.open(io.BytesIO(data)).size == size


def test_webp_extended_header() -> None:
    """An image with an alpha channel or metadata is written with a VP8X chunk."""
    image = Image.new("RGBA", (321, 123), (10, 20, 30, 128))
    out = io.BytesIO()
    image.save(out, format="WEBP", exif=b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x00")
    data = out.getvalue()
    assert data[12:16] == b"VP8X"
    assert image_size(data) == Image.open(io.BytesIO(data)).size == (321, 123)


def test_jpeg_after_large_segments_and_exif_orientation() -> None:
    """The frame header after a 60 KB comment and EXIF that says "rotate": the stored size."""
    image = Image.new("RGB", (300, 100), (200, 10, 10))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees
    out = io.BytesIO()
    image.save(out, format="JPEG", exif=exif.tobytes(), comment=b"x" * 60000)
    data = out.getvalue()
    assert image_size(data) == Image.open(io.BytesIO(data)).size == (300, 100)
    # a reader that only hands out prefixes is asked for more when the first one is short
    asked: list[int] = []

    def read(n: int) -> bytes:
        asked.append(n)
        return data[:n]

    padded = data[:2] + b"\xff\xfe\xff\xff" + b"c" * 65533 + data[2:]  # another 64 KB comment
    assert read_image_size(lambda n: padded[:n]) == (300, 100)
    assert read_image_size(read) == (300, 100)
    assert asked == [FIRST_READ]


def test_jpeg_fill_bytes_and_restart_markers() -> None:
    data = _encode("jpeg", (40, 30))
    patched = data[:2] + b"\xff\xff\xff\xd0" + data[2:]  # fill bytes, then a standalone marker
    assert image_size(patched) == (40, 30)


def test_bmp_top_down_and_os2() -> None:
    data = bytearray(_encode("bmp", (33, 21)))
    struct.pack_into("<i", data, 22, -21)
    assert image_size(bytes(data)) == (33, 21)
    core = b"BM" + bytes(12) + struct.pack("<IHHHH", 12, 50, 60, 1, 24)
    assert image_size(core) == (50, 60)


@pytest.mark.parametrize("kind", ["jpeg", "png", "webp-lossy", "webp-lossless", "gif", "bmp"])
def test_cut_off_header_says_truncated(kind: str) -> None:
    data = _encode(kind, (64, 48))
    for cut in range(0, 40 if kind != "jpeg" else 200):
        prefix = data[:cut]
        try:
            got = image_size(prefix)
        except Truncated as exc:
            assert exc.needed > cut
            continue
        assert got == (64, 48)  # enough of the header was there


@pytest.mark.parametrize(
    "data",
    [
        b"not an image at all, just text",
        b"\xff\xd8\xff\xd9" + bytes(20),  # SOI then EOI: no frame
        b"\xff\xd8\xff\xda\x00\x08" + bytes(20),  # scan before any frame header
        b"\xff\xd8\xff\xe0\x00\x01" + bytes(20),  # segment length below 2
        b"\xff\xd8\xff\xe0\x00\x10" + bytes(14) + b"\x00\x00",  # no marker after a segment
        b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\x0dIEND" + bytes(12),
        b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\x0dIHDR" + bytes(12),  # 0x0 pixels
        b"RIFF\x00\x00\x00\x00WEBPVP8 " + bytes(14),  # no start code
        b"RIFF\x00\x00\x00\x00WEBPVP8L" + bytes(9),  # no signature
        b"RIFF\x00\x00\x00\x00WEBPABCD" + bytes(14),
        b"BM" + bytes(12) + struct.pack("<I", 20) + bytes(20),
        b"GIF89a\x00\x00\x05\x00",
    ],
)
def test_garbage_is_refused(data: bytes) -> None:
    with pytest.raises(ImageHeaderError):
        image_size(data)


def test_errors_are_value_errors() -> None:
    assert issubclass(ImageHeaderError, ValueError)
    with pytest.raises(Truncated):
        image_size(b"")
    with pytest.raises(Truncated, match="needs"):
        read_image_size(lambda n: _encode("png", (5, 5))[:20])
