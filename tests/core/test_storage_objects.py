"""Object storage end to end, against a real S3-protocol server on 127.0.0.1 (moto): index
objects, plan, replay 2 ranks with resume, a relocated local copy, a changed or missing
object, and a server that is down or hangs (an error naming the URL, never a hang)."""

from __future__ import annotations

import shutil
import signal
import struct

import numpy as np
import pytest
from cli_helpers import mds, one_error_line
from executor_builders import batch_digest
from fault_proxy import fault_proxy
from index_files import manifest_with_files
from s3_store import BUCKET, free_port, s3_server, silent_server
from store_corpus import corpus_config, index_and_plan, replay, write_corpus

import mds.executor.readers.parquet as parquet_reader
from mds.core import object_ranges as ranges
from mds.core import storage
from mds.core.planfile_reader import PlanReader
from mds.core.storage import DATA_ROOT_ENV
from mds.errors import DataChangedError, Interrupted, PlanError, SourceDataError
from mds.executor import PlanExecutor
from mds.executor.catalog.plan_sources import PlanSources
from mds.executor.catalog.recheck import RECHECK_ENV, DataChecks
from mds.formats.parquet import pages as parquet_pages

CONFIG = corpus_config(
    forum="forum", keep='["lang"]', steps=12, seed=11, tail="\n[plan]\nchunk_steps = 4\n"
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A corpus on local disk and the same objects in the store, each indexed and planned."""
    top = tmp_path_factory.mktemp("objects")
    write_corpus(top / "local", 5, lang=True)
    with pytest.MonkeyPatch.context() as patch, s3_server(patch) as store:
        patch.delenv(DATA_ROOT_ENV, raising=False)
        url = store.upload(top / "local", "corpus")
        for name, root in (("s3", url), ("local", str(top / "local"))):
            index_and_plan(top, name, CONFIG.format(root=root), "--json")
        yield top, store, url


def test_an_index_of_objects_is_the_index_of_the_same_files(world):
    top, _, url = world
    s3 = manifest_with_files(top / "s3-index")
    local = manifest_with_files(top / "local-index")
    assert s3["root"] == url
    assert s3["fingerprint"] == local["fingerprint"]  # identity is content
    assert [f["path"] for s in s3["sources"] for f in s["files"]] == [
        "web/part-0.parquet",
        "web/part-1.parquet",
        "forum/forum.jsonl",
    ]
    assert [s["rows"] for s in s3["sources"]] == [s["rows"] for s in local["sources"]]


def test_two_ranks_replay_objects_and_resume(world):
    top, _, _ = world
    for rank in range(2):
        expected = replay(top / "local.mds", rank)
        assert replay(top / "s3.mds", rank) == expected
        assert replay(top / "s3.mds", rank, read_ahead=0) == expected
        with PlanExecutor(top / "s3.mds", rank) as ex:
            it = iter(ex)
            for _ in range(7):
                next(it)
            state = ex.state_dict()
        with PlanExecutor(top / "s3.mds", rank) as ex:
            ex.load_state_dict(state)
            assert [batch_digest(b) for b in ex] == expected[7:]


def test_rows_of_parquet_objects_are_read_from_their_pages(world, monkeypatch):
    """A few rows of a row group of an object come from the bytes staged for the fetch, as
    a file's do: the same batches. (This corpus's row groups are 7 rows, so a rank's rows
    of one are rarely few, and while the cache has room an object's group that may be asked
    for again is decoded whole: here every read that is not of a whole group is from
    pages.)"""
    top, _, _ = world
    expected = replay(top / "local.mds", 0)
    monkeypatch.setattr(parquet_reader, "_SPARSE", 1)
    monkeypatch.setattr(parquet_reader, "_PAGED_READS", 1 << 30)
    monkeypatch.setattr(parquet_reader.ParquetReader, "_room", lambda self, i: False)
    sources: list[str] = []
    real = parquet_pages.read_rows

    def counted(source, *args):
        got = real(source, *args)
        sources.append(type(source).__name__ if got is not None else "declined")
        return got

    monkeypatch.setattr(parquet_pages, "read_rows", counted)
    assert replay(top / "s3.mds", 0) == expected
    assert "RangeFile" in sources and "declined" not in sources


def test_dataloader_workers_read_objects(world):
    """Forked workers open their own readers of the objects (after the parent read some)."""
    top, _, _ = world
    expected = replay(top / "local.mds", 0)
    with PlanExecutor(top / "s3.mds", 0) as ex:
        next(iter(ex))
        ex.seek(0)
        assert [batch_digest(b) for b in ex.dataloader(num_workers=2)] == expected


def test_a_local_copy_replays_the_plan_made_from_objects(world, tmp_path, monkeypatch):
    top, _, _ = world
    copy = tmp_path / "copy"
    shutil.copytree(top / "local", copy, copy_function=shutil.copyfile)  # new mtimes
    expected = replay(top / "local.mds", 1)
    assert replay(top / "s3.mds", 1, data_root=copy) == expected
    monkeypatch.setenv(DATA_ROOT_ENV, str(copy))
    assert replay(top / "s3.mds", 1) == expected
    result = mds("verify", top / "s3.mds")
    assert result.exit_code == 0, result.output


def test_objects_replay_a_plan_made_from_local_files(world, monkeypatch):
    top, _, url = world
    expected = replay(top / "local.mds", 0)
    assert replay(top / "local.mds", 0, data_root=url) == expected
    monkeypatch.setenv(DATA_ROOT_ENV, url)
    assert mds("verify", top / "local.mds").exit_code == 0


def test_a_changed_object_is_an_error_naming_it(world):
    top, store, _ = world
    key = "corpus/forum/forum.jsonl"
    original = store.get(key)
    try:
        store.put(key, original + b'{"ids": [1, 2]}\n')  # grown
        with pytest.raises(DataChangedError, match=r"forum/forum.jsonl: size changed"):
            replay(top / "s3.mds", 0)
        raw = bytearray(original)
        raw[raw.index(b"[") + 1] ^= 0x01  # same size, a digit changed
        store.put(key, bytes(raw))
        with pytest.raises(DataChangedError, match=r"forum/forum.jsonl: content changed"):
            replay(top / "s3.mds", 0, verify="full")
        one_error_line(
            mds("verify", top / "s3.mds", "--full"), "forum/forum.jsonl: content changed"
        )
    finally:
        store.put(key, original)
    replay(top / "s3.mds", 0)  # restored: a new mtime, the same content


def test_a_missing_object_is_an_error_naming_it(world):
    top, store, _ = world
    key = "corpus/web/part-1.parquet"
    original = store.get(key)
    try:
        store.delete(key)
        with pytest.raises(DataChangedError, match=r"web/part-1.parquet: missing"):
            replay(top / "s3.mds", 0)
        one_error_line(mds("verify", top / "s3.mds"), "web/part-1.parquet: missing")
    finally:
        store.put(key, original)


def _checked_objects(top) -> tuple[PlanSources, object, list[str]]:
    """Rank 0's first block of the objects' plan, its sources and the URLs it reads."""
    with PlanReader(top / "s3.mds") as reader:
        plan = PlanSources(reader.footer, top / "s3.mds", None)
        block = reader.rank_chunk(0, 0)
    files = block.fetch.files
    urls = [str(plan.paths(files[f][2], "f")[0]) for f in np.unique(block.fetch.file).tolist()]
    return plan, block, sorted(set(urls))


def _touched(plan: PlanSources, block, urls: list[str]) -> list[str]:
    """The objects put back by another test: another mtime than their records, so the
    check reads their content fingerprint too (through its open: a GET, no HEAD)."""
    records = {str(plan.paths(e, "f")[0]): e for _s, _f, e in block.fetch.files}
    return [u for u in urls if storage.stat(u).st_mtime_ns != records[u]["mtime_ns"]]


def test_an_objects_open_gives_the_size_and_mtime_a_stat_gives(world):
    _top, _store, url = world
    for key in ("forum/forum.jsonl", "web/part-1.parquet"):
        handle = storage.open_input(f"{url}/{key}")
        st, got = storage.stat(f"{url}/{key}"), storage.opened_stat(handle, f"{url}/{key}")
        handle.close()
        assert (got.st_size, got.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_a_files_check_and_its_open_share_one_metadata_request(world, monkeypatch):
    """The start-up check takes an object's size and mtime (and the version it pins) from
    one open, all of a step's objects opened at once, and the reader's open takes that
    handle: one HEAD a file for both, where there were three; a content fingerprint the
    check needs is read through it too."""
    top, store, _url = world
    plan, block, urls = _checked_objects(top)
    touched = _touched(plan, block, urls)
    with fault_proxy(store, monkeypatch) as proxy:
        checks = DataChecks(plan, owner="catalog")
        checks.check_files(block, full=False)
        heads = sorted(key for method, key, *_ in proxy.log if method == "HEAD")
        assert heads == sorted(u.removeprefix(f"s3://{BUCKET}/") for u in urls)
        gets = {key for method, key, *_ in proxy.log if method == "GET"}
        assert gets == {u.removeprefix(f"s3://{BUCKET}/") for u in touched}
        before = len(proxy.log)
        for u in urls:
            f = ranges.RangeFile(u, None)
            assert any(f.version in pins for pins in checks.pins.values())
            f.close()
        assert len(proxy.log) == before  # the opens took the check's handles


def test_a_check_takes_the_handles_its_first_reads_kept(world, monkeypatch):
    """Handles the same catalog's first reads kept serve the check with no request (the
    re-checks after each fetch ask the store again); another catalog's, or any with the
    re-checks off, do not. A content fingerprint is read through the handle either way."""
    top, store, _url = world
    plan, block, urls = _checked_objects(top)
    with fault_proxy(store, monkeypatch) as proxy:
        cases = (("mine", "1", 0), ("other", "1", len(urls)), ("mine", "0", len(urls)))
        for owner, rechecks, requests in cases:
            monkeypatch.setenv(RECHECK_ENV, rechecks)
            for u in urls:
                ranges.keep_open(u, storage.open_input(u), owner)
            before = len(proxy.log)
            DataChecks(plan, owner="mine").check_files(block, full=False)
            assert [m for m, *_ in proxy.log[before:]].count("HEAD") == requests
            ranges.drop_kept("mine")
            ranges.drop_kept("other")


def test_a_check_through_a_kept_handle_refuses_only_what_the_store_has_now(world):
    """A handle kept by the first reads shows the object as it was then: a change it does
    not show is refused by the re-check of what is read (the version pinned is the
    handle's), and a change it shows that was undone since is looked at again, not
    refused."""
    top, store, _url = world
    plan, block, urls = _checked_objects(top)
    target = next(u for u in urls if u.endswith("web/part-0.parquet"))  # as indexed
    key = target.removeprefix(f"s3://{BUCKET}/")
    original = store.get(key)
    sid, fid, entry = next(e for e in block.fetch.files if str(plan.paths(e[2], "f")[0]) == target)
    try:
        ranges.keep_open(target, storage.open_input(target), "mine")  # sees it as indexed
        store.put(key, original + b"x")
        checks = DataChecks(plan, owner="mine")
        checks.check_files(block, full=False)
        with pytest.raises(DataChangedError, match="part-0.parquet changed after it was checked"):
            checks.recheck(plan.sources[sid], fid, entry, [(0, target)])
        ranges.keep_open(target, storage.open_input(target), "mine")  # sees it grown
        store.put(key, original)
        DataChecks(plan, owner="mine").check_files(block, full=False)  # looked at again
    finally:
        store.put(key, original)
        ranges.drop_kept("mine")


def test_a_server_that_is_down_is_an_error_naming_the_url(world, monkeypatch):
    top, _, url = world
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(SourceDataError, match=rf"^{url}/\S+: cannot stat after 2 attempts"):
        replay(top / "s3.mds", 0)
    one_error_line(mds("index", top / "s3.toml", "-o", top / "down-index"), url, "after 2 attempts")


def test_a_server_lost_mid_run_is_an_error_naming_the_url(world, monkeypatch):
    """Readers already open: the failed range read names the object, after the retries."""
    top, _, url = world
    with s3_server(monkeypatch) as private:  # a second server with the same objects
        private.upload(top / "local", "corpus")
        ex = PlanExecutor(top / "s3.mds", 0, read_ahead=0, cache_bytes=0)
        it = iter(ex)
        next(it)
    try:  # the server is stopped now
        with pytest.raises(SourceDataError, match=rf"^{url}/\S+") as info:
            for _ in it:
                pass
        assert "cannot read" in str(info.value) or "attempt" in str(info.value)
    finally:
        ex.close()


def test_a_server_that_hangs_times_out_with_the_url(world, monkeypatch):
    top, _, url = world
    monkeypatch.setenv("MDS_S3_TIMEOUT", "0.5")
    monkeypatch.setenv("MDS_S3_ATTEMPTS", "1")
    with silent_server() as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        with pytest.raises(SourceDataError, match=rf"^{url}/\S+: cannot stat after 1 attempt \("):
            replay(top / "s3.mds", 0)


def test_range_reads_of_an_object_are_exact_and_cached(world, monkeypatch):
    from mds.core import object_ranges as ranges
    from mds.core.lru import LRU

    top, store, _ = world
    monkeypatch.setattr(ranges, "RANGE_BLOCK", 64)  # many blocks, several runs per call
    body = bytes(range(256)) * 40
    store.put("ranges/blob", body)
    blocks = LRU(max_bytes=1 << 20)
    requests: list[tuple[int, int]] = []
    read_run = ranges.RangeFile._read_run

    def counted(self, run):
        requests.append(run)
        return read_run(self, run)

    monkeypatch.setattr(ranges.RangeFile, "_read_run", counted)
    f = ranges.RangeFile(store.url("ranges/blob"), blocks)
    rng = np.random.default_rng(3)
    starts = rng.integers(0, len(body) - 300, 50)
    sizes = rng.integers(0, 300, 50)
    assert f.read_ranges(starts, sizes) == [
        body[s : s + n] for s, n in zip(starts, sizes, strict=True)
    ]
    first = len(requests)
    assert 1 < first < 50  # neighbouring blocks joined into one request per run
    assert f.read_ranges(starts[::-1], sizes[::-1]) == [
        body[s : s + n] for s, n in zip(starts[::-1], sizes[::-1], strict=True)
    ]
    assert len(requests) == first  # served from the block cache
    assert f.read_ranges([len(body) - 5], [5]) == [body[-5:]]
    f.close()


def test_a_short_read_names_the_object_and_the_bytes(world, monkeypatch):
    """A server that sends fewer bytes than asked (a smaller body of a matching length):
    pyarrow reports the whole length with the rest of its buffer unwritten; the read says
    how many bytes came, not garbage that later reads as a corrupt file."""
    from mds.core.object_ranges import RangeFile
    from mds.core.storage import get_bytes

    top, store, _ = world
    body = bytes(range(256)) * 40
    store.put("short/blob", body)
    store.put("short/plan.mds", (top / "s3.mds").read_bytes())
    url, plan_url = store.url("short/blob"), store.url("short/plan.mds")
    with fault_proxy(store, monkeypatch) as proxy:
        f, plan = RangeFile(url, None), PlanReader(plan_url)
        try:
            assert f.read_at(1000, 500) == body[500:1500]  # through the proxy, no fault
            proxy.add("GET", "short/*", "short", keep=100)
            with pytest.raises(
                SourceDataError,
                match=rf"^short read from {url} \(got 100 of 1000 bytes at offset 500\)$",
            ):
                f.read_at(1000, 500)
            with pytest.raises(
                SourceDataError,
                match=rf"^short read from {url} \(got 100 of {len(body)} bytes at offset 0\)$",
            ):
                get_bytes(url)
            with pytest.raises(PlanError, match=rf"cannot read plan: short read from {plan_url} "):
                plan.rank_chunk(0, 0)
        finally:
            f.close()
            plan.close()
        one_error_line(mds("verify", plan_url), f"short read from {plan_url} (got 100 of")


def test_a_full_read_whose_last_byte_matches_the_fill_is_whole(world, monkeypatch):
    """The end of a buffer that happens to hold the fill pattern is read again, not taken
    for a short answer."""
    from mds.core import storage
    from mds.core.object_ranges import RangeFile

    _top, store, _ = world
    body = bytes(range(256)) * 4
    store.put("short/fill", body)
    monkeypatch.setattr(storage, "_FILL", body[-64:])  # the data ends with the pattern
    monkeypatch.setattr(storage, "_OTHER", bytes(b ^ 0xFF for b in body[-64:]))
    f = RangeFile(store.url("short/fill"), None)
    try:
        assert f.read_at(len(body), 0) == body
    finally:
        f.close()


def _replaced_same_size(plan: bytes) -> bytes:
    """Another object of the plan's size: its footer and its first block differ."""
    data = bytearray(plan)
    offset, size, _digest, _magic = struct.unpack("<QQ8s8s", data[-32:])
    data[offset + size // 2] ^= 0x01
    data[64] ^= 0x01
    return bytes(data)


@pytest.mark.parametrize("other", ["another plan", "same size"])
def test_a_plan_object_replaced_while_read_is_named_as_replaced(world, other):
    top, store, _ = world
    original = (top / "s3.mds").read_bytes()
    store.put("replaced/plan.mds", original)
    url = store.url("replaced/plan.mds")
    with PlanReader(url) as plan:
        if other == "another plan":  # a longer plan of the same data: another size
            longer = top / "replaced-longer.mds"
            index = ("--index", top / "local-index")
            assert mds("plan", top / "local.toml", "-o", longer, "--steps", "40", *index).exit_code == 0
            replacement = longer.read_bytes()
            assert len(replacement) != len(original)
        else:
            replacement = _replaced_same_size(original)
        store.put("replaced/plan.mds", replacement)
        with pytest.raises(PlanError, match=rf"{url} changed while it was being read") as info:
            for chunk in range(len(plan.chunks)):
                for rank in range(plan.dp):
                    plan.rank_chunk(chunk, rank)
        assert "(it was replaced" in str(info.value)
        assert "corrupt" not in str(info.value)


def test_a_plan_object_damaged_in_place_is_still_corrupt(world):
    """The same footer, a block that does not match its checksum: damage, not a new plan."""
    top, store, _ = world
    data = bytearray((top / "s3.mds").read_bytes())
    store.put("damaged/plan.mds", bytes(data))
    url = store.url("damaged/plan.mds")
    with PlanReader(url) as plan:
        offset, _size, _c = struct.unpack("<QQ8s", data[plan.chunks[0][2] : plan.chunks[0][2] + 24])
        data[offset] ^= 0x01
        store.put("damaged/plan.mds", bytes(data))
        with pytest.raises(PlanError, match=r"chunk 0 rank 0: checksum mismatch \(corrupt file\)"):
            plan.rank_chunk(0, 0)


# --- writes: put_file --------------------------------------------------------------------------


class _Stream:
    """A pyarrow output stream whose first write sends half its bytes, then `then()`."""

    def __init__(self, real, then):
        self._real, self._then = real, then

    def write(self, data):
        self._real.write(data[: len(data) // 2])
        self._then()
        self._real.write(data[len(data) // 2 :])

    def close(self):
        self._real.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._real.close()  # as pyarrow's: completes the upload, also while unwinding


class _Store:
    """A pyarrow filesystem whose output streams and copies call `during_write` and
    `after_copy`, to land an interrupt there."""

    def __init__(self, real, during_write=None, after_copy=None):
        self._real, self.during_write, self.after_copy = real, during_write, after_copy
        self.streams: list[str] = []

    def open_output_stream(self, key, *args, **kwargs):
        self.streams.append(key)
        stream = self._real.open_output_stream(key, *args, **kwargs)
        return _Stream(stream, self.during_write) if self.during_write else stream

    def copy_file(self, src, dest):
        self._real.copy_file(src, dest)
        if self.after_copy:
            self.after_copy()

    def __getattr__(self, name):
        return getattr(self._real, name)


def _interrupt():
    raise KeyboardInterrupt


def _sigint():
    signal.raise_signal(signal.SIGINT)


def _keys(store, prefix: str) -> list[str]:
    listed = store.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"] for o in listed if not o["Key"].endswith("/"))


@pytest.fixture
def put(world, monkeypatch, tmp_path):
    """(store, local new file, URL of an object holding the old bytes, a patcher of the
    filesystem put_file sees)."""
    from mds.core import storage

    _top, store, _ = world
    prefix = f"puts/{tmp_path.name}"
    store.put(f"{prefix}/plan.mds", b"old plan " * 100)
    local = tmp_path / "new"
    local.write_bytes(b"new plan " * 1000)
    real = storage.filesystem

    def patch(**hooks):
        fake = _Store(real(), **hooks)
        monkeypatch.setattr(storage, "filesystem", lambda url="s3://": fake)
        return fake

    return store, local, store.url(f"{prefix}/plan.mds"), patch


def test_put_file_replaces_an_object_through_a_hidden_temporary(put):
    from mds.core import commit
    from mds.planner.runtime import upload

    store, local, url, patch = put
    fake = patch()
    upload.put_file(local, url)
    key = url.split("/", 3)[3]
    assert store.get(key) == local.read_bytes()
    (stream,) = fake.streams  # the bytes went to a hidden sibling, never to the object
    assert stream.rsplit("/", 1)[1].startswith(".plan.mds.tmp-")
    assert commit.is_temp_name(stream)
    assert _keys(store, key.rsplit("/", 1)[0] + "/") == [key]  # the temporary is gone
    assert url in commit.written()


@pytest.mark.parametrize("how", [_interrupt, _sigint], ids=["KeyboardInterrupt", "SIGINT"])
def test_an_interrupted_put_file_leaves_the_object_as_it_was(put, how):
    from mds.core import commit
    from mds.planner.runtime import upload

    store, local, url, patch = put
    key = url.split("/", 3)[3]
    old = store.get(key)
    patch(during_write=how)
    with pytest.raises(KeyboardInterrupt) as info:
        upload.put_file(local, url)
    assert not isinstance(info.value, Interrupted)  # nothing was committed
    assert store.get(key) == old
    assert _keys(store, key.rsplit("/", 1)[0] + "/") == [key]
    assert url not in commit.written()


def test_an_interrupt_during_the_copy_is_held_and_says_the_object_was_written(put):
    from mds.planner.runtime import upload

    store, local, url, patch = put
    key = url.split("/", 3)[3]
    patch(after_copy=_sigint)  # the copy request is done when the signal lands
    with pytest.raises(Interrupted, match=rf"^the interrupt came after {url} was written whole$"):
        upload.put_file(local, url)
    assert store.get(key) == local.read_bytes()
    assert _keys(store, key.rsplit("/", 1)[0] + "/") == [key]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_an_object_over_the_copy_limit_is_never_partial(put, monkeypatch):
    """CopyObject copies at most 5 GiB: a larger object goes to its temporary like any other
    and is put in place by a multipart copy (boto3), whose completion is atomic. A failure
    mid-upload leaves the old object; a signal during the copy waits for its end."""
    from mds.planner.runtime import upload

    store, local, url, patch = put
    key = url.split("/", 3)[3]
    old = store.get(key)
    monkeypatch.setattr(upload, "COPY_LIMIT", 100)

    def fail():
        raise OSError("local read error")

    patch(during_write=fail)
    with pytest.raises(SourceDataError, match=rf"^{url}: cannot write"):
        upload.put_file(local, url)
    assert store.get(key) == old
    copied = []
    client = upload.s3_client()
    real_copy = client.copy

    def copy(*args, **kwargs):
        copied.append(args[1:3])
        _sigint()
        return real_copy(*args, **kwargs)

    monkeypatch.setattr(client, "copy", copy)
    fake = patch()
    with pytest.raises(Interrupted, match=rf"after {url} was written whole"):
        upload.put_file(local, url)
    assert copied == [(BUCKET, key)] and fake.streams[0] != f"{BUCKET}/{key}"
    assert store.get(key) == local.read_bytes()
    assert _keys(store, key.rsplit("/", 1)[0] + "/") == [key]


def test_a_failed_copy_leaves_the_object_and_no_temporary(put, monkeypatch):
    from mds.planner.runtime import upload

    store, local, url, patch = put
    key = url.split("/", 3)[3]
    old = store.get(key)

    def refuse():
        raise OSError("When copying key: AWS Error ACCESS_DENIED")

    fake = patch()
    monkeypatch.setattr(fake, "copy_file", lambda src, dest: refuse())
    with pytest.raises(SourceDataError, match=rf"^{url}: cannot write after 2 attempts"):
        upload.put_file(local, url)
    assert store.get(key) == old
    assert _keys(store, key.rsplit("/", 1)[0] + "/") == [key]


def test_an_upload_in_flight_is_never_a_source_object(world):
    """put_file's temporary (a hidden sibling) under a data root is not listed as data, even
    by a pattern that would match its name."""
    from mds.planner.index.objects import listing

    _top, store, url = world
    key = "corpus/web/.part-9.parquet.tmp-1-abcdef-01234567"
    store.put(key, b"half an upload")
    try:
        keys = listing(url)
        assert "web/part-0.parquet" in keys
        assert not [k for k in keys if ".tmp-" in k]
    finally:
        store.delete(key)
