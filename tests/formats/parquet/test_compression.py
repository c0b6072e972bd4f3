"""Page bodies decompressed only as far as a reader needs: for every codec, the start of the
page as pyarrow decompresses it (never wrong bytes), Truncated where the input runs out first,
Unsupported for anything malformed."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from builders import uleb as _uleb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mds.formats.parquet.compression import PREFIX_DECODERS, decompress
from mds.formats.parquet.levels import levels_end
from mds.formats.parquet.thrift import Truncated, Unsupported

FAST = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
PREFIX_CODECS = ["none", "snappy", "zstd", "gzip"]



def _compress(data: bytes, codec: str) -> bytes:
    return data if codec == "none" else pa.compress(data, codec=codec, asbytes=True)


def _decoder(codec: str):
    return PREFIX_DECODERS[None if codec == "none" else codec]


def _fixed(n: int):
    return lambda out: n


# Random bytes give literals; repeated short patterns give copies, many overlapping their
# own output (offset < length).
SEGMENT = st.binary(max_size=300) | st.tuples(
    st.binary(min_size=1, max_size=9), st.integers(1, 400)
)
PAYLOAD = st.lists(SEGMENT, max_size=12).map(
    lambda segments: b"".join(s if isinstance(s, bytes) else s[0] * s[1] for s in segments)
)


@FAST
@given(data=PAYLOAD, frac=st.floats(0, 1), cut=st.floats(0, 1))
def test_snappy_prefix_matches_pyarrow(data: bytes, frac: float, cut: float) -> None:
    stream = _compress(data, "snappy")
    for n in (round(frac * len(data)), len(data)):
        out = PREFIX_DECODERS["snappy"](stream, _fixed(n))
        assert len(out) >= n and bytes(out) == data[: len(out)]
    # The start of the stream only: enough output or _Truncated, never wrong bytes.
    try:
        out = PREFIX_DECODERS["snappy"](stream[: round(cut * len(stream))], _fixed(n))
    except Truncated:
        return
    assert len(out) >= n and bytes(out) == data[: len(out)]


def _levels_page(rng, rep: int, dfn: int, rest: int) -> bytes:
    """The start of a v1 page: length-prefixed rep and def levels, then the values."""
    parts = [rng.integers(0, 4, size).astype(np.uint8).tobytes() for size in (rep, dfn)]
    values = rng.integers(0, 256, rest).astype(np.uint8).tobytes()
    return b"".join(len(p).to_bytes(4, "little") + p for p in parts) + values


@FAST
@given(
    codec=st.sampled_from(PREFIX_CODECS),
    sizes=st.tuples(st.integers(0, 20000), st.integers(0, 3000), st.integers(0, 20000)),
    seed=st.integers(0, 2**32 - 1),
    cut=st.floats(0, 1),
)
def test_prefix_decoders_reach_the_end_of_the_levels(codec, sizes, seed, cut) -> None:
    page = _levels_page(np.random.default_rng(seed), *sizes)
    end = 8 + sizes[0] + sizes[1]
    stream, decode = _compress(page, codec), _decoder(codec)
    out = decode(stream, levels_end)
    assert len(out) >= end and bytes(out) == page[: len(out)]
    try:
        out = decode(stream[: round(cut * len(stream))], levels_end)
    except Truncated:
        return
    assert len(out) >= end and bytes(out) == page[: len(out)]


_varint = _uleb  # a snappy stream starts with its length as a ULEB128 varint


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        # Long-form literals (60: 1 length byte ... 63: 4), even where a short form fits.
        (_varint(7) + bytes([60 << 2, 6]) + b"abcdefg", b"abcdefg"),
        (_varint(3) + bytes([61 << 2, 2, 0]) + b"xyz", b"xyz"),
        (_varint(2) + bytes([62 << 2, 1, 0, 0]) + b"pq", b"pq"),
        (_varint(1) + bytes([63 << 2, 0, 0, 0, 0]) + b"z", b"z"),
        # Copies with 1-, 2- and 4-byte offsets, overlapping their output.
        (_varint(10) + b"\x04ab" + bytes([1 | 4 << 2, 2]), b"abababababab"[:10]),
        (_varint(9) + b"\x08abc" + bytes([2 | 5 << 2, 3, 0]), b"abcabcabc"),
        (_varint(12) + b"\x0cabcd" + bytes([3 | 7 << 2, 4, 0, 0, 0]), b"abcd" * 3),
        (_varint(6) + b"\x00a" + bytes([1 | 1 << 2, 1]), b"aaaaaa"),
    ],
)
def test_snappy_prefix_element_forms(stream: bytes, expected: bytes) -> None:
    assert pa.decompress(stream, len(expected), codec="snappy").to_pybytes() == expected
    for n in range(len(expected) + 1):
        out = PREFIX_DECODERS["snappy"](stream, _fixed(n))
        assert len(out) >= n and bytes(out) == expected[: len(out)]


@pytest.mark.parametrize(
    ("stream", "n", "error"),
    [
        (_varint(5) + b"\x00a" + bytes([1, 0]), 5, "Unsupported"),  # copy offset 0
        (_varint(5) + b"\x00a" + bytes([1, 2]), 5, "Unsupported"),  # offset past the output
        (_varint(9) + b"\x08abc" + bytes([2 | 5 << 2, 4, 0]), 9, "Unsupported"),
        (_varint(9) + b"\x08abc" + bytes([3 | 5 << 2, 0, 1, 0, 0]), 9, "Unsupported"),
        (_varint(5) + b"\x00a" + bytes([1]), 5, "Truncated"),  # offset byte missing
        (_varint(5) + b"\x00a" + bytes([3 | 3 << 2, 1, 0]), 5, "Truncated"),
        (_varint(100) + bytes([61 << 2, 5]), 1, "Truncated"),  # length bytes missing
        (_varint(100) + b"\x10abc", 6, "Truncated"),  # literal cut short
        (_varint(100) + b"\x10abcde", 3, None),  # ... which is enough
        (b"\x80", 1, "Truncated"),  # stream length cut short
        (b"\x80" * 5 + b"\x01", 1, "Unsupported"),  # stream length over 5 bytes
        (b"\xff\xff\xff\xff\x1f", 1, "Unsupported"),  # ... or over 32 bits
        (_varint(3) + b"\x08abc", 4, "Unsupported"),  # more wanted than the stream holds
        (_varint(2) + b"\x08abc", 2, "Unsupported"),  # a literal past the stream's length
        (_varint(2) + b"\x08ab", 2, "Unsupported"),  # ... also when cut short
        (_varint(5) + b"\x00a" + bytes([1 | 7 << 2, 1]), 5, "Unsupported"),  # copy too
        (_varint(1) + b"", 1, "Truncated"),
    ],
)
def test_snappy_prefix_rejects_malformed_streams(stream: bytes, n: int, error) -> None:
    if error is None:
        out = PREFIX_DECODERS["snappy"](stream, _fixed(n))
        assert bytes(out[:n]) == stream[2 : 2 + n]
        return
    with pytest.raises({"Unsupported": Unsupported, "Truncated": Truncated}[error]):
        PREFIX_DECODERS["snappy"](stream, _fixed(n))


@pytest.mark.parametrize("codec", ["zstd", "gzip"])
def test_corrupt_zstd_or_gzip_prefix_is_unsupported(codec: str) -> None:
    stream = bytearray(_compress(_levels_page(np.random.default_rng(5), 500, 20, 500), codec))
    stream[:4] = b"\x00\x01\x02\x03"  # the magic / header
    with pytest.raises(Unsupported):
        _decoder(codec)(bytes(stream), levels_end)


@pytest.mark.parametrize("codec", ["snappy", "gzip", "zstd", "brotli", "lz4_raw"])
def test_whole_page_decompression(codec: str) -> None:
    page = _levels_page(np.random.default_rng(8), 300, 40, 2000)
    got = decompress(pa.compress(page, codec=codec, asbytes=True), len(page), codec)
    assert got.format == "B" and bytes(got) == page
    assert bytes(decompress(page, len(page), None)) == page
    with pytest.raises(Unsupported, match="size differs"):
        decompress(page, len(page) + 1, None)
    with pytest.raises(Unsupported):
        decompress(b"not compressed at all", len(page), codec)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "zstd"])
def test_decompress_from_threads(codec):
    """Each thread keeps its own Codec (a gzip one keeps a stream between calls): pages
    decompressed on several threads at once are each their own bytes."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(5)
    pages = [rng.integers(0, 9, 20_000 + k, dtype=np.uint8).tobytes() for k in range(24)]
    packed = [_compress(p, codec) for p in pages]

    def one(k: int) -> bool:
        return all(
            bytes(decompress(packed[k], len(pages[k]), codec)) == pages[k] for _ in range(10)
        )

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(one, range(len(pages))))
