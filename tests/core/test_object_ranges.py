"""Range reads of objects against a real S3-protocol server on 127.0.0.1 (moto): spans
joined into few requests, staged bytes served without a request, a failed span raised only
when read, and a step of Parquet objects fetched in a few concurrent requests."""

from __future__ import annotations

import numpy as np
import pytest
from builders import write_parquet
from cli_helpers import mds
from executor_builders import batch_digest
from s3_store import s3_server

from mds.core import metacache
from mds.core import object_ranges as ranges
from mds.core.lru import LRU
from mds.core.storage import DATA_ROOT_ENV
from mds.errors import SourceDataError
from mds.executor import PlanExecutor


@pytest.fixture(scope="module")
def store():
    with pytest.MonkeyPatch.context() as patch, s3_server(patch) as server:
        patch.delenv(DATA_ROOT_ENV, raising=False)
        yield server


def test_spans_are_joined_across_small_gaps_and_cut_into_bounded_requests(monkeypatch):
    monkeypatch.setattr(ranges, "HOLE", 10)
    monkeypatch.setattr(ranges, "MAX_REQUEST", 100)
    spans = [(50, 60), (0, 20), (25, 30), (45, 45), (200, 450)]
    assert ranges._coalesce(spans) == [(0, 30), (50, 60), (200, 284), (284, 368), (368, 450)]


def test_staged_bytes_are_served_without_a_request(store):
    body = bytes(range(256)) * 64
    store.put("ranges/staged", body)
    f = ranges.RangeFile(store.url("ranges/staged"), LRU(max_bytes=1 << 20))
    before = ranges.counters.requests
    ranges.prefetch([(f, [(100, 200), (300, 400), (9000, 16384)])])
    requests = ranges.counters.requests - before
    assert requests == 1  # all within HOLE of each other: one request
    assert f.read_at(50, 120) == body[120:170]
    assert f.read_at(10_000, 9000) == body[9000:]  # clipped to the object
    assert ranges.counters.requests - before == requests
    assert f.read_at(10, 16380) == body[16380:]  # past the end: clipped
    f.unstage()
    assert f.read_at(8, 0) == body[:8]
    assert ranges.counters.requests - before == requests + 1
    f.close()


def test_a_read_across_runs_cut_apart_is_joined(store, monkeypatch):
    monkeypatch.setattr(ranges, "MAX_REQUEST", 1000)
    body = bytes(range(256)) * 20
    store.put("ranges/cut", body)
    f = ranges.RangeFile(store.url("ranges/cut"), LRU(max_bytes=1 << 20))
    ranges.prefetch([(f, [(0, len(body))])])
    before = ranges.counters.requests
    assert f.read_at(3000, 500) == body[500:3500]
    assert ranges.counters.requests == before
    f.close()


def test_a_failed_span_is_raised_only_when_read(store):
    body = b"x" * 4096
    store.put("ranges/gone", body)
    f = ranges.RangeFile(store.url("ranges/gone"), LRU(max_bytes=1 << 20))
    kept = ranges.RangeFile(store.url("ranges/staged"), LRU(max_bytes=1 << 20))
    store.delete("ranges/gone")
    ranges.prefetch([(f, [(0, 100)]), (kept, [(0, 100)])])  # no error yet
    assert kept.read_at(10, 0) == (bytes(range(256)) * 64)[:10]
    with pytest.raises(SourceDataError, match=r"^s3://mds-test/ranges/gone: "):
        f.read_at(10, 0)
    f.close()
    kept.close()


def test_in_order_yields_every_read_in_order_with_at_most_its_bytes_asked_ahead():
    """`in_order` runs the reads on the range threads and hands them back in order; from
    the one being taken on, the reads begun hold at most `most` bytes (or that one)."""
    import threading

    begun: list[int] = []
    lock = threading.Lock()

    def read(k: int) -> int:
        with lock:
            begun.append(k)
        return k * 10

    sizes = [3, 5, 2, 7, 1, 4, 12] * 6
    got = []
    for k, value in enumerate(ranges.in_order(read, list(range(len(sizes))), sizes, most=10)):
        with lock:
            last = max(begun)
        assert sum(sizes[k : last + 1]) <= max(10, sizes[k])
        got.append(value)
    assert got == [k * 10 for k in range(len(sizes))]


def test_a_kept_handle_serves_the_next_open_once(store, monkeypatch):
    """A handle kept open (by a file's first reads or check) is the next RangeFile's, which
    then asks the store nothing; `take_kept` with an owner takes only that owner's; one kept
    too long, or dropped by its owner, is closed, not used."""
    from fault_proxy import fault_proxy

    from mds.core import storage

    store.put("ranges/kept", b"k" * 100)
    url = store.url("ranges/kept")
    with fault_proxy(store, monkeypatch) as proxy:
        handle = storage.open_input(url)
        ranges.keep_open(url, handle, "first reads")
        assert ranges.take_kept(url, "another") is None  # not its own: left kept
        before = len(proxy.log)
        f = ranges.RangeFile(url, None)
        assert f._file is handle and f.size == 100 and len(proxy.log) == before
        f.close()
        assert ranges.take_kept(url) is None  # taken once
        ranges.keep_open(url, storage.open_input(url), "first reads")
        ranges.drop_kept("first reads")
        assert ranges.take_kept(url) is None
        monkeypatch.setattr(ranges, "KEEP_SECONDS", 0.0)
        old = storage.open_input(url)
        ranges.keep_open(url, old, None)
        assert ranges.take_kept(url) is None and old.closed  # too old: asked again


def test_concurrent_reads_of_an_object_share_its_one_handle(store, monkeypatch):
    """Reads of one object on the range request threads at once go through its one open
    handle (a read does not move its position): each gets its own bytes, and the object is
    opened (a HEAD) once, not once per read in flight."""
    from fault_proxy import fault_proxy

    body = np.random.default_rng(5).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    store.put("ranges/shared", body)
    rng = np.random.default_rng(6)
    starts = rng.integers(0, len(body), 96).tolist()
    sizes = rng.integers(1, 256 << 10, 96).tolist()
    with fault_proxy(store, monkeypatch) as proxy:
        proxy.add("GET", "ranges/shared", "delay", seconds=0.005)  # reads overlap
        f = ranges.RangeFile(store.url("ranges/shared"), None)
        got = ranges.parallel(lambda job: f.read_at(*job), list(zip(sizes, starts, strict=True)))
        f.close()
        methods = [m for m, *_ in proxy.requests(key="ranges/shared")]
    assert got == [body[s : s + n] for s, n in zip(starts, sizes, strict=True)]
    # a GET each (a second one only where a read's end matched the fill pattern by chance)
    assert methods.count("HEAD") == 1 and 96 <= methods.count("GET") < 2 * 96


@pytest.fixture(scope="module")
def plans(store, tmp_path_factory):
    """Parquet sources of many small row groups, local and as objects, one plan."""
    top = tmp_path_factory.mktemp("batched")
    rng = np.random.default_rng(8)
    for part in range(3):
        rows = [rng.integers(0, 900, int(rng.integers(20, 200))).tolist() for _ in range(400)]
        write_parquet(top / "data" / f"part-{part}.parquet", {"tokens": rows}, row_group_size=25)
    url = store.upload(top / "data", "batched")
    config = top / "mds.toml"
    config.write_text(
        f'[index]\nroot = "{top / "data"}"\n\n[[source]]\nname = "web"\npath = "*.parquet"\n'
        'tokens = "tokens"\nweight = 1.0\n\n[train]\nsteps = 6\ndp_size = 2\nmicro_batches = 2\n'
        "samples_per_step = 48\nmax_tokens_per_micro_batch = 6000\nseed = 4\n",
        encoding="utf-8",
    )
    assert mds("index", config, "-o", top / "index").exit_code == 0
    assert mds("plan", config, "-o", top / "plan.mds", "--index", top / "index").exit_code == 0
    return top, url


def _replay(plan, root, **kwargs) -> tuple[list[str], int]:
    metacache.clear()
    before = ranges.counters.requests
    with PlanExecutor(plan, 0, data_root=root, **kwargs) as ex:
        digests = [batch_digest(b) for b in ex]
    return digests, ranges.counters.requests - before


@pytest.mark.parametrize("read_ahead", [0, 1])
def test_a_step_of_parquet_objects_is_read_in_few_requests(plans, read_ahead):
    top, url = plans
    small = 64 << 10  # most row groups miss, as on a corpus far larger than the cache
    expected, _ = _replay(top / "plan.mds", top / "data", read_ahead=read_ahead, cache_bytes=small)
    got, requests = _replay(top / "plan.mds", url, read_ahead=read_ahead, cache_bytes=small)
    assert got == expected
    # 6 steps read 48 samples each from 48 row groups of 25 rows: a request per row group
    # would be hundreds; joined per object and fetched together, far fewer.
    assert requests <= 6 * 2 * 3 + 12  # a request per object and fetch, and the opens
