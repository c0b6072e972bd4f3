"""src/mds/planner/index/object_output.py: an index prefix that is or holds the data root is
refused, and an interrupt's message says what it left (the uploads themselves run against
S3 and GCS servers in tests/core/test_storage_outputs.py and tests/faults/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mds.errors import ConfigError
from mds.planner.index.config import parse_config
from mds.planner.index.object_output import TABLE_NAME, check_object_output, index_left, tables_left


def _config(root: str):
    data = {"index": {"root": root}, "source": [{"name": "s", "path": "*.jsonl", "count": "n"}]}
    return parse_config(data, path=Path("/cfg/mds.toml"))


def test_a_prefix_that_is_or_holds_the_data_root_is_refused():
    config = _config("s3://bucket/data")
    check_object_output(config, "s3://bucket/index")
    with pytest.raises(ConfigError, match="is the data root"):
        check_object_output(config, "s3://bucket/data")
    with pytest.raises(ConfigError, match="holds the data root"):
        check_object_output(config, "s3://bucket")
    check_object_output(_config("/local/data"), "s3://bucket")  # a local root: nothing shared


def test_what_an_interrupt_left_is_said_in_one_line():
    url = "s3://b/idx"
    assert tables_left(url, True, set()) == "the previous index at s3://b/idx is intact"
    assert tables_left(url, False, {"sources/a-0123456789abcdef.parquet"}) == (
        "no index was written at s3://b/idx (no manifest.json); 1 new table object was left "
        "under s3://b/idx/sources/"
    )
    assert tables_left(url, True, {"x", "y"}).endswith(
        "; 2 new table objects it does not name were left under s3://b/idx/sources/"
    )
    assert index_left(url, 0) == "the new index was written whole at s3://b/idx"
    assert index_left(url, 3).endswith(
        "; 3 table objects it no longer names were left under s3://b/idx/sources/"
    )


def test_only_tables_named_as_mds_names_them_are_ever_removed():
    assert TABLE_NAME.fullmatch("sources/web-0123456789abcdef.parquet")
    assert not TABLE_NAME.fullmatch("sources/web.parquet")
    assert not TABLE_NAME.fullmatch("other/web-0123456789abcdef.parquet")


def _objects(store, prefix: str) -> dict[str, bytes]:
    """Every object under `prefix` of the store, by its key relative to the prefix."""
    if hasattr(store, "client"):  # S3
        listed = store.client.list_objects_v2(Bucket="mds-test", Prefix=f"{prefix}/")
        keys = [o["Key"] for o in listed.get("Contents", [])]
    else:
        keys = store.keys(f"{prefix}/")
    return {k[len(prefix) + 1 :]: store.get(k) for k in keys}


def _index(store, prefix: str) -> dict[str, bytes]:
    """The objects of the index under `prefix` as a full build makes them: the manifest and
    the tables it names, without history/ and the tables only kept manifests name."""
    objects = _objects(store, prefix)
    named = {
        s[k]
        for s in json.loads(objects["manifest.json"])["sources"]
        for k in ("table", "files_table")
    }
    return {
        k: v
        for k, v in objects.items()
        if not k.startswith("history/")
        and not (k.startswith("sources/") and k.endswith(".parquet") and k not in named)
    }


def _server(kind: str):
    if kind == "s3":
        from s3_store import s3_server

        return s3_server
    from gcs_store import gcs_server

    return gcs_server


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["s3", "gs"])
def test_a_re_index_in_a_store_reads_and_uploads_only_what_changed(
    tmp_path: Path, monkeypatch, kind: str
):
    """Data and index both under prefixes of a store: a re-index of a grown, changed and shrunk
    corpus fingerprints and scans only the new and changed objects, sends no table it did
    not change, and leaves the same bytes as a full index of the same objects."""
    from mds.core import storage
    from mds.planner.index import reuse
    from mds.planner.index.build import build_index
    from mds.planner.runtime import upload

    def config(root: str):
        data = {
            "index": {"root": root},
            "source": [
                {"name": "a", "path": "a/*.jsonl", "tokens": "tokens"},
                {"name": "b", "path": "b/*.jsonl", "tokens": "tokens"},
            ],
        }
        return parse_config(data, path=tmp_path / "mds.toml")

    with _server(kind)(monkeypatch) as store:
        for source in "ab":
            for i in range(6):
                store.put(f"data/{source}/f{i}.jsonl", f'{{"tokens": [{i}, 2]}}\n'.encode())
        cfg = config(store.url("data"))
        build_index(cfg, store.url("idx"), workers=1)
        store.put("data/a/f9.jsonl", b'{"tokens": [9]}\n')  # added
        store.put("data/a/f2.jsonl", b'{"tokens": [2, 2, 2]}\n')  # changed
        store.delete("data/a/f4.jsonl")  # removed; source b is unchanged
        read, sent = [], []
        hashed, put, stat = reuse.fingerprint, upload.put_file, storage.stat
        with pytest.MonkeyPatch.context() as spy:
            spy.setattr(reuse, "fingerprint", lambda p, m: (read.append(str(p)), hashed(p, m))[1])
            spy.setattr(upload, "put_file", lambda f, u: (sent.append(u), put(f, u))[1])
            spy.setattr(storage, "stat", lambda p: (read.append(f"stat {p}"), stat(p))[1])
            build_index(cfg, store.url("idx"), workers=1)
        assert sorted(read) == [store.url("data/a/f2.jsonl"), store.url("data/a/f9.jsonl")]
        # source b's table and file list are in place already: only a's new table and
        # file list, the replaced manifest (kept under history/ for the plans made from it)
        # and the manifest go up
        assert len(sent) == 4 and sent[-1] == store.url("idx/manifest.json")
        assert "/sources/a-" in sent[0] and "/sources/a-files-" in sent[1]
        assert "/history/" in sent[2]
        build_index(config(store.url("data")), store.url("full"), workers=1)
        assert _index(store, "idx") == _objects(store, "full")
        # the replaced manifest and its tables stay
        (kept,) = [k for k in _objects(store, "idx") if k.startswith("history/") and k != "history/"]
        old = json.loads(store.get(f"idx/{kept}"))
        assert all(
            s[k] in _objects(store, "idx") for s in old["sources"] for k in ("table", "files_table")
        )
        # a table object in place whose bytes differ is not reused: its files are rescanned
        # and the table is sent again
        table = next(k for k in _objects(store, "idx") if k.startswith("sources/b-"))
        store.put(f"idx/{table}", b"damaged")
        build_index(cfg, store.url("idx"), workers=1)
        assert _index(store, "idx") == _objects(store, "full")
        # the listing's modification time is the one a stat of the object gives
        listed = {k: m for k, _, m in storage.list_object_infos(store.url("data"))}
        assert listed["a/f9.jsonl"] == storage.stat(store.url("data/a/f9.jsonl")).st_mtime_ns


@pytest.mark.slow
def test_a_re_index_in_a_store_is_the_full_index_of_the_same_objects(tmp_path: Path, monkeypatch):
    """Each change (none, an object added, changed, removed), from an index of either format
    version in place: the prefix's manifest, tables and file lists are byte for byte those
    of a full index of the same objects, with the same fingerprint."""
    from index_files import write_v1

    from mds.planner.index.build import build_index

    def config(root: str):
        source = {"name": "a", "path": "a/*.jsonl", "tokens": "tokens"}
        data = {"index": {"root": root}, "source": [source]}
        return parse_config(data, path=tmp_path / "mds.toml")

    with _server("s3")(monkeypatch) as store:
        for start in ("v2", "v1"):
            for change in ("unchanged", "added", "changed", "removed"):
                data = f"data-{start}-{change}"
                for i in range(5):
                    store.put(f"{data}/a/f{i}.jsonl", f'{{"tokens": [{i}, 2]}}\n'.encode())
                cfg = config(store.url(data))
                index = f"idx-{start}-{change}"
                build_index(cfg, store.url(index), workers=1)
                if start == "v1":  # the index as version 1 wrote it: file entries inline
                    local = tmp_path / "copies" / index
                    for key, body in _index(store, index).items():
                        if not key or key.endswith("/"):  # a folder's marker
                            continue
                        (local / key).parent.mkdir(parents=True, exist_ok=True)
                        (local / key).write_bytes(body)
                    manifest = json.loads((local / "manifest.json").read_text())
                    write_v1(local, manifest)
                    store.put(f"{index}/manifest.json", (local / "manifest.json").read_bytes())
                    for s in manifest["sources"]:
                        store.delete(f"{index}/{s['files_table']}")
                if change == "added":
                    store.put(f"{data}/a/f9.jsonl", b'{"tokens": [9]}\n')
                elif change == "changed":
                    store.put(f"{data}/a/f2.jsonl", b'{"tokens": [2, 2, 2]}\n')
                elif change == "removed":
                    store.delete(f"{data}/a/f4.jsonl")
                again = build_index(cfg, store.url(index), workers=1)
                full = build_index(cfg, store.url(f"full-{start}-{change}"), workers=1)
                assert again.fingerprint == full.fingerprint, (start, change)
                got = _index(store, index)
                assert got == _index(store, f"full-{start}-{change}"), (start, change)
                assert json.loads(got["manifest.json"])["version"] == 2
