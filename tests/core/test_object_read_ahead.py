"""Forward reads of an object served from ranges requested ahead, against a real
S3-protocol server on 127.0.0.1 (moto): the same bytes as one request per read whatever the
plan says, at most `most` bytes in flight or held, and a failed request raised only when a
read needs its bytes, naming the object."""

from __future__ import annotations

import numpy as np
import pytest
from s3_store import s3_server

from mds.core import object_ranges as ranges
from mds.core.object_read_ahead import ReadAhead
from mds.errors import SourceDataError

BODY = np.random.default_rng(5).integers(0, 256, 200_000, dtype=np.uint8).tobytes()


@pytest.fixture(scope="module")
def store():
    with pytest.MonkeyPatch.context() as patch, s3_server(patch) as server:
        server.put("ahead/body", BODY)
        yield server


def _reads(rng: np.random.Generator, size: int) -> list[tuple[int, int]]:
    """(start, size) of reads that go forward: small ones (headers) and larger ones (pages),
    now and then jumping ahead (pages skipped), some past the end."""
    out, at = [], int(rng.integers(0, 2000))
    while at < size + 100:
        n = int(rng.integers(1, 300)) if rng.random() < 0.5 else int(rng.integers(300, 30_000))
        out.append((at, n))
        at += n + (int(rng.integers(0, 20_000)) if rng.random() < 0.2 else 0)
    return out


def _plan(rng: np.random.Generator, reads: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """What a caller may expect the reads to be: right, part of it, shifted, or nothing."""
    kind = rng.integers(0, 4)
    spans = [(s, s + n) for s, n in reads]
    if kind == 0:
        return spans
    if kind == 1:
        return spans[: len(spans) // 2]
    if kind == 2:
        return [(s + 500, e + 700) for s, e in spans]
    return []


@pytest.mark.parametrize("seed", range(12))
def test_forward_reads_give_the_bytes_one_request_each_would(store, seed):
    rng = np.random.default_rng(seed)
    most = int(rng.choice([8_000, 40_000, 120_000]))
    piece = int(rng.choice([1_000, 7_000, 30_000]))
    source = ranges.RangeFile(store.url("ahead/body"), None)
    reads = _reads(rng, source.size)
    ahead = ReadAhead(source, _plan(rng, reads), most, piece, more=int(rng.integers(0, 2)) * 150_000)
    try:
        for start, n in reads:
            assert ahead.read_at(n, start) == BODY[start : start + n]
            assert ahead.peak <= max(most, piece)
    finally:
        ahead.close()
        source.close()
    assert not ahead._dropped and not ahead._pieces


def test_reads_as_planned_are_served_by_the_requests_made_ahead(store):
    source = ranges.RangeFile(store.url("ahead/body"), None)
    pages = [(k * 10_000, k * 10_000 + 9_000) for k in range(10)]
    ahead = ReadAhead(source, pages, 40_000, 5_000)
    direct = source.requests
    for lo, hi in pages:  # a header, then its page
        assert ahead.read_at(100, lo) == BODY[lo : lo + 100]
        assert ahead.read_at(hi - lo - 100, lo + 100) == BODY[lo + 100 : hi]
    ahead.close()
    # every read came from the pieces (two per page, none across a gap), none on its own
    assert ahead.requests == 20 and source.requests - direct == 20
    assert ahead.peak <= 40_000
    source.close()


def test_reads_past_the_plan_plan_on(store):
    """A read beyond the planned ranges (the guess of how far the values asked reach fell
    short) is one request, and the reads after it come from new requests made ahead."""
    source = ranges.RangeFile(store.url("ahead/body"), None)
    ahead = ReadAhead(source, [(0, 10_000)], 20_000, 5_000, more=100_000)
    assert ahead.read_at(10_000, 0) == BODY[:10_000]
    assert ahead.read_at(1_000, 30_000) == BODY[30_000:31_000]  # past the plan
    assert ahead.read_at(8_000, 31_000) == BODY[31_000:39_000]
    ahead.close()
    assert ahead.requests == 6  # two pieces planned, four planned on from 31,000
    assert source.requests == ahead.requests + 1  # and the read past the plan
    source.close()


def test_a_failed_request_is_raised_only_by_a_read_that_needs_it(store):
    store.put("ahead/cut", BODY)
    source = ranges.RangeFile(store.url("ahead/cut"), None)
    store.put("ahead/cut", BODY[:50_000])  # replaced by a shorter object after the open
    ahead = ReadAhead(source, [(0, 40_000), (60_000, 90_000)], 200_000, 10_000)
    assert ahead.read_at(30_000, 0) == BODY[:30_000]
    with pytest.raises(SourceDataError) as info:
        ahead.read_at(1_000, 60_000)
    text = str(info.value)
    assert "\n" not in text and "s3://mds-test/ahead/cut" in text and "replaced" in text
    ahead.close()  # the requests no read took are not its errors
    source.close()


def test_a_missing_object_is_an_error_naming_it(store):
    store.put("ahead/gone", BODY)
    source = ranges.RangeFile(store.url("ahead/gone"), None)
    store.delete("ahead/gone")
    ahead = ReadAhead(source, [(0, 50_000)], 40_000, 10_000)
    with pytest.raises(SourceDataError, match=r"^s3://mds-test/ahead/gone: ") as info:
        ahead.read_at(100, 0)
    assert "\n" not in str(info.value)
    ahead.close()
    source.close()


def test_a_range_request_thread_reads_without_requests_ahead(store):
    """A range request thread waiting on its own pool could wait forever: there every read
    is a request of its own."""
    source = ranges.RangeFile(store.url("ahead/body"), None)

    def read(_item) -> tuple[bytes, int]:
        ahead = ReadAhead(source, [(0, 50_000)], 40_000, 10_000)
        got = ahead.read_at(5_000, 1_000)
        ahead.close()
        return got, ahead.requests

    for got, requests in ranges.parallel(read, [0, 1]):
        assert got == BODY[1_000:6_000] and requests == 0
    source.close()
