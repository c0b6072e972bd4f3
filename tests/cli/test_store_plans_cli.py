"""Plans in object storage are first-class: `mds plan -o s3://...` records what a plan
written beside its index records (the same plan id, the same bytes), the executor replays it
from the store's copy of the data, and inspect, export, diff and plan --from read it by range
requests with the output a local plan gives; a missing, unreachable or truncated plan object
is one line naming its URL."""

from __future__ import annotations

import json
import shutil
from itertools import islice
from pathlib import Path

import polars as pl
import pytest
from cli_helpers import mds, one_error_line
from executor_builders import batch_digest, open_executor, text_tokenizers, tokenize_fn
from plan_builders import REPO

from mds.core.planfile_reader import PlanReader

BATCHES = 12  # micro-batches of rank 1 compared between a local and a store plan


def ok(*args):
    result = mds(*args)
    assert result.exit_code == 0, result.output
    return result


def as_json(*args):
    return json.loads(ok(*args, "--json").stdout)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """The sample data indexed and planned under one directory: data/, index/, and plan.mds
    beside the index."""
    from mds.planner.index.build import build_index
    from mds.planner.index.config import load_config

    top = tmp_path_factory.mktemp("store-plans")
    shutil.copytree(REPO / "sample_data", top / "data")
    build_index(load_config(top / "data" / "mds.toml"), top / "index", workers=1)
    ok("plan", top / "data" / "mds.toml", "--index", top / "index", "-o", top / "plan.mds")
    return top


def _batches(plan) -> list[str]:
    """Rank 1's first micro-batches, from the root the plan records (no data_root); the
    forum source's tokenizer.json is local only, so every text source takes one function."""
    tokenize = {**text_tokenizers(), "forum": tokenize_fn()}
    with open_executor(plan, 1, tokenize=tokenize) as ex:
        return [batch_digest(b) for b in islice(ex, BATCHES)]


@pytest.fixture(scope="module")
def local_batches(tree) -> list[str]:
    return _batches(tree / "plan.mds")


def _plan_id(place) -> str:
    with PlanReader(place) as reader:
        return reader.plan_id


def test_a_plan_written_to_s3_is_the_plan_written_beside_its_local_index(
    tree, local_batches, monkeypatch
):
    """Index local, plan to the store: the same bytes as the local plan beside the index;
    the tree copied to the bucket (aws s3 sync) is replayed from the store by the plan's
    relative root, batch for batch as the local plan from the local data."""
    from s3_store import s3_server

    with s3_server(monkeypatch) as store:
        store.upload(tree / "data", "tree/data")
        url = store.url("tree/plan.mds")
        ok("plan", tree / "data" / "mds.toml", "--index", tree / "index", "-o", url)
        assert store.get("tree/plan.mds") == (tree / "plan.mds").read_bytes()
        assert _plan_id(url) == _plan_id(tree / "plan.mds")
        assert _batches(url) == local_batches


def _store_config(directory: Path, root: str) -> Path:
    """sample_data/mds.toml with its data root in the store (the tokenizer stays a local
    file beside the config)."""
    directory.mkdir()
    shutil.copy(REPO / "sample_data" / "tokenizer.json", directory)
    text = (REPO / "sample_data" / "mds.toml").read_text()
    config = directory / "store.toml"
    config.write_text(text.replace('output = "../build/index"', f'root = "{root}"', 1))
    return config


def test_a_plan_made_from_an_index_in_s3_is_the_same_plan_locally_and_in_s3(
    tree, local_batches, monkeypatch, tmp_path
):
    """Index and data in the store: a plan written locally and one written to the store
    record the same URLs (the same plan id, the same bytes), and the store plan replays
    from the store the batches of the plan made from the local copy."""
    from s3_store import s3_server

    with s3_server(monkeypatch) as store:
        data = store.upload(tree / "data", "corpus")
        config = _store_config(tmp_path / "cfg", data)
        index = store.url("indexes/corpus")
        ok("index", config, "-o", index)
        url = store.url("plans/plan.mds")
        ok("plan", config, "--index", index, "-o", url)
        ok("plan", config, "--index", index, "-o", tmp_path / "plan.mds")
        assert store.get("plans/plan.mds") == (tmp_path / "plan.mds").read_bytes()
        assert _plan_id(url) == _plan_id(tmp_path / "plan.mds")
        footer = PlanReader(url).footer
        assert footer["index"]["path"] == index and footer["fetch"]["root"] == data
        assert _batches(url) == local_batches
        again = ("--index", index, "--from", url, "--at-step", "30")  # all in the store
        ok("plan", config, *again, "-o", store.url("plans/again.mds"))
        ok("plan", config, *again, "-o", tmp_path / "again.mds")
        assert store.get("plans/again.mds") == (tmp_path / "again.mds").read_bytes()


def _without_paths(report):
    """A report with the plan's and the index's places left out (they name where each is)."""
    if isinstance(report, dict):
        places = ("path", "plan", "index")
        return {k: _without_paths(v) for k, v in report.items() if k not in places}
    if isinstance(report, list):
        return [_without_paths(v) for v in report]
    return report


def _text(out: str, place) -> list[str]:
    """Printed lines with the plan's place named PLAN (the padding after it follows its length)."""
    return [line.rstrip() for line in out.replace(str(place), "PLAN").splitlines()]


def test_reports_of_a_plan_in_s3_are_those_of_the_local_plan(tree, monkeypatch, tmp_path):
    """inspect (text, --json, --step with its index in the store, --html), export (and
    --hash from the store's data), diff and plan --from take the store plan, read by range
    requests, and say what they say of the same plan on disk."""
    from s3_store import s3_server

    local = tree / "plan.mds"
    config = tree / "data" / "mds.toml"
    with s3_server(monkeypatch) as store:
        store.upload(tree / "data", "tree/data")
        store.upload(tree / "index", "tree/index")
        url = store.url("tree/plan.mds")
        store.put("tree/plan.mds", local.read_bytes())

        assert _without_paths(as_json("inspect", url)) == _without_paths(as_json("inspect", local))
        assert _text(ok("inspect", url).stdout, url) == _text(ok("inspect", local).stdout, local)
        step = ("--step", "5", "--rank", "1")
        remote = as_json("inspect", url, *step)  # its index read from beside it in the store
        assert _without_paths(remote) == _without_paths(as_json("inspect", local, *step))
        assert remote["index"] == store.url("tree/index")
        ok("inspect", url, *step, "--html", tmp_path / "remote.html")
        ok("inspect", local, *step, "--html", tmp_path / "local.html")
        html = (tmp_path / "remote.html").read_text()
        html = html.replace(url, "PLAN").replace(store.url("tree/index"), "INDEX")
        same = (tmp_path / "local.html").read_text()
        assert html == same.replace(str(local), "PLAN").replace(str(tree / "index"), "INDEX")

        for args in ((), ("--steps", "3:9", "--rank", "0", "--hash")):
            ok("export", url, *args, "-o", tmp_path / "remote.parquet")
            ok("export", local, *args, "-o", tmp_path / "local.parquet")
            remote = pl.read_parquet(tmp_path / "remote.parquet")
            assert remote.equals(pl.read_parquet(tmp_path / "local.parquet")), args

        assert "identical" in ok("diff", url, local).stdout
        assert as_json("diff", url, local)["identical"]

        new = store.url("tree/replanned.mds")
        again = ("--index", tree / "index", "--at-step", "20", "--dp-size", "2")
        ok("plan", config, *again, "--from", url, "-o", new)
        ok("plan", config, *again, "--from", url, "-o", tree / "replanned.mds")  # beside the index
        assert store.get("tree/replanned.mds") == (tree / "replanned.mds").read_bytes()
        assert PlanReader(new).footer["lineage"]["parent_path"] == url
        ok("plan", config, *again, "--from", local, "-o", tmp_path / "from-local.mds")
        diff = as_json("diff", new, tmp_path / "from-local.mds")  # where each lies, not what
        assert {h["key"] for h in diff["header"]} <= {"lineage.parent_path", "index.path", "fetch.root"}
        assert diff["first_difference"] is None and diff["first_sample_difference"] is None


def test_a_plan_in_s3_is_read_by_ranges_not_whole(tree, monkeypatch):
    """inspect, inspect --step, trace and plan --from read the footer and the sections or
    blocks they use: less than the object (export reads every block, as it must)."""
    from collections import Counter

    from s3_store import s3_server

    from mds.core import object_ranges

    read: Counter = Counter()
    whole = object_ranges.read_exact

    def counted(f, url, size, start, n):
        read[url] += n
        return whole(f, url, size, start, n)

    monkeypatch.setattr(object_ranges, "read_exact", counted)
    size = (tree / "plan.mds").stat().st_size
    with s3_server(monkeypatch) as store:
        store.upload(tree / "index", "tree/index")
        store.put("tree/plan.mds", (tree / "plan.mds").read_bytes())
        url = store.url("tree/plan.mds")
        again = ("--index", tree / "index", "--at-step", "20", "-o", tree / "again.mds")
        for args in (("inspect", url), ("inspect", url, "--step", "5", "--rank", "1"),
                     ("trace", url, "--step", "5", "--data-root", tree / "data"),
                     ("plan", tree / "data" / "mds.toml", "--from", url, *again)):  # fmt: skip
            read.clear()
            ok(*args)
            assert 0 < read[url] < size, (args, read[url], size)


def test_a_plan_and_its_index_in_gcs(tree, monkeypatch, tmp_path):
    """The same on GCS: a plan written to gs:// beside the tree's copy is the local plan's
    bytes; inspect --step reads the index beside it; export (with --hash from a --data-root
    in the store) equals the local plan's."""
    from gcs_store import gcs_server

    local = tree / "plan.mds"
    with gcs_server(monkeypatch) as store:
        store.upload(tree / "index", "tree/index")
        data = store.upload(tree / "data", "copy/data")
        url = store.url("tree/plan.mds")
        ok("plan", tree / "data" / "mds.toml", "--index", tree / "index", "-o", url)
        assert store.get("tree/plan.mds") == local.read_bytes()
        step = ("--step", "2")
        assert _without_paths(as_json("inspect", url, *step)) == _without_paths(
            as_json("inspect", local, *step)
        )
        hashed = ("--steps", "0:4", "--hash")
        ok("export", url, *hashed, "--data-root", data, "-o", tmp_path / "remote.parquet")
        ok("export", local, *hashed, "-o", tmp_path / "local.parquet")
        assert pl.read_parquet(tmp_path / "remote.parquet").equals(
            pl.read_parquet(tmp_path / "local.parquet")
        )


def test_a_missing_truncated_or_unreachable_plan_object_is_one_line(tree, monkeypatch, tmp_path):
    """Each names the URL and what to do."""
    out = tmp_path / "out.parquet"
    from s3_store import s3_server

    with s3_server(monkeypatch) as store:
        missing = store.url("plans/missing.mds")
        for command in ("inspect", "export", "diff", "trace"):
            args = {"export": ("-o", out), "diff": (missing,), "trace": ("--step", "0")}
            one_error_line(mds(command, missing, *args.get(command, ())), missing, "aws s3 ls")

        data = (tree / "plan.mds").read_bytes()
        store.put("plans/cut.mds", data[: len(data) // 2])
        cut = store.url("plans/cut.mds")
        for args in (("inspect", cut), ("export", cut, "-o", out),
                     ("diff", cut, tree / "plan.mds")):  # fmt: skip
            one_error_line(mds(*args), cut, "truncat", "copy the plan there again whole")

        store.put("plans/plan.mds", data)
        url = store.url("plans/plan.mds")
        index = store.url("plans/index")  # recorded as "index": beside the plan, not there
        for args in (("inspect", url, "--step", "1"), ("export", url, "-o", out), ("verify", url)):
            one_error_line(mds(*args), f"its index was expected at {index}", "pass --index")
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(name)
        for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
            monkeypatch.setenv(name, str(tree / "no-such-file"))
        monkeypatch.setenv("MDS_S3_ATTEMPTS", "1")
        for args in (("inspect", url), ("export", url, "-o", out), ("trace", url, "--step", "0")):
            one_error_line(mds(*args), url, "check the AWS credentials")
