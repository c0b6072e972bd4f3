"""One writer at a time for an index or a plan in object storage, against moto's S3 server
and the GCS emulator (made to honour `ifGenerationMatch`) on 127.0.0.1: two writers to one
prefix, a writer refused while another holds the lock (real `mds` processes), stale locks
taken over by one of many racers, renewal, and a store client that is not installed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from cli_helpers import mds, one_error_line
from gcs_store import gcs_server
from s3_store import BUCKET, s3_server
from store_corpus import corpus_config, write_corpus

from mds.core.storage import DATA_ROOT_ENV
from mds.errors import ConfigError, OutputError, install_hint
from mds.planner.index.build import build_index
from mds.planner.index.config import load_config
from mds.planner.runtime import upload
from mds.planner.runtime.object_lock import TTL_ENV, lock_url, object_lock

CONFIG = corpus_config(forum="forum/forum.jsonl", steps=4, dp_size=1, micro_batches=1, seed=3)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _lock_record(pid: int, host: str | None = None) -> bytes:
    host = host or socket.gethostname()
    return json.dumps({"pid": pid, "host": host, "since": "then", "token": "x"}).encode()


def _mds_process(*args) -> subprocess.CompletedProcess:
    """`mds ARGS` in a process of its own, with this environment (the store's endpoint)."""
    return subprocess.run(
        [sys.executable, "-m", "mds", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    top = tmp_path_factory.mktemp("object-lock")
    write_corpus(top / "data", 4)
    (top / "local.toml").write_text(CONFIG.format(root=top / "data"), encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch, s3_server(patch) as store:
        patch.delenv(DATA_ROOT_ENV, raising=False)
        patch.delenv(TTL_ENV, raising=False)
        yield top, store


def _keys(store, prefix: str) -> list[str]:
    """The objects under `prefix`, without the empty directory markers ("p/") that pyarrow
    leaves when it deletes the last object of a prefix (an upload's temporary)."""
    listed = store.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", []) if not o["Key"].endswith("/"))


def test_lock_object_sits_beside_the_output():
    assert lock_url("s3://b/p/idx") == "s3://b/p/.idx.lock"
    assert lock_url("s3://b/p/idx/") == "s3://b/p/.idx.lock"
    assert lock_url("gs://b/plan.mds") == "gs://b/.plan.mds.lock"
    assert lock_url("s3://b") == "s3://b/.mds.lock"
    long = lock_url("s3://b/p/" + "x" * 300)
    assert long.startswith("s3://b/p/.xxx") and len(long.rsplit("/", 1)[1]) <= 200


def test_two_writers_to_one_s3_prefix_one_wins(s3, monkeypatch):
    """Both writers overlap (the one that reaches its upload waits for the other to end):
    one indexes, the other is refused, and the manifest names only tables that exist."""
    top, store = s3
    url = f"s3://{BUCKET}/locks/two"
    config = load_config(top / "local.toml")
    ended = threading.Event()
    put = upload.put_file
    seen_lock: list[list[str]] = []

    def slow_put(local, target):
        ended.wait(timeout=5)
        seen_lock.append(_keys(store, "locks/.two.lock"))
        return put(local, target)

    monkeypatch.setattr(upload, "put_file", slow_put)
    results: list[object] = [None, None]

    def writer(i: int) -> None:
        try:
            results[i] = build_index(config, url)
        except Exception as exc:
            results[i] = exc
        finally:
            ended.set()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 1, results
    assert isinstance(errors[0], ConfigError)
    message = str(errors[0])
    assert f"{url} is being written by pid {os.getpid()} on host" in message
    assert "\n" not in message
    assert seen_lock and all(keys == ["locks/.two.lock"] for keys in seen_lock)
    manifest = json.loads(store.get("locks/two/manifest.json"))
    keys = set(_keys(store, "locks/two/"))
    assert all(f"locks/two/{e['table']}" in keys for e in manifest["sources"])
    assert _keys(store, "locks/.two.lock") == []  # released


def test_a_writer_is_refused_while_another_holds_the_lock(s3):
    """Real `mds index` and `mds plan` processes: exit 1, one line naming the holder."""
    top, store = s3
    index_url, plan_url = f"s3://{BUCKET}/locks/held", f"s3://{BUCKET}/lockplans/held.mds"
    assert mds("index", top / "local.toml", "-o", index_url).exit_code == 0
    before = store.get("locks/held/manifest.json")
    with object_lock(index_url):
        proc = _mds_process("index", top / "local.toml", "-o", index_url)
        _one_line(proc, f"{index_url} is being written by pid {os.getpid()}", ".held.lock")
    assert store.get("locks/held/manifest.json") == before
    with object_lock(plan_url):
        proc = _mds_process("plan", top / "local.toml", "--index", index_url, "-o", plan_url)
        _one_line(proc, f"{plan_url} is being written by pid {os.getpid()}")
    assert _keys(store, "lockplans/") == []
    proc = _mds_process("plan", top / "local.toml", "--index", index_url, "-o", plan_url)
    assert proc.returncode == 0, proc.stderr
    assert _keys(store, "lockplans/") == ["lockplans/held.mds"]


def test_a_stale_s3_lock_is_taken_over(s3, monkeypatch):
    """A dead pid of this host, or a lock not renewed for the TTL (another host's), is taken
    over; a fresh lock of another host is not."""
    top, store = s3
    url = f"s3://{BUCKET}/locks/stale"
    store.put("locks/.stale.lock", _lock_record(_dead_pid()))
    assert mds("index", top / "local.toml", "-o", url).exit_code == 0
    assert _keys(store, "locks/.stale.lock") == []
    store.put("locks/.stale.lock", _lock_record(1, host="elsewhere"))
    one_error_line(
        mds("index", top / "local.toml", "-o", url), "being written by pid 1 on host elsewhere"
    )
    monkeypatch.setenv(TTL_ENV, "1")
    time.sleep(2.2)  # the store's times are whole seconds
    assert mds("index", top / "local.toml", "-o", url).exit_code == 0
    assert _keys(store, "locks/.stale.lock") == []


def _race(url: str, put_stale, trials: int = 5, racers: int = 8) -> list[int]:
    """`racers` threads take over the same stale lock at once, `trials` times; the number
    that held it each time."""
    wins = [0] * trials
    barrier = threading.Barrier(racers + 1, timeout=60)
    count = threading.Lock()

    def racer() -> None:
        for trial in range(trials):
            barrier.wait()
            try:
                with object_lock(url):
                    with count:
                        wins[trial] += 1
                    barrier.wait()
            except ConfigError:
                barrier.wait()
            barrier.wait()

    threads = [threading.Thread(target=racer) for _ in range(racers)]
    for t in threads:
        t.start()
    for _ in range(trials):
        put_stale()
        barrier.wait()
        barrier.wait()
        barrier.wait()
    for t in threads:
        t.join(timeout=60)
    return wins


def test_racing_takeover_of_a_stale_s3_lock_has_one_winner(s3):
    _top, store = s3
    record = _lock_record(_dead_pid())
    wins = _race(f"s3://{BUCKET}/locks/raced", lambda: store.put("locks/.raced.lock", record))
    assert wins == [1] * len(wins)
    assert _keys(store, "locks/.raced.lock") == []


def test_the_holder_renews_its_lock_and_knows_when_it_lost_it(s3, monkeypatch):
    _top, store = s3
    url = f"s3://{BUCKET}/locks/renewed"
    monkeypatch.setenv(TTL_ENV, "3")
    with object_lock(url) as held:
        first = store.client.head_object(Bucket=BUCKET, Key="locks/.renewed.lock")["ETag"]
        time.sleep(3.5)  # longer than the TTL: renewed meanwhile, so still held
        assert store.client.head_object(Bucket=BUCKET, Key="locks/.renewed.lock")["ETag"] != first
        with pytest.raises(ConfigError, match="is being written by"):
            with object_lock(url):
                pass
        held.check()
    monkeypatch.setenv(TTL_ENV, "0.4")
    with object_lock(url) as held:
        store.delete("locks/.renewed.lock")  # removed by hand: the next renewal finds it gone
        time.sleep(0.5)
        with pytest.raises(OutputError, match=r"lost its lock .*\.renewed\.lock"):
            held.check()


def test_without_boto3_an_s3_write_is_refused_and_reads_work(s3, monkeypatch, tmp_path):
    top, store = s3
    url = f"s3://{BUCKET}/locks/noboto"
    assert mds("index", top / "local.toml", "-o", url).exit_code == 0
    monkeypatch.setitem(sys.modules, "boto3", None)
    one_error_line(mds("index", top / "local.toml", "-o", url), install_hint("s3"))
    one_error_line(
        mds("plan", top / "local.toml", "--index", url, "-o", f"s3://{BUCKET}/locks/p.mds"),
        "pip install '.[s3]'",
    )
    out = mds("plan", top / "local.toml", "--index", url, "-o", tmp_path / "p.mds")
    assert out.exit_code == 0, out.output


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    top = tmp_path_factory.mktemp("gcs-lock")
    write_corpus(top / "data", 5)
    (top / "local.toml").write_text(CONFIG.format(root=top / "data"), encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch, gcs_server(patch) as store:
        patch.delenv(DATA_ROOT_ENV, raising=False)
        patch.delenv(TTL_ENV, raising=False)
        yield top, store


def test_gcs_emulator_honours_generation_preconditions(gcs):
    """The precondition semantics of GCS, as tests/gcs_emulator.py emulates them."""
    from mds.planner.runtime.object_lock import _GCS

    client = _GCS(f"gs://{BUCKET}/pre/.x.lock")
    first = client.create(b"a")
    assert first is not None and client.create(b"b") is None
    assert client.replace(b"c", "1") is None
    second = client.replace(b"c", first)
    assert second is not None and client.read()[:2] == (b"c", second)
    client.delete(first)  # not the current generation: kept
    assert client.read() is not None
    client.delete(second)
    assert client.read() is None


def test_gcs_lock_refuses_a_second_writer_and_takes_over_a_stale_one(gcs):
    top, store = gcs
    url = f"gs://{BUCKET}/indexes/corpus"
    with object_lock(url):
        proc = _mds_process("index", top / "local.toml", "-o", url)
        _one_line(proc, f"{url} is being written by pid {os.getpid()}", ".corpus.lock")
    assert store.keys("indexes/") == []
    store.put("indexes/.corpus.lock", _lock_record(_dead_pid()))
    assert mds("index", top / "local.toml", "-o", url).exit_code == 0
    assert store.keys("indexes/.corpus.lock") == []
    assert "indexes/corpus/manifest.json" in store.keys("indexes/corpus/")
    record = _lock_record(_dead_pid())
    wins = _race(f"gs://{BUCKET}/raced", lambda: store.put(".raced.lock", record), trials=3)
    assert wins == [1, 1, 1]


def test_without_google_auth_a_gcs_write_is_refused(gcs, monkeypatch):
    top, _store = gcs
    monkeypatch.setitem(sys.modules, "google.auth", None)
    one_error_line(
        mds("index", top / "local.toml", "-o", f"gs://{BUCKET}/indexes/none"),
        install_hint("gcs"),
    )


def test_a_lock_object_cannot_be_taken_is_one_line(s3, monkeypatch):
    """A store that cannot be reached while taking the lock: one line naming the lock."""
    from s3_store import free_port

    top, _store = s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    url = f"s3://{BUCKET}/locks/down"
    one_error_line(
        mds("index", top / "local.toml", "-o", url), f"{lock_url(url)}: cannot take the lock"
    )


def test_a_writer_that_lost_its_lock_writes_no_manifest(s3, monkeypatch):
    """The lock removed under a running index (by hand, or taken over after the TTL): it
    stops before its commit point with one line, and the index in place is unchanged."""
    top, store = s3
    url = f"s3://{BUCKET}/locks/lost"
    # the index in place is of other bytes, so the run uploads tables before its manifest
    write_corpus(top / "lost-old", 9)
    (top / "lost-old.toml").write_text(CONFIG.format(root=top / "lost-old"), encoding="utf-8")
    assert mds("index", top / "lost-old.toml", "-o", url).exit_code == 0
    before = store.get("locks/lost/manifest.json")
    monkeypatch.setenv(TTL_ENV, "0.4")
    put, uploaded = upload.put_file, []

    def lose_lock(local, target):
        store.delete("locks/.lost.lock")
        time.sleep(0.5)  # the next renewal finds it gone
        uploaded.append(target)
        return put(local, target)

    monkeypatch.setattr(upload, "put_file", lose_lock)
    one_error_line(mds("index", top / "local.toml", "-o", url), "lost its lock", ".lost.lock")
    assert uploaded and not any(t.endswith("manifest.json") for t in uploaded)
    assert store.get("locks/lost/manifest.json") == before


def test_a_holder_with_a_longer_ttl_is_not_taken_over_by_a_shorter_one(s3, monkeypatch):
    """Staleness is judged by the holder's TTL when it is longer than the taker's: a writer
    with MDS_LOCK_TTL=1 does not take the lock of one that renews every 10 s."""
    _top, store = s3
    url = f"s3://{BUCKET}/locks/ttls"
    monkeypatch.setenv(TTL_ENV, "40")
    with object_lock(url) as held:
        monkeypatch.setenv(TTL_ENV, "1")
        time.sleep(2.2)  # past the taker's TTL, the store's times being whole seconds
        with pytest.raises(ConfigError, match="is being written by"):
            with object_lock(url):
                pass
        held.check()


def test_a_renewal_whose_answer_was_lost_keeps_the_lock(s3, monkeypatch):
    """The store applied a renewal, its answer was lost and the retry failed its condition:
    the lock holds our token, so it is still ours (not "taken over"), and is released."""
    _top, store = s3
    url = f"s3://{BUCKET}/locks/lost-answer"
    monkeypatch.setenv(TTL_ENV, "2")
    with object_lock(url) as held:
        client = held._client
        real = client.replace

        def applied_but_answered_412(body, tag):
            real(body, tag)  # done on the store...
            return None  # ...but the retry saw its own version: precondition failed

        monkeypatch.setattr(client, "replace", applied_but_answered_412)
        time.sleep(1.2)  # two renewals
        monkeypatch.setattr(client, "replace", real)
        held.check()
    assert _keys(store, "locks/.lost-answer.lock") == []


def test_a_whole_bucket_can_be_an_index_output(s3, tmp_path):
    """`-o s3://BUCKET`: the lock object, then at the bucket's top, is not taken for
    someone else's object."""
    top, store = s3
    bucket = "whole-bucket-index"
    store.client.create_bucket(Bucket=bucket)
    result = mds("index", top / "local.toml", "-o", f"s3://{bucket}")
    assert result.exit_code == 0, result.output
    keys = [o["Key"] for o in store.client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert "manifest.json" in keys and ".mds.lock" not in keys
    assert mds("index", top / "local.toml", "-o", f"s3://{bucket}").exit_code == 0


def test_a_dead_pid_of_another_pid_namespace_is_not_stale(s3, monkeypatch):
    """A holder on a machine with our host name but another boot or PID namespace (a
    container sharing the node's name): its pid means nothing here, so only the TTL makes
    its lock stale."""
    top, store = s3
    url = f"s3://{BUCKET}/locks/container"
    record = json.loads(_lock_record(_dead_pid()))
    store.put("locks/.container.lock", json.dumps({**record, "machine": "b/pid:[1]"}).encode())
    one_error_line(mds("index", top / "local.toml", "-o", url), "is being written by pid")
    store.put("locks/.container.lock", _lock_record(_dead_pid()))  # an older record: no machine
    assert mds("index", top / "local.toml", "-o", url).exit_code == 0
