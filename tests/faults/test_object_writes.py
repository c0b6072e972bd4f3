"""Fault matrix: interrupted and failing writes of plans and indexes to object storage.

Real `mds` processes write to a real S3-protocol server on 127.0.0.1 (moto), some through
the fault proxy (tests/fault_proxy.py), one to the GCS emulator; SIGINT/SIGTERM land at a
chosen phase (tests/fault_builders.py parks the process there). Afterwards the object at
the output is the previous one byte for byte, or the new one whole and valid, no
temporary is left, and the `interrupted:` line says exactly which.

| row | how | expected outcome |
|---|---|---|
| **mds plan -o s3://... over a plan** | | |
| plan-upload (SIGINT, SIGTERM) | parked in the plan's upload, half its bytes sent | exit 130, `interrupted: nothing was written`; previous plan byte-identical |
| plan-copy | signal while the upload is copied over the plan | exit 130, `interrupted: the new plan was written whole to <url> just before the interrupt`; new plan valid |
| plan-hung-request | proxy holds the upload request; SIGINT; released | exit 130, `nothing was written`; previous plan byte-identical |
| plan-500 (upload, copy) | proxy answers 500 to every try | exit 1, `<url>: cannot write after 2 attempts`; previous plan byte-identical |
| plan-truncated (every try, first only) | proxy cuts the upload request | exit 1 and the previous plan / exit 0 and the new plan |
| plan-after-upload | Ctrl-C while the summary prints | exit 130, `interrupted: the interrupt came after <url> was written whole` |
| **mds index -o s3://... over an index** (2 of 4 sources changed) | | |
| index-table-upload | parked in the upload of the second changed table | exit 130, `the previous index at <url> is intact; 1 new table object it does not name was left under <url>/sources/` |
| index-between | parked after the tables, before the manifest | the same with 2 new table objects |
| index-manifest-upload | parked in the manifest's upload | the same with 2 new table objects |
| index-manifest-copy | signal while the manifest is copied over | exit 130, `the new index was written whole at <url>; 2 table objects it no longer names were left under <url>/sources/`; a plan from it works |
| index-hung-manifest | proxy holds the manifest's upload; SIGINT; released | the same as index-manifest-upload |
| index-500-table | proxy answers 500 to a table's upload | exit 1 naming the table's URL; previous manifest byte-identical |
| index-temporaries | another writer's hidden temporary under the tables during a re-index | left in place; unnamed tables removed |
| **mds plan -o gs://... (emulator)** | | |
| gcs-plan-upload, gcs-plan-copy | as plan-upload and plan-copy | the same |
"""

from __future__ import annotations

import fnmatch
import json
import signal
from pathlib import Path

import pytest
from builders import write_parquet
from cli_helpers import mds, one_error_line
from fault_builders import interrupt_mds, signal_mds, web_columns, write_world
from fault_proxy import fault_proxy
from gcs_store import gcs_server
from s3_store import BUCKET, s3_server

from mds.core.planfile_reader import PlanReader
from mds.core.storage import DATA_ROOT_ENV

NOTHING = "interrupted: nothing was written"
TABLES = "sources"


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """The fault world's data root with its local index, and old.toml: the same sources
    planned with another seed (so an old plan's bytes differ from a new one's)."""
    root = tmp_path / "data"
    config = write_world(root)
    assert mds("index", config).exit_code == 0
    text = config.read_text(encoding="utf-8")
    assert "seed = 11" in text
    (root / "old.toml").write_text(text.replace("seed = 11", "seed = 12"), encoding="utf-8")
    return root


@pytest.fixture
def s3(monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    with s3_server(monkeypatch) as store:
        yield store


def keys(store, prefix: str) -> list[str]:
    """Every object key under `prefix` (hidden ones too; not pyarrow's directory markers)."""
    listed = store.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"] for o in listed if not o["Key"].endswith("/"))


def temporaries(names: list[str]) -> list[str]:
    return [k for k in names if fnmatch.fnmatch(k.rsplit("/", 1)[-1], ".*.tmp-*")]


def stderr_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def assert_valid_plan(url: str) -> None:
    with PlanReader(url) as plan:
        for chunk in range(len(plan.chunks)):
            for rank in range(plan.dp):
                plan.rank_chunk(chunk, rank)
        plan.verify_sections()


# --- plans -------------------------------------------------------------------------------------

PLAN_KEY = "plans/plan.mds"


def old_plan(root: Path, store) -> bytes:
    """Plan old.toml to the output; the plan object's bytes."""
    out = mds("plan", root / "old.toml", "-o", store.url(PLAN_KEY))
    assert out.exit_code == 0, out.output
    return store.get(PLAN_KEY)


def plan_args(root: Path, url: str) -> tuple:
    return ("plan", root / "mds.toml", "-o", url)


def assert_plan_outcome(proc, store, url: str, old: bytes, *, committed: bool) -> None:
    """Exit 130; the previous plan byte-identical and `nothing was written`, or the new
    plan whole and the message saying so; no temporary left."""
    assert proc.returncode == 130, proc.stderr
    line = stderr_line(proc)
    now = store.get(PLAN_KEY)
    if committed:
        assert now != old
        assert_valid_plan(url)
        assert (
            line
            == f"interrupted: the new plan was written whole to {url} just before the interrupt"
        )
    else:
        assert now == old, "the previous plan was changed"
        assert line == NOTHING
    assert temporaries(store_keys(store, "plans/")) == []


def store_keys(store, prefix: str) -> list[str]:
    return store.keys(prefix) if hasattr(store, "keys") else keys(store, prefix)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_plan_interrupted_during_its_upload_keeps_the_previous_plan(world, s3, tmp_path, sig):
    old = old_plan(world, s3)
    url = s3.url(PLAN_KEY)
    proc, _ = interrupt_mds(tmp_path, "put-stream", sig, *plan_args(world, url), key="*plan.mds*")
    assert_plan_outcome(proc, s3, url, old, committed=False)


def test_plan_interrupted_during_the_copy_is_the_new_plan_and_says_so(world, s3, tmp_path):
    old = old_plan(world, s3)
    url = s3.url(PLAN_KEY)
    proc, _ = interrupt_mds(
        tmp_path, "put-copy", signal.SIGINT, *plan_args(world, url), key=f"{BUCKET}/{PLAN_KEY}"
    )
    assert_plan_outcome(proc, s3, url, old, committed=True)


def test_plan_interrupted_while_its_upload_request_hangs(world, s3, monkeypatch):
    old = old_plan(world, s3)
    url = s3.url(PLAN_KEY)
    with fault_proxy(s3, monkeypatch) as proxy:
        held = proxy.add("PUT", "plans/*plan.mds*", "hang", nth=1, seconds=20)
        proc, _ = signal_mds(
            signal.SIGINT,
            *plan_args(world, url),
            ready=held.hit.is_set,
            what="the held upload",
            signalled=held.release,
        )
    # the released request completed an object; the interrupt still wrote nothing
    assert_plan_outcome(proc, s3, url, old, committed=False)


@pytest.mark.parametrize("request_key", ["plans/.plan.mds.tmp-*", PLAN_KEY], ids=["upload", "copy"])
def test_plan_upload_answered_500_keeps_the_previous_plan(world, s3, monkeypatch, request_key):
    old = old_plan(world, s3)
    url = s3.url(PLAN_KEY)
    with fault_proxy(s3, monkeypatch) as proxy:
        failing = proxy.add("PUT", request_key, "fail")
        one_error_line(mds(*plan_args(world, url)), f"{url}: cannot write after 2 attempts")
        assert failing.applied >= 2
    assert s3.get(PLAN_KEY) == old
    assert temporaries(keys(s3, "plans/")) == []


@pytest.mark.parametrize("times", [None, 1], ids=["every-try", "first-try"])
def test_plan_upload_cut_short(world, s3, monkeypatch, times):
    old = old_plan(world, s3)
    url = s3.url(PLAN_KEY)
    with fault_proxy(s3, monkeypatch) as proxy:
        cut = proxy.add("PUT", "plans/.plan.mds.tmp-*", "truncate", keep=10, times=times)
        result = mds(*plan_args(world, url))
        assert cut.applied >= 1
    if times is None:
        one_error_line(result, f"{url}: cannot write after 2 attempts")
        assert s3.get(PLAN_KEY) == old
    else:  # retried whole
        assert result.exit_code == 0, result.output
        assert s3.get(PLAN_KEY) != old
        assert_valid_plan(url)
    assert temporaries(keys(s3, "plans/")) == []


def test_an_interrupt_after_the_plan_was_uploaded_says_it_was_written(world, s3, monkeypatch):
    """Ctrl-C while the summary prints: the plan object is already the new one."""
    import mds.cli.plan as plan_cli

    old = old_plan(world, s3)
    url = s3.url(PLAN_KEY)

    def interrupted(summary):
        raise KeyboardInterrupt

    monkeypatch.setattr(plan_cli, "_print_summary", interrupted)
    result = mds(*plan_args(world, url))
    assert result.exit_code == 130
    assert s3.get(PLAN_KEY) != old
    assert result.stderr.strip() == f"interrupted: the interrupt came after {url} was written whole"


# --- indexes -----------------------------------------------------------------------------------

INDEX = "idx"


def named_tables(manifest: bytes) -> set[str]:
    """The tables and file lists a manifest names."""
    return {s[k] for s in json.loads(manifest)["sources"] for k in ("table", "files_table")}


def old_index(root: Path, store) -> tuple[str, bytes, set[str]]:
    """Index the world to the output, then change two sources (forum, web) so that a new
    index has two new tables and two new file lists; (url, manifest bytes, tables and file
    lists it names)."""
    url = store.url(INDEX)
    out = mds("index", root / "mds.toml", "-o", url)
    assert out.exit_code == 0, out.output
    manifest = store.get(f"{INDEX}/manifest.json")
    named = named_tables(manifest)
    with open(root / "forum" / "forum.jsonl", "a", encoding="utf-8") as f:
        f.write('{"ids": [1, 2, 3]}\n')
    write_parquet(root / "web" / "part-2.parquet", web_columns(2))
    return url, manifest, named


def left_tables(store, named: set[str]) -> list[str]:
    """Table objects under the index that `named` (a manifest's tables) does not name."""
    return [
        k
        for k in keys(store, f"{INDEX}/{TABLES}/")
        if k.removeprefix(f"{INDEX}/") not in named and not temporaries([k])
    ]


def index_args(root: Path, url: str) -> tuple:
    return ("index", root / "mds.toml", "-o", url)


def assert_previous_index(proc, store, url: str, manifest: bytes, named: set[str], new: int):
    """Exit 130, the previous manifest byte-identical, `new` tables it does not name left
    (what the message says), no temporary."""
    assert proc.returncode == 130, proc.stderr
    assert store.get(f"{INDEX}/manifest.json") == manifest
    left = left_tables(store, named)
    assert len(left) == new, left
    line = f"interrupted: the previous index at {url} is intact"
    if new:
        what = (
            "1 new table object it does not name was"
            if new == 1
            else (f"{new} new table objects it does not name were")
        )
        line += f"; {what} left under {url}/{TABLES}/"
    assert stderr_line(proc) == line
    assert temporaries(keys(store, f"{INDEX}/")) == []


@pytest.mark.parametrize(
    ("at", "key", "new"),
    [
        # forum's table and file list are up
        ("put-stream", f"{BUCKET}/{INDEX}/{TABLES}/*web-*", 2),
        ("put-before", f"{BUCKET}/{INDEX}/manifest.json", 4),
        ("put-stream", f"{BUCKET}/{INDEX}/*manifest.json*", 4),
    ],
    ids=["table-upload", "between", "manifest-upload"],
)
def test_index_interrupted_before_its_manifest_keeps_the_previous_index(
    world, s3, tmp_path, at, key, new
):
    url, manifest, named = old_index(world, s3)
    proc, _ = interrupt_mds(tmp_path, at, signal.SIGINT, *index_args(world, url), key=key)
    assert_previous_index(proc, s3, url, manifest, named, new)


def test_index_interrupted_during_the_manifest_copy_is_the_new_index(world, s3, tmp_path):
    url, manifest, named = old_index(world, s3)
    proc, _ = interrupt_mds(
        tmp_path,
        "put-copy",
        signal.SIGINT,
        *index_args(world, url),
        key=f"{BUCKET}/{INDEX}/manifest.json",
    )
    assert proc.returncode == 130, proc.stderr
    now = s3.get(f"{INDEX}/manifest.json")
    assert now != manifest
    new_named = named_tables(now)
    # the old tables and file lists stay beside the replaced manifest, kept under history/
    kept = left_tables(s3, new_named)
    assert len(kept) == 4 and all(k.removeprefix(f"{INDEX}/") in named for k in kept)
    assert [k for k in keys(s3, f"{INDEX}/history/")] != []
    assert stderr_line(proc) == f"interrupted: the new index was written whole at {url}"
    assert temporaries(keys(s3, f"{INDEX}/")) == []
    out = mds("plan", world / "mds.toml", "--index", url, "-o", tmp_path / "p.mds")
    assert out.exit_code == 0, out.output  # the new index is whole


def test_index_interrupted_while_its_manifest_upload_hangs(world, s3, monkeypatch):
    url, manifest, named = old_index(world, s3)
    with fault_proxy(s3, monkeypatch) as proxy:
        held = proxy.add("PUT", f"{INDEX}/*manifest.json*", "hang", nth=1, seconds=20)
        proc, _ = signal_mds(
            signal.SIGINT,
            *index_args(world, url),
            ready=held.hit.is_set,
            what="the held manifest upload",
            signalled=held.release,
        )
    assert_previous_index(proc, s3, url, manifest, named, 4)


def test_index_table_upload_answered_500_keeps_the_previous_index(world, s3, monkeypatch):
    url, manifest, _named = old_index(world, s3)
    with fault_proxy(s3, monkeypatch) as proxy:
        proxy.add("PUT", f"{INDEX}/{TABLES}/.web-*", "fail")
        one_error_line(mds(*index_args(world, url)), f"{url}/{TABLES}/web-", "cannot write")
    assert s3.get(f"{INDEX}/manifest.json") == manifest
    assert temporaries(keys(s3, f"{INDEX}/")) == []


def test_a_re_index_leaves_the_temporaries_of_uploads_in_flight(world, s3):
    """Another writer's upload in progress is a hidden temporary under the tables: not a
    table the new manifest does not name, so not removed."""
    url, _manifest, _named = old_index(world, s3)
    other = f"{INDEX}/{TABLES}/.web-0123456789abcdef.parquet.tmp-1-abcdef-01234567"
    s3.put(other, b"in flight")
    out = mds(*index_args(world, url))
    assert out.exit_code == 0, out.output
    assert s3.get(other) == b"in flight"
    named = named_tables(s3.get(f"{INDEX}/manifest.json"))
    for key in keys(s3, f"{INDEX}/history/"):  # the replaced manifest, kept with its tables
        named |= named_tables(s3.get(key))
    assert left_tables(s3, named) == []


# --- GCS ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("at", ["put-stream", "put-copy"], ids=["upload", "copy"])
def test_gcs_plan_interrupted_keeps_the_previous_plan_or_is_the_new_one(
    world, monkeypatch, tmp_path, at
):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    with gcs_server(monkeypatch) as store:
        old = old_plan(world, store)
        url = store.url(PLAN_KEY)
        key = "*plan.mds*" if at == "put-stream" else f"{BUCKET}/{PLAN_KEY}"
        proc, _ = interrupt_mds(tmp_path, at, signal.SIGINT, *plan_args(world, url), key=key)
        assert_plan_outcome(proc, store, url, old, committed=at == "put-copy")
