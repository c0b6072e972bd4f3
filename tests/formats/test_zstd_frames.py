"""zstd random access: the frame table (headers only) and range reads that decompress only the
frames a range touches, cached or streamed, checked against slicing the whole stream."""

from __future__ import annotations

import io
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mds.core import metacache
from mds.core.lru import LRU, version_key
from mds.errors import SourceDataError
from mds.formats.zstd_frames import ZstdSeekFile, read_frame_table

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data"


def skippable(payload: bytes, nibble: int = 0) -> bytes:
    return struct.pack("<II", 0x184D2A50 + nibble, len(payload)) + payload


def frames(pieces: list[bytes], *, sized: list[bool] | None = None, checksum=False) -> bytes:
    """One zstd frame per piece; `sized[i]` says whether frame i records its content size."""
    sized = sized or [True] * len(pieces)
    out = []
    for piece, with_size in zip(pieces, sized, strict=True):
        cctx = zstandard.ZstdCompressor(write_content_size=with_size, write_checksum=checksum)
        out.append(cctx.compress(piece))
    return b"".join(out)


def unzstd(data: bytes) -> bytes:
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    return reader.read()


def seek_file(path: Path, max_bytes: int | None = None) -> ZstdSeekFile:
    return ZstdSeekFile(path, path.name, LRU(max_bytes=max_bytes))


def read(f: ZstdSeekFile, ranges: list[tuple[int, int]]) -> list[bytes]:
    offsets = np.array([o for o, _ in ranges], dtype=np.int64)
    lengths = np.array([n for _, n in ranges], dtype=np.int64)
    return f.read_ranges(offsets, lengths, lambda i: f"request {i}")


# --- the frame table ----------------------------------------------------------------------


def test_sample_code_files_have_one_and_several_frames():
    one = read_frame_table(SAMPLE / "code/code-00000.jsonl.zst")
    several = read_frame_table(SAMPLE / "code/code-00001.jsonl.zst")
    assert len(one) == 1 and len(several) == 3
    for path, table in (("code-00000", one), ("code-00001", several)):
        data = (SAMPLE / f"code/{path}.jsonl.zst").read_bytes()
        assert table.total == len(unzstd(data))
        assert int(table.sizes.sum()) == table.file_size == len(data)
        assert table.offsets[0] == 0 and (table.offsets[1:] == np.cumsum(table.sizes)[:-1]).all()


def test_table_lists_frames_skips_skippable_and_measures_unsized(tmp_path):
    pieces = [b"a" * 1000, b"", b"hello\n" * 50, bytes(range(256)) * 9]
    sized = [True, False, False, True]
    data = skippable(b"hint") + frames(pieces[:2], sized=sized[:2])
    data += skippable(b"", nibble=15) + frames(pieces[2:], sized=sized[2:])
    path = tmp_path / "x.zst"
    path.write_bytes(data)
    table = read_frame_table(path)
    assert len(table) == 4 and table.skippable == 2
    assert [table.content_size(i) for i in range(4)] == [len(p) for p in pieces]
    assert table.has_content_size.tolist() == sized
    assert table.total == sum(map(len, pieces)) and table.file_size == len(data)
    assert table.frame_of(0) == 0 and table.frame_of(1000) == 2 and table.frame_of(1300) == 3


def test_empty_file_has_no_frames(tmp_path):
    path = tmp_path / "empty.zst"
    path.write_bytes(b"")
    table = read_frame_table(path)
    assert len(table) == 0 and table.total == 0


def test_frames_of_a_large_multi_block_frame(tmp_path):
    rng = np.random.default_rng(0)
    text = rng.integers(0, 256, 600_000, dtype=np.uint8).tobytes()  # raw blocks, 128 KiB each
    path = tmp_path / "big.zst"
    path.write_bytes(frames([text, text[:5]], checksum=True))
    table = read_frame_table(path)
    assert [table.content_size(i) for i in range(2)] == [600_000, 5]


# --- malformed files ----------------------------------------------------------------------


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "bad.jsonl.zst"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("cut", [1, 3, 4, 7, 100])
def test_truncated_file_is_an_error(tmp_path, cut):
    data = frames([b"x" * 5000, b"y" * 300 + bytes(range(200)) * 20], checksum=True)
    path = _write(tmp_path, data[:-cut])
    with pytest.raises(SourceDataError, match=r"^bad\.jsonl\.zst: truncated zstd file \(frame 1"):
        read_frame_table(path, "bad.jsonl.zst")


def test_truncated_skippable_frame_is_an_error(tmp_path):
    path = _write(tmp_path, frames([b"abc"]) + skippable(b"12345678")[:-2])
    with pytest.raises(SourceDataError, match="truncated skippable zstd frame at byte"):
        read_frame_table(path, "bad.jsonl.zst")


def test_trailing_garbage_is_an_error(tmp_path):
    data = frames([b"abc\n"])
    path = _write(tmp_path, data + b"garbage!")
    with pytest.raises(SourceDataError, match=rf"not zstd data at byte {len(data)} "):
        read_frame_table(path, "bad.jsonl.zst")


def test_plain_text_is_not_zstd(tmp_path):
    path = _write(tmp_path, b'{"a": 1}\n')
    with pytest.raises(SourceDataError, match=r"^bad\.jsonl\.zst: not zstd data at byte 0"):
        read_frame_table(path, "bad.jsonl.zst")


def test_reserved_header_bit_and_block_type_are_errors(tmp_path):
    data = bytearray(frames([b"hello world"]))
    data[4] |= 0x08
    with pytest.raises(
        SourceDataError, match="corrupt zstd frame 0 at byte 0 .reserved header bit"
    ):
        read_frame_table(_write(tmp_path, bytes(data)), "bad.jsonl.zst")
    data = bytearray(frames([b"hello world"], sized=[False]))
    data[6] |= 0x06  # block type 3 (reserved) in the first block header
    with pytest.raises(SourceDataError, match="reserved block type"):
        read_frame_table(_write(tmp_path, bytes(data)), "bad.jsonl.zst")


def test_missing_file_cannot_be_opened(tmp_path):
    with pytest.raises(SourceDataError, match=r"^gone\.zst: cannot open \(No such file"):
        ZstdSeekFile(tmp_path / "gone.zst", "gone.zst", LRU())


@pytest.mark.parametrize("max_bytes", [None, 1])
def test_corrupt_frame_content_names_the_request_and_frame(tmp_path, max_bytes):
    good = frames([b"first line\n" * 10])
    bad = bytearray(frames([b"second frame\n" * 400], checksum=True))
    bad[len(bad) // 2] ^= 0xFF
    path = _write(tmp_path, good + bytes(bad))
    f = seek_file(path, max_bytes)
    assert read(f, [(0, 5)]) == [b"first"]
    with pytest.raises(
        SourceDataError,
        match=rf"^bad\.jsonl\.zst request 0: corrupt zstd frame 1 at byte {len(good)}",
    ):
        read(f, [(115, 10), (110, 13 * 400)])  # to the frame's end: the checksum is checked
    f.close()


def test_unsized_corrupt_frame_fails_at_open(tmp_path):
    bad = bytearray(frames([b"some text here\n" * 400], sized=[False], checksum=True))
    bad[len(bad) // 2] ^= 0xFF
    with pytest.raises(SourceDataError, match="corrupt zstd frame 0 at byte 0"):
        seek_file(_write(tmp_path, bytes(bad)))


# --- range reads --------------------------------------------------------------------------


@pytest.mark.parametrize("max_bytes", [None, 1, 150])
def test_ranges_within_and_across_frames(tmp_path, max_bytes):
    pieces = [b"0123456789" * 10, b"", b"abcdefghij" * 20, b"ZYX"]
    path = tmp_path / "x.zst"
    path.write_bytes(frames(pieces, sized=[True, False, True, False]) + skippable(b"end"))
    stream = b"".join(pieces)
    ranges = [(0, 10), (95, 10), (90, 213), (300, 3), (302, 1), (0, 0), (95, 10), (150, 0)]
    f = seek_file(path, max_bytes)
    assert read(f, ranges) == [stream[o : o + n] for o, n in ranges]
    f.close()


def test_frames_are_cached_and_reused(tmp_path):
    path = tmp_path / "x.zst"
    path.write_bytes(frames([b"a" * 100, b"b" * 100, b"c" * 100]))
    blocks = LRU(max_bytes=1000)
    f = ZstdSeekFile(path, "x.zst", blocks)
    read(f, [(150, 10), (120, 1), (250, 50)])
    assert sorted(k[2] for k in [(path, "frame", 1), (path, "frame", 2)] if k in blocks) == [1, 2]
    assert (path, "frame", 0) not in blocks and blocks.nbytes == 200  # the frame table is
    assert metacache.get(version_key("zstd-frames", path, path.stat())) is f.table  # kept apart
    calls = []
    f._dctx = _Counting(f._dctx, calls)
    assert read(f, [(199, 2)]) == [b"bc"]
    assert calls == []  # both frames came from the cache


class _Counting:
    def __init__(self, inner, calls):
        self._inner, self._calls = inner, calls

    def decompress(self, *args, **kwargs):
        self._calls.append("decompress")
        return self._inner.decompress(*args, **kwargs)

    def stream_reader(self, *args, **kwargs):
        self._calls.append("stream")
        return self._inner.stream_reader(*args, **kwargs)


def test_oversize_frame_is_streamed_once_per_call_not_cached(tmp_path):
    path = tmp_path / "x.zst"
    path.write_bytes(frames([b"x" * 10_000, b"y" * 10]))
    blocks = LRU(max_bytes=100)
    f = ZstdSeekFile(path, "x.zst", blocks)
    calls: list = []
    f._dctx = _Counting(f._dctx, calls)
    got = read(f, [(9000, 5), (10, 3), (9002, 5), (9998, 4)])
    assert got == [b"x" * 5, b"xxx", b"x" * 5, b"xxyy"]
    assert calls == ["stream", "decompress"]
    assert (path, "frame", 0) not in blocks and (path, "frame", 1) in blocks


@st.composite
def zstd_layouts(draw):
    """A stream cut into frames at random points, some unsized, with skippable frames."""
    words = st.text(alphabet='abc xyzé\n{}"', min_size=0, max_size=60)
    stream = "".join(draw(st.lists(words, min_size=1, max_size=30))).encode()
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    sized = draw(st.lists(st.booleans(), min_size=len(pieces), max_size=len(pieces)))
    skips = draw(st.lists(st.booleans(), min_size=len(pieces) + 1, max_size=len(pieces) + 1))
    data = b""
    for piece, with_size, skip in zip(pieces, sized, skips, strict=False):
        if skip:
            data += skippable(draw(st.binary(max_size=12)), draw(st.integers(0, 15)))
        data += frames([piece], sized=[with_size])
    if skips[-1]:
        data += skippable(b"seek table")
    n = len(stream)
    ranges = draw(
        st.lists(
            st.integers(0, n).flatmap(lambda o: st.tuples(st.just(o), st.integers(0, n - o))),
            min_size=1,
            max_size=20,
        )
    )
    return stream, pieces, data, ranges


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=zstd_layouts(), max_bytes=st.sampled_from([None, 0, 1, 16, 64]))
def test_random_ranges_equal_slices_of_the_stream(layout, max_bytes):
    stream, pieces, data, ranges = layout
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.zst"
        path.write_bytes(data)
        f = seek_file(path, max_bytes)
        try:
            assert f.size == len(stream) == f.table.total
            assert len(f.table) == len(pieces)
            assert [f.table.content_size(i) for i in range(len(pieces))] == [len(p) for p in pieces]
            assert read(f, ranges) == [stream[o : o + n] for o, n in ranges]
            assert read(f, ranges[::-1]) == [stream[o : o + n] for o, n in ranges[::-1]]
        finally:
            f.close()
