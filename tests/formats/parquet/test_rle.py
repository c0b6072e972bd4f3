"""The RLE/bit-packed hybrid decoder against a reference encoder: values read by walking the
run headers (the page reader's way) and by scanning every byte at once (the level reader's)
are the values encoded, the two find the same runs, and malformed streams are Unsupported or
Truncated, never other values."""

from __future__ import annotations

import numpy as np
import pytest
from builders import uleb as _uleb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mds.formats.parquet import rle
from mds.formats.parquet.thrift import Truncated, Unsupported

FAST = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)



def _encode_page(rng, max_level: int, runs: list[tuple[int, bool]]) -> tuple[bytes, list]:
    """Reference encoder: the given runs, RLE or bit-packed, and the values they hold."""
    width = max_level.bit_length()
    out, values = bytearray(), []
    for i, (size, packed) in enumerate(runs):
        if packed:
            # Only a page's last bit-packed run may end in padding.
            size = min(size, 400) if i == len(runs) - 1 else -(-min(size, 400) // 8) * 8
            # Constant payloads (0x00, 0xff, ...) are the hardest: every byte parses as a run.
            run = rng.integers(0, max_level + 1, size)
            if rng.random() < 0.5:
                run[:] = run[0]
            groups = -(-size // 8)
            bits = sum(int(v) << (j * width) for j, v in enumerate(run))
            out += _uleb(groups << 1 | 1) + bits.to_bytes(groups * width, "little")
        else:
            value = int(rng.integers(0, max_level + 1))
            run = np.full(size, value)
            out += _uleb(size << 1) + value.to_bytes(-(-width // 8), "little")
        values.append(run)
    return bytes(out), values


RUN = st.tuples(st.integers(1, 300) | st.integers(1, 1 << 20), st.booleans())


@FAST
@given(
    max_level=st.integers(1, 7),
    pages=st.lists(st.lists(RUN, max_size=8), min_size=1, max_size=5),
    seed=st.integers(0, 2**32 - 1),
)
def test_hybrid_decoder_against_reference_encoder(max_level, pages, seed) -> None:
    rng = np.random.default_rng(seed)
    data, ends, counts, expected = bytearray(), [], [], []
    for runs in pages:
        encoded, values = _encode_page(rng, max_level, runs)
        data += encoded
        ends.append(len(data))
        counts.append(sum(len(v) for v in values))
        expected += values
    expected = np.concatenate(expected) if expected else np.zeros(0, np.int64)
    runs = rle.decode_pages(
        np.frombuffer(bytes(data), np.uint8), np.array(ends), np.array(counts), max_level
    )
    assert runs.size == expected.size
    np.testing.assert_array_equal(runs.at(np.arange(runs.size)), expected)
    np.testing.assert_array_equal(runs.positions_of(0), np.flatnonzero(expected == 0))
    assert runs.count_at_most(1) == np.count_nonzero(expected <= 1)


@pytest.mark.parametrize(
    ("data", "ends", "counts"),
    [
        (_uleb(10 << 1) + b"\x01", [2], [11]),  # fewer levels than the page claims
        (_uleb(10 << 1) + b"\x01", [2], [9]),  # an RLE run past the page's values
        (_uleb(2 << 1 | 1) + b"\xff", [2], [16]),  # a bit-packed run cut short
        (_uleb(1 << 1 | 1) + b"\xff" + _uleb(4 << 1) + b"\x01", [1, 4], [8, 4]),  # crosses
        (_uleb(2 << 1 | 1) + b"\xff\xff", [3], [7]),  # padding of more than 7 values
        (_uleb(4 << 1) + b"\x02", [2], [4]),  # a level above the maximum
        (b"\xff" * 6, [6], [1]),  # a varint longer than 32 bits
    ],
)
def test_hybrid_decoder_rejects_malformed_runs(data, ends, counts) -> None:
    args = (np.frombuffer(data, np.uint8), np.array(ends), np.array(counts), 1)
    with pytest.raises(Unsupported):
        rle.decode_pages(*args)


def test_hybrid_decoder_two_pages() -> None:
    data = _uleb(1 << 1 | 1) + b"\xfe" + _uleb(4 << 1) + b"\x00"
    runs = rle.decode_pages(np.frombuffer(data, np.uint8), np.array([2, 4]), np.array([8, 4]), 1)
    np.testing.assert_array_equal(runs.positions_of(0), [0, 8, 9, 10, 11])


def _encode(rng, width: int, runs: list[tuple[int, bool]]) -> tuple[bytes, np.ndarray, int]:
    """Reference encoder for any width (0 to 32 bits): the stream, the values it holds and
    how many values of padding its last bit-packed group adds."""
    out, values, padding = bytearray(), [], 0
    for size, packed in runs:
        run = rng.integers(0, 1 << width, size, dtype=np.int64)
        if packed:
            if rng.random() < 0.3:
                run[:] = run[0]
            groups = -(-size // 8)
            padded = np.zeros(groups * 8, np.int64)
            padded[:size] = run
            bits = sum(int(v) << (j * width) for j, v in enumerate(padded.tolist()))
            out += _uleb(groups << 1 | 1) + bits.to_bytes(groups * width, "little")
            padding = groups * 8 - size
            run = padded
        else:
            run[:] = run[0]
            out += _uleb(size << 1) + int(run[0]).to_bytes(-(-width // 8), "little")
            padding = 0
        values.append(run)
    got = np.concatenate(values) if values else np.zeros(0, np.int64)
    return bytes(out), got, padding


STREAM_RUNS = st.lists(st.tuples(st.integers(1, 600), st.booleans()), min_size=1, max_size=10)
WIDTHS = st.sampled_from([0, 1, 2, 3, 5, 7, 8, 9, 13, 16, 17, 24, 25, 31, 32])


@FAST
@given(width=WIDTHS, runs=STREAM_RUNS, seed=st.integers(0, 2**32 - 1), data=st.data())
def test_values_in_ranges_are_the_values_encoded(width, runs, seed, data) -> None:
    rng = np.random.default_rng(seed)
    stream, expected, padding = _encode(rng, width, runs)
    n = expected.size - padding
    k = data.draw(st.integers(1, 12))
    starts = np.sort(rng.integers(0, n, k))
    ends = np.minimum(starts + rng.integers(1, 700, k), n)
    want = np.concatenate([expected[a:b] for a, b in zip(starts, ends, strict=True)])
    got = rle.values(memoryview(stream), width, starts, ends)
    assert np.array_equal(got, want)
    walked = rle.walk(memoryview(stream), width, n)
    assert np.array_equal(walked.take(memoryview(stream), width, starts, ends), want)


@FAST
@given(width=st.integers(0, 32), runs=STREAM_RUNS, seed=st.integers(0, 2**32 - 1))
def test_walk_and_scan_find_the_same_runs(width, runs, seed) -> None:
    stream, expected, _padding = _encode(np.random.default_rng(seed), width, runs)
    walked = rle.walk(memoryview(stream), width, expected.size)
    scanned = rle.scan(np.frombuffer(stream, np.uint8), width)
    for field in ("first", "place", "repeat"):
        assert np.array_equal(getattr(walked, field), getattr(scanned, field)), field
    assert scanned.first[-1] == expected.size
    # whole runs from their first value: bit-packed ones are unpacked bit by bit
    packed = scanned.repeat < 0
    starts, ends = scanned.first[:-1][packed], scanned.first[1:][packed]
    if starts.size:
        want = np.concatenate([expected[a:b] for a, b in zip(starts, ends, strict=True)])
        assert np.array_equal(scanned.take(stream, width, starts, ends), want)


@settings(max_examples=300, deadline=None)
@given(stream=st.binary(max_size=60), width=st.integers(0, 17), limit=st.integers(1, 200))
def test_any_bytes_give_the_same_runs_or_a_declared_failure(stream, width, limit) -> None:
    try:
        walked = rle.walk(memoryview(stream), width, limit)
    except (Unsupported, Truncated):
        walked = None
    try:
        scanned = rle.scan(np.frombuffer(stream, np.uint8), width)
    except Unsupported:
        return
    if walked is None:
        assert scanned.first[-1] < limit or not stream
        return
    runs = len(walked.place)
    assert np.array_equal(walked.first, scanned.first[: runs + 1])
    assert np.array_equal(walked.place, scanned.place[:runs])
    assert np.array_equal(walked.repeat, scanned.repeat[:runs])


@pytest.mark.parametrize(
    ("stream", "error"),
    [
        (b"\x00\x01", Unsupported),  # an RLE run of no values
        (b"\x01", Unsupported),  # a bit-packed run of no groups
        (b"\x80\x80", Truncated),  # a header cut short
        (b"\x80\x80\x80\x80\x80\x01", Unsupported),  # a header over 5 bytes
        (_uleb(9 << 1), Unsupported),  # an RLE run without its value
    ],
)
def test_malformed_run_headers(stream: bytes, error) -> None:
    with pytest.raises(error):
        rle.walk(memoryview(stream), 3, 10)
    with pytest.raises(Unsupported):
        rle.scan(np.frombuffer(stream, np.uint8), 3)


def test_a_bit_packed_run_cut_short_is_unsupported() -> None:
    stream = _uleb(2 << 1 | 1) + b"\xff" * 5  # 16 values of 3 bits need 6 bytes
    runs = rle.walk(memoryview(stream), 3, 16)
    assert rle.values(memoryview(stream), 3, np.array([0]), np.array([13])).tolist() == [7] * 13
    with pytest.raises(Unsupported):
        runs.take(memoryview(stream), 3, np.array([0]), np.array([16]))


@pytest.mark.parametrize(
    ("stream", "n", "value", "expected"),
    [
        (_uleb(100 << 1) + b"\x03", 100, 3, True),  # one RLE run: a page without nulls
        (_uleb(100 << 1) + b"\x03", 100, 2, False),
        (_uleb(4 << 1) + b"\x03" + _uleb(1 << 1 | 1) + b"\xff\xff", 12, 3, True),
        (_uleb(4 << 1) + b"\x03" + _uleb(1 << 1 | 1) + b"\xff\x3f", 11, 3, True),  # padding
        (_uleb(4 << 1) + b"\x03" + _uleb(1 << 1 | 1) + b"\xff\x3f", 12, 3, False),
        (_uleb(4 << 1) + b"\x03" + _uleb(4 << 1) + b"\x01", 8, 3, False),
        (b"", 0, 3, True),
    ],
)
def test_all_equal(stream: bytes, n: int, value: int, expected: bool) -> None:
    assert rle.all_equal(memoryview(stream), 2, n, value) is expected


def test_ranges() -> None:
    got = rle.ranges(np.array([5, 0, 9]), np.array([2, 0, 3]))
    assert got.tolist() == [5, 6, 9, 10, 11]


@pytest.mark.parametrize("few", [0, 1000])  # ranges cut with array operations, or one by one
@pytest.mark.parametrize("width", [8, 16])
def test_full_bit_packed_runs_are_read_by_arithmetic_alike(width, few, monkeypatch):
    """Whole-byte indices in runs of the most groups a one-byte header holds are cut by
    arithmetic (`_full_runs`); the header walk gives the same values, and any other stream
    (a shorter run before the last value asked, too few bytes) is left to the walk."""
    monkeypatch.setattr(rle, "_FEW_RANGES", few)
    rng = np.random.default_rng(width)
    run, dtype = 63 * 8, np.dtype(f"<u{width // 8}")
    values = rng.integers(0, 1 << width, 6 * run).astype(dtype)
    full = b"".join(b"\x7f" + values[r * run : (r + 1) * run].tobytes() for r in range(6))
    # the same values with the fourth run cut in two runs of 31 and 32 groups
    cut = b"".join(
        [b"\x7f" + values[r * run : (r + 1) * run].tobytes() for r in range(3)]
        + [bytes([31 << 1 | 1]) + values[3 * run : 3 * run + 248].tobytes()]
        + [bytes([32 << 1 | 1]) + values[3 * run + 248 : 4 * run].tobytes()]
        + [b"\x7f" + values[r * run : (r + 1) * run].tobytes() for r in range(4, 6)]
    )
    starts = np.sort(rng.choice(len(values) - 700, 30, replace=False)).astype(np.int64)
    ends = starts + rng.integers(1, 700, 30)  # many cross a run's end
    expected = np.concatenate([values[a:b] for a, b in zip(starts, ends, strict=True)])
    early = starts < 3 * run - 700  # ranges that end before the fourth run
    assert rle._full_runs(memoryview(full), width, starts, ends) is not None
    assert rle._full_runs(memoryview(cut), width, starts, ends) is None
    assert rle._full_runs(memoryview(cut), width, starts[early], ends[early]) is not None
    assert rle._full_runs(memoryview(full[:-1]), width, starts, ends) is None
    for stream in (full, cut):
        got = rle.values(memoryview(stream), width, starts, ends)
        assert np.array_equal(got, expected)
    monkeypatch.setattr(rle, "_full_runs", lambda *a: None)
    walked = rle.values(memoryview(full), width, starts, ends)
    assert np.array_equal(walked, expected)
