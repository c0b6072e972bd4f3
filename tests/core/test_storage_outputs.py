"""Plans (and indexes) in object storage, against a real S3-protocol server on 127.0.0.1
(moto): `mds plan -o s3://...` uploads the plan as one object once it is complete, the
executor replays it with range reads, and a missing plan object or a failed upload is one
line naming the URL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import mds, one_error_line
from executor_builders import batch_digest
from s3_store import BUCKET, free_port, s3_server
from store_corpus import corpus_config, index_and_plan, replay, write_corpus

from mds.core.storage import DATA_ROOT_ENV
from mds.errors import PlanError
from mds.executor import PlanExecutor

CONFIG = corpus_config(seed=5, tail="\n[plan]\nchunk_steps = 3\n")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    top = tmp_path_factory.mktemp("outputs")
    write_corpus(top / "data", 6, forum="forum.jsonl", row_group_size=None)
    with pytest.MonkeyPatch.context() as patch, s3_server(patch) as store:
        patch.delenv(DATA_ROOT_ENV, raising=False)
        url = store.upload(top / "data", "corpus")
        for name, root in (("local", str(top / "data")), ("s3", url)):
            index_and_plan(top, name, CONFIG.format(root=root))
        yield top, store, url


@pytest.mark.parametrize("data", ["local", "s3"])
def test_a_plan_written_to_object_storage_replays_with_range_reads(world, data):
    top, store, _url = world
    target = f"s3://{BUCKET}/plans/{data}/plan.mds"
    out = mds("plan", top / f"{data}.toml", "-o", target, "--index", top / f"{data}-index")
    assert out.exit_code == 0, out.output
    assert target in out.output
    # the plan written beside its index, byte for byte: it records the index and a local
    # data root relative to the index's directory, so the local data is given here
    assert store.get(f"plans/{data}/plan.mds") == (top / f"{data}.mds").read_bytes()
    where = {"data_root": top / "data"} if data == "local" else {}
    for rank in range(2):
        expected = replay(top / f"{data}.mds", rank)
        assert replay(target, rank, **where) == expected
        with PlanExecutor(target, rank, **where) as ex:  # resume from a state saved mid-run
            it = iter(ex)
            for _ in range(5):
                next(it)
            state = ex.state_dict()
        with PlanExecutor(target, rank, **where) as ex:
            ex.load_state_dict(state)
            assert [batch_digest(b) for b in ex] == expected[5:]


def test_dataloader_workers_read_a_plan_object(world):
    top, _store, _url = world
    target = f"s3://{BUCKET}/plans/workers/plan.mds"
    assert mds("plan", top / "s3.toml", "-o", target, "--index", top / "s3-index").exit_code == 0
    expected = replay(top / "s3.mds", 0)
    with PlanExecutor(target, 0) as ex:
        next(iter(ex))
        ex.seek(0)
        assert [batch_digest(b) for b in ex.dataloader(num_workers=2)] == expected


def test_a_missing_plan_object_is_an_error_naming_it(world):
    target = f"s3://{BUCKET}/plans/none/plan.mds"
    with pytest.raises(PlanError, match=rf"{target}: missing"):
        PlanExecutor(target, 0)


def test_a_failed_upload_names_the_url_and_leaves_no_plan(world, monkeypatch):
    top, store, _url = world
    target = f"s3://{BUCKET}/plans/failed/plan.mds"
    from mds.planner.runtime import upload

    put = upload.put_file

    def put_to_a_server_that_is_down(local, url):  # the server goes down for the upload
        with monkeypatch.context() as patch:
            patch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
            put(local, url)

    monkeypatch.setattr(upload, "put_file", put_to_a_server_that_is_down)
    one_error_line(
        mds("plan", top / "local.toml", "-o", target, "--index", top / "local-index"),
        target,
        "cannot write",
    )
    listed = store.client.list_objects_v2(Bucket=BUCKET, Prefix="plans/failed/")
    assert listed.get("KeyCount", 0) == 0
    assert not list(Path(top).glob("**/.plan.mds.tmp-*"))


@pytest.mark.parametrize("data", ["local", "s3"])
def test_an_index_written_to_object_storage_plans_the_same_batches(world, data):
    top, store, _url = world
    prefix = f"s3://{BUCKET}/indexes/{data}"
    out = mds("index", top / f"{data}.toml", "-o", prefix, "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["index"] == prefix
    local = json.loads((top / f"{data}-index" / "manifest.json").read_text())
    remote = json.loads(store.get(f"indexes/{data}/manifest.json"))
    assert remote["fingerprint"] == local["fingerprint"]  # the same index, by content
    plan = top / f"{data}-from-s3-index.mds"
    out = mds("plan", top / f"{data}.toml", "-o", plan, "--index", prefix)
    assert out.exit_code == 0, out.output
    with PlanExecutor(plan, 0) as ex:
        assert ex._reader.footer["index"]["path"] == prefix
    assert replay(plan, 0) == replay(top / f"{data}.mds", 0)
    target = f"{prefix}/plan.mds"  # both in the store
    assert mds("plan", top / f"{data}.toml", "-o", target, "--index", prefix).exit_code == 0
    assert replay(target, 1) == replay(top / f"{data}.mds", 1)


def test_a_re_index_replaces_the_manifest_last_and_keeps_unnamed_objects(world, monkeypatch):
    top, store, _url = world
    prefix = f"s3://{BUCKET}/indexes/again"
    assert mds("index", top / "local.toml", "-o", prefix).exit_code == 0
    store.put("indexes/again/sources/stale-0000.parquet", b"old")
    order: list[str] = []
    from mds.planner.runtime import upload

    put = upload.put_file
    monkeypatch.setattr(
        upload, "put_file", lambda local, url: (order.append(url), put(local, url))
    )
    assert mds("index", top / "local.toml", "-o", prefix).exit_code == 0
    # the tables in place are the ones the data gives again: only the manifest is sent
    assert order == [f"{prefix}/manifest.json"]
    keys = [
        o["Key"]
        for o in store.client.list_objects_v2(Bucket=BUCKET, Prefix="indexes/again/")["Contents"]
    ]
    # no manifest named it, so mds did not write it: a re-index never removes it
    assert store.get("indexes/again/sources/stale-0000.parquet") == b"old"
    assert "indexes/again/sources/stale-0000.parquet" in keys


def test_a_failed_index_upload_keeps_the_index_in_place(world, monkeypatch):
    top, store, _url = world
    prefix = f"s3://{BUCKET}/indexes/kept"
    assert mds("index", top / "local.toml", "-o", prefix).exit_code == 0
    before = store.get("indexes/kept/manifest.json")
    from mds.errors import SourceDataError
    from mds.planner.runtime import upload

    def fail_manifest(local, url):
        if url.endswith("manifest.json"):
            raise SourceDataError(f"{url}: cannot write after 2 attempts (test)")
        return put(local, url)

    put = upload.put_file
    monkeypatch.setattr(upload, "put_file", fail_manifest)
    one_error_line(mds("index", top / "s3.toml", "-o", prefix), f"{prefix}/manifest.json")
    assert store.get("indexes/kept/manifest.json") == before
    monkeypatch.undo()
    assert mds("plan", top / "local.toml", "-o", top / "kept.mds", "--index", prefix).exit_code == 0


def test_a_prefix_without_an_index_is_an_error_naming_it(world, tmp_path):
    top, _store, _url = world
    prefix = f"s3://{BUCKET}/indexes/none"
    one_error_line(
        mds("plan", top / "local.toml", "-o", tmp_path / "p.mds", "--index", prefix),
        f"{prefix}: no index there",
    )


def test_mds_verify_checks_a_plan_and_an_index_in_object_storage(world):
    top, store, _url = world
    prefix = f"s3://{BUCKET}/indexes/verified"
    target = f"{prefix}/plan.mds"
    assert mds("index", top / "s3.toml", "-o", prefix).exit_code == 0
    assert mds("plan", top / "s3.toml", "-o", target, "--index", prefix).exit_code == 0
    out = mds("verify", target, "--json")
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["plan"] == target and report["index"] == prefix and report["ok"]
    local = top / "verified.mds"  # a local plan made from the index in the store
    assert mds("plan", top / "s3.toml", "-o", local, "--index", prefix).exit_code == 0
    assert mds("verify", local).exit_code == 0
    original = store.get("corpus/forum.jsonl")
    try:
        store.put("corpus/forum.jsonl", original + b"\n")
        one_error_line(mds("verify", target), target, "forum.jsonl: size changed")
    finally:
        store.put("corpus/forum.jsonl", original)
    one_error_line(mds("verify", f"{prefix}/none.mds"), f"{prefix}/none.mds: missing")


def test_a_plan_verifies_against_its_index_in_a_store_after_a_re_index(world):
    """The re-index of a grown corpus keeps the replaced manifest and its tables under the
    prefix: `mds verify` copies those for the plan made before it, which still verifies."""
    top, store, _url = world
    prefix = f"s3://{BUCKET}/indexes/grown"
    target = f"{prefix}/plan.mds"
    assert mds("index", top / "s3.toml", "-o", prefix).exit_code == 0
    assert mds("plan", top / "s3.toml", "-o", target, "--index", prefix).exit_code == 0
    store.put("corpus/web/part-9.parquet", store.get("corpus/web/part-1.parquet"))
    try:
        out = mds("index", top / "s3.toml", "-o", prefix)
        assert out.exit_code == 0, out.output
        out = mds("verify", target, "--json")
        assert out.exit_code == 0, out.output
        assert json.loads(out.stdout)["ok"]
        out = mds("inspect", target, "--step", "1", "--json")  # reports read the old index too
        assert out.exit_code == 0, out.output
        assert json.loads(out.stdout)["step"] == 1
    finally:
        store.delete("corpus/web/part-9.parquet")


def test_config_keys_name_an_index_in_object_storage(world):
    """[index] output and [plan] index take a URL as they take a directory: `mds index` and
    `mds plan` then need no -o/--index to find it."""
    top, store, _url = world
    prefix = f"s3://{BUCKET}/indexes/by-config"
    config = top / "by-config.toml"
    text = (top / "local.toml").read_text()
    text = text.replace("[index]\n", f'[index]\noutput = "{prefix}/"\n', 1)
    config.write_text(text.replace("[plan]\n", f'[plan]\nindex = "{prefix}"\n', 1))
    out = mds("index", config, "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["index"] == prefix
    assert store.get("indexes/by-config/manifest.json")
    plan = top / "by-config.mds"
    out = mds("plan", config, "-o", plan)
    assert out.exit_code == 0, out.output
    assert replay(plan, 0) == replay(top / "local.mds", 0)
