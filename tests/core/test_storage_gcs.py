"""Google Cloud Storage (gs://) end to end, against a GCS emulator started by the tests on
127.0.0.1: index objects, plan, replay 2 ranks as from local files, a plan and an index
written to the store, a missing or changed object and a server that is down (one line
naming the URL, after bounded retries)."""

from __future__ import annotations

import pytest
from cli_helpers import mds, one_error_line
from gcs_store import gcs_server
from index_files import manifest_with_files
from store_corpus import (
    assert_replays_as_local,
    corpus_config,
    index_and_plan,
    replay,
    write_corpus,
)

from mds.core import storage
from mds.core.storage import DATA_ROOT_ENV
from mds.errors import DataChangedError, PlanError, SourceDataError
from mds.executor import PlanExecutor

CONFIG = corpus_config(forum="forum", seed=9)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    top = tmp_path_factory.mktemp("gcs")
    write_corpus(top / "local", 12)
    with pytest.MonkeyPatch.context() as patch, gcs_server(patch) as store:
        patch.delenv(DATA_ROOT_ENV, raising=False)
        url = store.upload(top / "local", "corpus")
        for name, root in (("gs", url), ("local", str(top / "local"))):
            index_and_plan(top, name, CONFIG.format(root=root))
        yield top, store, url


def test_gcs_objects_index_and_replay_as_local_files(world):
    top, _store, url = world
    gs = manifest_with_files(top / "gs-index")
    local = manifest_with_files(top / "local-index")
    assert gs["root"] == url and gs["fingerprint"] == local["fingerprint"]
    assert_replays_as_local(top / "local.mds", top / "gs.mds", url)


def test_an_index_and_a_plan_in_gcs(world):
    top, store, _url = world
    prefix = "gs://mds-test/indexes/corpus"
    assert mds("index", top / "gs.toml", "-o", prefix).exit_code == 0
    keys = store.keys("indexes/corpus/")
    assert keys[0] == "indexes/corpus/manifest.json"
    # a table and a file list per source
    assert [k.split("/")[3].split("-")[0] for k in keys[1:]] == ["forum", "forum", "web", "web"]
    target = "gs://mds-test/plans/plan.mds"
    out = mds("plan", top / "gs.toml", "-o", target, "--index", prefix)
    assert out.exit_code == 0, out.output
    assert replay(target, 1) == replay(top / "local.mds", 1)


def test_a_gcs_objects_open_gives_the_size_and_mtime_a_stat_gives(world):
    """The start-up check takes them from the open the reader then uses (`updated`, to the
    fraction of a second GCS keeps)."""
    _top, _store, url = world
    for key in ("forum/forum.jsonl", "web/part-1.parquet"):
        handle = storage.open_input(f"{url}/{key}")
        st, got = storage.stat(f"{url}/{key}"), storage.opened_stat(handle, f"{url}/{key}")
        handle.close()
        assert (got.st_size, got.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_a_missing_or_changed_gcs_object_is_an_error_naming_it(world):
    top, store, url = world
    key = "corpus/forum/forum.jsonl"
    original = store.get(key)
    try:
        store.delete(key)
        with pytest.raises(DataChangedError, match=r"forum/forum.jsonl: missing"):
            replay(top / "gs.mds", 0)
        one_error_line(mds("verify", top / "gs.mds"), "forum/forum.jsonl: missing")
        store.put(key, original + b'{"ids": [1]}\n')
        with pytest.raises(DataChangedError, match=r"forum/forum.jsonl: size changed"):
            replay(top / "gs.mds", 0)
    finally:
        store.put(key, original)
    with pytest.raises(PlanError, match=r"gs://mds-test/plans/none.mds: missing"):
        PlanExecutor("gs://mds-test/plans/none.mds", 0)


def test_a_gcs_server_that_is_down_is_an_error_naming_the_url(world, monkeypatch):
    top, _store, url = world
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # nothing listens
    with pytest.raises(SourceDataError, match=rf"^{url}/\S+: cannot stat after retrying for 2 s"):
        replay(top / "gs.mds", 0)


def test_one_open_gcs_object_serves_reads_from_several_threads_at_once(world):
    """Reads through one open handle from the range request threads at once each get their
    own bytes: the executor shares an object's one handle among them (`RangeFile`)."""
    import numpy as np

    from mds.core.object_ranges import parallel

    _top, store, _url = world
    body = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    store.put("shared/object", body)
    url = "gs://mds-test/shared/object"
    rng = np.random.default_rng(4)
    starts = rng.integers(0, len(body) - 1, 32).tolist()
    sizes = rng.integers(1, 64 << 10, 32).tolist()
    jobs = [(s, min(n, len(body) - s)) for s, n in zip(starts, sizes, strict=True)]
    with storage.open_input(url) as f:
        got = parallel(lambda job: storage.read_exact(f, url, len(body), *job), jobs)
    assert got == [body[s : s + n] for s, n in jobs]
