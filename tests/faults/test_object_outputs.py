"""Index and plan outputs in object storage (moto's S3 server, and the GCS emulator where the
code path is shared) never remove or replace an object mds did not write.

| case | expected |
|------|----------|
| `mds index -o` the data root, or a prefix holding it | refused, one line, nothing written |
| `-o` a prefix holding other objects, or someone else's manifest.json | refused as for a directory |
| objects under `sources/` that no manifest named | kept, byte for byte, by every re-index |
| re-index of a changed corpus | only the tables the old manifest named and the new one does not go |
| tables left by a failed commit, matched by a source's glob | not ingested by the next run |
| a damaged table (or manifest) in the store | the error names its s3:// / gs:// URL |
| `mds plan -o` over an object (or file) that is not a plan | refused; a plan is replaced |
| `mds plan -o` the index prefix (or a prefix holding it) | refused |
| random objects under the prefix, any layout, with or without an old index | all survive |
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path, PurePosixPath

import pytest
from builders import write_parquet
from cli_helpers import mds, one_error_line
from gcs_store import gcs_server
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from s3_store import BUCKET, s3_server
from store_corpus import corpus_config, write_corpus

from mds.core.planfile import MAGIC
from mds.core.storage import DATA_ROOT_ENV
from mds.errors import SourceDataError
from mds.planner.runtime import upload
from mds.planner.runtime.atomic import is_temp

CONFIG = corpus_config(web="{web}", steps=4, seed=3)
WEB_ROWS = 60  # write_corpus: two Parquet parts of 30 rows
_prefixes = itertools.count()


class World:
    """One server for a module's tests: a corpus on disk, fresh prefixes, object snapshots."""

    def __init__(self, top: Path, store, scheme: str):
        self.top, self.store, self.scheme = top, store, scheme

    def prefix(self) -> str:
        return f"{self.scheme}-{next(_prefixes)}"

    def url(self, key: str) -> str:
        return self.store.url(key)

    def corpus(self, prefix: str, data: str = "data") -> str:
        """Upload the corpus (top/<data>) under `prefix`; returns its URL."""
        return self.store.upload(self.top / data, prefix)

    def config(self, root: str, web: str = "web/*.parquet") -> Path:
        path = self.top / f"config-{next(_prefixes)}.toml"
        path.write_text(CONFIG.format(root=root, web=web), encoding="utf-8")
        return path

    def objects(self, prefix: str) -> dict[str, bytes]:
        """Every object under `prefix/` and its bytes, read with the store's own client
        (directory markers aside)."""
        if self.scheme == "gs":
            keys = self.store.keys(prefix + "/")
        else:
            pages = self.store.client.get_paginator("list_objects_v2").paginate(
                Bucket=BUCKET, Prefix=prefix + "/"
            )
            keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        # pyarrow keeps a "directory" whose last object it deleted as an empty `dir/` marker
        return {key: self.store.get(key) for key in keys if not key.endswith("/")}


def _corpus(top: Path) -> None:
    write_corpus(top / "data", 3, forum="forum.jsonl", row_group_size=None)
    write_corpus(top / "changed", 4, forum="forum.jsonl", row_group_size=None)


@pytest.fixture(scope="module")
def s3_world(tmp_path_factory):
    top = tmp_path_factory.mktemp("s3-outputs")
    _corpus(top)
    with pytest.MonkeyPatch.context() as patch, s3_server(patch) as store:
        patch.delenv(DATA_ROOT_ENV, raising=False)
        yield World(top, store, "s3")


@pytest.fixture(scope="module")
def gcs_world(tmp_path_factory):
    top = tmp_path_factory.mktemp("gcs-outputs")
    _corpus(top)
    with pytest.MonkeyPatch.context() as patch, gcs_server(patch) as store:
        patch.delenv(DATA_ROOT_ENV, raising=False)
        yield World(top, store, "gs")


@pytest.fixture(params=["s3", "gs"])
def world(request) -> World:
    return request.getfixturevalue("s3_world" if request.param == "s3" else "gcs_world")


def _manifest(w: World, prefix: str) -> dict:
    return json.loads(w.store.get(f"{prefix}/manifest.json"))


def _tables(manifest: dict) -> set[str]:
    """The tables and file lists a manifest names."""
    return {s[k] for s in manifest["sources"] for k in ("table", "files_table")}


# --- refusals ---------------------------------------------------------------------------


def test_an_index_into_the_data_root_is_refused(world):
    prefix = world.prefix()
    root = world.corpus(f"{prefix}/corpus")
    before = world.objects(prefix)
    out = mds("index", world.config(root), "-o", root)
    one_error_line(out, f"-o {root} is the data root {root}; choose another output")
    assert world.objects(prefix) == before


def test_an_index_holding_the_data_root_is_refused(world):
    prefix = world.prefix()
    root = world.corpus(f"{prefix}/corpus")
    before = world.objects(prefix)
    out = mds("index", world.config(root), "-o", world.url(prefix) + "/")
    one_error_line(out, f"-o {world.url(prefix)} holds the data root {root}")
    assert world.objects(prefix) == before


@pytest.mark.parametrize(
    "foreign",
    [
        {"notes.txt": b"keep me"},
        {"manifest.json": b"{ not json"},
        {"manifest.json": b'{"format": "other-tool"}', "sources/web.parquet": b"mine"},
        {"team/sources/README.txt": b"read me"},
    ],
)
def test_an_index_into_a_prefix_that_is_not_an_index_is_refused(s3_world, foreign):
    w = s3_world
    prefix = w.prefix()
    for key, body in foreign.items():
        w.store.put(f"{prefix}/out/{key}", body)
    before = w.objects(prefix)
    out = mds("index", w.config(w.corpus(f"{prefix}/corpus")), "-o", w.url(f"{prefix}/out"))
    one_error_line(
        out,
        f"{w.url(f'{prefix}/out')}: exists, is not empty and is not an mds index; "
        "pick another --output",
    )
    assert w.objects(prefix) == {**before, **w.objects(f"{prefix}/corpus")}


# --- what a build removes ---------------------------------------------------------------


def test_objects_under_sources_that_no_manifest_named_survive(world):
    """A prefix with only `sources/` is accepted (a failed first run leaves tables there), and
    nothing there that no manifest named is ever removed, by the first run or a re-index."""
    prefix = world.prefix()
    mine = {
        f"{prefix}/out/sources/README.txt": b"the team's notes",
        f"{prefix}/out/sources/web-0123456789abcdef.parquet": b"looks like a table",
    }
    for key, body in mine.items():
        world.store.put(key, body)
    config = world.config(world.corpus(f"{prefix}/corpus"))
    for _ in range(2):
        out = mds("index", config, "-o", world.url(f"{prefix}/out"))
        assert out.exit_code == 0, out.output
        objects = world.objects(f"{prefix}/out")
        assert {k: objects.get(k) for k in mine} == mine


def test_a_re_index_of_a_changed_corpus_keeps_the_replaced_index_and_touches_nothing_else(
    world, tmp_path
):
    """The replaced manifest is kept under history/ with its tables (plans made from it
    still verify); which tables go, and when, is tests/planner/index/test_history.py's."""
    prefix = world.prefix()
    index = world.url(f"{prefix}/index")
    config = world.config(world.corpus(f"{prefix}/corpus"))
    mine = {f"{prefix}/index/notes.txt": b"notes", f"{prefix}/index/sources/own.parquet": b"x"}
    assert mds("index", config, "-o", index).exit_code == 0
    for key, body in mine.items():
        world.store.put(key, body)
    old = _tables(_manifest(world, f"{prefix}/index"))
    world.corpus(f"{prefix}/corpus", "changed")  # every source's data changes
    out = mds("index", config, "-o", index)
    assert out.exit_code == 0, out.output
    new = _tables(_manifest(world, f"{prefix}/index"))
    assert old and new and not old & new
    objects = world.objects(f"{prefix}/index")
    (kept,) = [k for k in objects if k.startswith(f"{prefix}/index/history/")]
    assert set(objects) == {f"{prefix}/index/manifest.json", kept, *mine} | {
        f"{prefix}/index/{t}" for t in new | old
    }
    assert {k: objects[k] for k in mine} == mine
    out = mds("plan", config, "--index", index, "-o", tmp_path / "p.mds")  # checks every table
    assert out.exit_code == 0, out.output


def test_orphan_tables_of_a_failed_commit_are_not_ingested(s3_world, monkeypatch):
    """The index prefix lies under the data root and `**/*.parquet` matches its tables: after
    a commit that failed (tables uploaded, no manifest) the next run indexes the corpus only."""
    w = s3_world
    prefix = w.prefix()
    root = w.corpus(f"{prefix}/corpus")
    index = f"{root}/idx"
    config = w.config(root, web="**/*.parquet")
    put = upload.put_file

    def fail_manifest(local, url):
        if url.endswith("manifest.json"):
            raise SourceDataError(f"{url}: cannot write after 2 attempts (test)")
        return put(local, url)

    with monkeypatch.context() as patch:
        patch.setattr(upload, "put_file", fail_manifest)
        one_error_line(mds("index", config, "-o", index), f"{index}/manifest.json")
    orphans = w.objects(f"{prefix}/corpus/idx")
    assert orphans and all("/idx/sources/" in k for k in orphans)
    out = mds("index", config, "-o", index, "--json")
    assert out.exit_code == 0, out.output
    web = next(s for s in json.loads(out.stdout)["sources"] if s["name"] == "web")
    assert (web["files"], web["rows"]) == (2, WEB_ROWS)


def test_objects_skip_the_same_indexes_as_local_files(s3_world, tmp_path):
    """Discovery of objects leaves out what discovery of files does: a directory holding an
    mds manifest.json, not one holding another tool's manifest.json."""
    w = s3_world
    data = tmp_path / "data"
    write_corpus(data, 5, forum="forum.jsonl", row_group_size=None)
    write_parquet(data / "other/extra.parquet", {"tokens": [[1, 2, 3]] * 4})
    (data / "other/manifest.json").write_text('{"format": "other-tool"}')
    assert mds("index", w.config(str(data)), "-o", data / "old-index").exit_code == 0
    prefix = w.prefix()
    root = w.store.upload(data, f"{prefix}/corpus")
    config = w.config(root, web="**/*.parquet")
    out = mds("index", config, "-o", tmp_path / "from-objects", "--json")
    assert out.exit_code == 0, out.output
    local = mds("index", w.config(str(data), web="**/*.parquet"), "-o", tmp_path / "i", "--json")
    assert local.exit_code == 0, local.output
    files = {s["name"]: s["files"] for s in json.loads(out.stdout)["sources"]}
    assert files == {s["name"]: s["files"] for s in json.loads(local.stdout)["sources"]}
    assert files["web"] == 3  # the two parts and other/extra.parquet; old-index/ is skipped


# --- errors name URLs -------------------------------------------------------------------


def test_a_damaged_table_in_the_store_is_named_by_its_url(world, tmp_path):
    prefix = world.prefix()
    index = world.url(f"{prefix}/index")
    config = world.config(world.corpus(f"{prefix}/corpus"))
    assert mds("index", config, "-o", index).exit_code == 0
    table = next(t for t in _tables(_manifest(world, f"{prefix}/index")) if "web" in t)
    body = bytearray(world.store.get(f"{prefix}/index/{table}"))
    body[len(body) // 2] ^= 0xFF
    world.store.put(f"{prefix}/index/{table}", bytes(body))
    line = one_error_line(
        mds("plan", config, "--index", index, "-o", tmp_path / "p.mds"),
        f"{index}/{table}: checksum ",
        "the index is damaged",
    )
    assert "mds-index-" not in line  # not the temporary copy
    world.store.put(f"{prefix}/index/manifest.json", b'{"format": "mds-index"}')
    one_error_line(
        mds("plan", config, "--index", index, "-o", tmp_path / "p.mds"),
        f"{index}/manifest.json: manifest has no integer `version`",
    )


# --- plans ------------------------------------------------------------------------------


def test_a_plan_object_replaces_only_a_plan(s3_world, tmp_path):
    w = s3_world
    prefix = w.prefix()
    config = w.config(str(w.top / "data"))
    local_index = tmp_path / "index"
    assert mds("index", config, "-o", local_index).exit_code == 0
    w.store.put(f"{prefix}/notes.mds", b"not a plan")
    target = w.url(f"{prefix}/notes.mds")
    one_error_line(
        mds("plan", config, "--index", local_index, "-o", target),
        f"{target}: exists and is not an mds plan; pick another -o/--output",
    )
    assert w.store.get(f"{prefix}/notes.mds") == b"not a plan"
    target = w.url(f"{prefix}/plan.mds")
    plans = []
    for steps in ("4", "2"):  # the second run replaces the first run's plan
        out = mds("plan", config, "--index", local_index, "-o", target, "--steps", steps)
        assert out.exit_code == 0, out.output
        plans.append(w.store.get(f"{prefix}/plan.mds"))
    assert plans[1].startswith(MAGIC) and len(plans[1]) < len(plans[0])


def test_a_plan_object_is_never_the_index(s3_world, tmp_path):
    w = s3_world
    prefix = w.prefix()
    config = w.config(str(w.top / "data"))
    index = w.url(f"{prefix}/index")
    assert mds("index", config, "-o", index).exit_code == 0
    before = w.objects(prefix)
    table = next(iter(_tables(_manifest(w, f"{prefix}/index"))))
    for target, message in (
        (index, f"-o {index} is the index directory {index}"),
        (w.url(prefix), f"-o {w.url(prefix)} holds the index directory {index}"),
        (f"{index}/manifest.json", f"{index}/manifest.json: exists and is not an mds plan"),
        (f"{index}/{table}", f"{index}/{table}: exists and is not an mds plan"),
    ):
        one_error_line(mds("plan", config, "--index", index, "-o", target), message)
    assert w.objects(prefix) == before


def test_a_local_plan_replaces_only_a_plan(tmp_path):
    write_corpus(tmp_path / "data", 3, forum="forum.jsonl", row_group_size=None)
    config = tmp_path / "mds.toml"
    config.write_text(CONFIG.format(root=tmp_path / "data", web="web/*.parquet"))
    assert mds("index", config, "-o", tmp_path / "index").exit_code == 0
    (tmp_path / "notes.mds").write_bytes(b"not a plan")
    one_error_line(
        mds("plan", config, "--index", tmp_path / "index", "-o", tmp_path / "notes.mds"),
        f"{tmp_path / 'notes.mds'}: exists and is not an mds plan",
    )
    assert (tmp_path / "notes.mds").read_bytes() == b"not a plan"
    for _ in range(2):
        out = mds("plan", config, "--index", tmp_path / "index", "-o", tmp_path / "p.mds")
        assert out.exit_code == 0, out.output


# --- the property -----------------------------------------------------------------------

_PARTS = st.sampled_from(["a", "docs", "sources", "idx", ".hidden"])
_NAMES = st.sampled_from(
    ["README.txt", "x.parquet", "manifest.json", "data.jsonl", ".tmp", "notes"]
) | st.from_regex(r"web-[0-9a-f]{16}\.parquet", fullmatch=True)
_KEYS = st.builds(
    lambda parts, name: "/".join([*parts, name]), st.lists(_PARTS, max_size=2), _NAMES
)
# Where the index goes relative to the data root: elsewhere, the root itself, a prefix holding
# the root, or a prefix inside the root (which a `**/*.parquet` source then spans).
_LAYOUTS = {
    "apart": ("corpus", "out"),
    "root": ("corpus", "corpus"),
    "holds": ("corpus", ""),
    "inside": ("corpus", "corpus/idx"),
}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=st.sampled_from(sorted(_LAYOUTS)),
    objects=st.dictionaries(_KEYS, st.binary(max_size=48), max_size=5),
    previous=st.booleans(),
)
def test_an_index_build_keeps_every_object_it_did_not_write(s3_world, layout, objects, previous):
    w = s3_world
    prefix = w.prefix()
    root_rel, out_rel = _LAYOUTS[layout]
    root = w.corpus(f"{prefix}/{root_rel}")
    out_key = f"{prefix}/{out_rel}".rstrip("/")
    config = w.config(root, web="**/*.parquet")
    previous = previous and layout in ("apart", "inside")  # else refused: no index to be had
    before_previous = w.objects(prefix)
    if previous:
        assert mds("index", config, "-o", w.url(out_key)).exit_code == 0
    written = set(w.objects(prefix)) - set(before_previous)  # the old index, by mds
    for key, body in objects.items():
        w.store.put(f"{out_key}/{key}", body)
    theirs = {
        k: v
        for k, v in w.objects(prefix).items()
        if k not in written or k[len(out_key) + 1 :] in objects
    }

    out = mds("index", config, "-o", w.url(out_key))

    after = w.objects(prefix)
    assert {k: after.get(k) for k in theirs} == theirs
    foreign = [
        k for k in objects if k.split("/", 1)[0] != "sources" and not is_temp(PurePosixPath(k))
    ]
    refused = (
        layout in ("root", "holds") or "manifest.json" in objects or (foreign and not previous)
    )
    event(f"{layout}, {'refused' if refused else 'built'}")
    if refused:
        one_error_line(out)
        assert after == theirs | {k: v for k, v in after.items() if k in written}
    else:
        assert out.exit_code == 0, out.output
        manifest = _manifest(w, out_key)
        assert all(f"{out_key}/{t}" in after for t in _tables(manifest))
        web = next(s for s in manifest["sources"] if s["name"] == "web")
        assert web["rows"] == WEB_ROWS  # nothing under the index prefix was ingested
