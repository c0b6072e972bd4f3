"""src/mds/planner/report/verify_index.py: `mds verify` on a missing, damaged or edited
index, paths that leave the root, and source files changed since they were indexed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from plan_builders import sample_workdir
from verify_builders import (
    check,
    copy_index,
    edit_manifest,
    failure,
    flip,
    same_size_edit,
)

import mds.core.datacheck as datacheck
from mds.planner.index.build import build_index
from mds.planner.index.config import load_config
from mds.planner.report.verify import verify_plan


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """Shared and never modified: copy its plan or index before corrupting it."""
    return sample_workdir(tmp_path_factory.mktemp("verify"))


@pytest.fixture
def work(tmp_path) -> Path:
    """A private copy whose source files a test may change."""
    return sample_workdir(tmp_path)


def test_missing_index(pristine, tmp_path):
    result = verify_plan(pristine / "plan.mds", index=tmp_path / "nowhere")
    name, detail = failure(result)
    assert name == "index manifest" and "not an mds index" in detail


def test_corrupt_index_table(pristine, tmp_path):
    index = copy_index(pristine, tmp_path)
    table = index / json.loads((index / "manifest.json").read_text())["sources"][2]["table"]
    flip(table, 100)
    name, detail = failure(verify_plan(pristine / "plan.mds", index=index))
    assert name == "source forum: table"
    assert str(table) in detail and "differs from the manifest's" in detail


def test_deleted_index_table(pristine, tmp_path):
    index = copy_index(pristine, tmp_path)
    table = index / json.loads((index / "manifest.json").read_text())["sources"][0]["table"]
    table.unlink()
    name, detail = failure(verify_plan(pristine / "plan.mds", index=index))
    assert name == "source web: table" and "cannot read index table" in detail


def test_edited_manifest_does_not_match_its_fingerprint(pristine, tmp_path):
    index = copy_index(pristine, tmp_path)
    edit_manifest(index, lambda m: m["sources"][0]["files"][0].update(fingerprint="sampled:00"))
    name, detail = failure(verify_plan(pristine / "plan.mds", index=index))
    assert name == "index fingerprint" and "does not match its own entries" in detail


def escape_paths(pristine: Path, tmp_path: Path) -> dict[str, str]:
    """An absolute path and a `..` path, both to a real file outside the data root."""
    secret = tmp_path / "secret.parquet"
    shutil.copyfile(pristine / "data" / "web" / "part-00000.parquet", secret)
    return {
        "absolute": str(secret),
        "dotdot": os.path.relpath(secret, pristine / "data"),
        "inner dotdot": "web/../../" + os.path.relpath(secret, pristine),
    }


def spy_on_file_access(monkeypatch) -> list:
    """Record every path verify stats or fingerprints (and still do it)."""
    touched: list = []
    stat, fp = datacheck.stat_signature, datacheck.fingerprint
    monkeypatch.setattr(datacheck, "stat_signature", lambda p: touched.append(p) or stat(p))
    monkeypatch.setattr(datacheck, "fingerprint", lambda p, m: touched.append(p) or fp(p, m))
    return touched


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "inner dotdot"])
@pytest.mark.parametrize("full", [False, True])
def test_a_path_escaping_the_root_is_refused_and_never_read(
    pristine, tmp_path, monkeypatch, kind, full
):
    rel = escape_paths(pristine, tmp_path)[kind]
    assert kind == "absolute" or ".." in Path(rel).parts
    index = copy_index(pristine, tmp_path)
    edit_manifest(index, lambda m: m["sources"][0]["files"][1].update(path=rel))
    touched = spy_on_file_access(monkeypatch)
    result = verify_plan(pristine / "plan.mds", index=index, full=full)
    name, detail = failure(result)
    assert name == "index manifest"
    assert f"web files[1]: path {rel!r} escapes the index root" in detail
    assert "refused, not read" in detail
    # The manifest itself is refused, as by every other command: no source file is read.
    assert not any("secret" in str(p) for p in touched)
    assert not [c for c in result.checks if c.name.startswith("source ")]


def test_escaping_megatron_index_path_is_refused(pristine, tmp_path):
    index = copy_index(pristine, tmp_path)
    edit_manifest(index, lambda m: m["sources"][5]["files"][0].update(index_path="/etc/passwd"))
    name, detail = failure(verify_plan(pristine / "plan.mds", index=index, full=True))
    assert name == "index manifest" and "'/etc/passwd' escapes the index root" in detail


def test_index_rebuilt_from_changed_data(work):
    forum = work / "data" / "forum" / "forum.jsonl"
    with open(forum, "a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "one more post", "lang": "en", "score": 3}) + "\n")
    build_index(load_config(work / "data" / "mds.toml"), work / "index", workers=1)
    # the plan is checked against the index it was made from (kept under history/), whose
    # file the new line changed
    name, detail = failure(verify_plan(work / "plan.mds"))
    assert name == "source forum: files" and "forum.jsonl" in detail
    shutil.rmtree(work / "index" / "history")  # without it, the index in place is compared
    result = verify_plan(work / "plan.mds")
    name, detail = failure(result)
    assert name == "index fingerprint"
    assert "differs from the plan's" in detail and "(changed: forum)" in detail
    # the index itself is consistent with the data now
    assert all(c.ok for c in result.checks if c.name.startswith("source "))


@pytest.mark.parametrize("full", [False, True])
def test_a_changed_tokenizer_fails_verify_as_it_fails_the_executor(work, full):
    from executor_builders import open_executor

    from mds.errors import DataChangedError

    tokenizer = work / "data" / "tokenizer.json"
    spec = json.loads(tokenizer.read_text())
    spec["model"]["vocab"]["zzz-new-word"] = len(spec["model"]["vocab"])  # a new word
    tokenizer.write_text(json.dumps(spec))
    with pytest.raises(DataChangedError) as refused:
        open_executor(work / "plan.mds", 0)
    name, detail = failure(verify_plan(work / "plan.mds", full=full))
    assert name == "source forum: replay"
    assert detail == str(refused.value)
    assert detail == (
        f"{tokenizer}: tokenizer of source 'forum' changed since indexing; re-index, or "
        "pass tokenize= explicitly"
    )


def test_a_missing_tokenizer_fails_verify_as_it_fails_the_executor(work):
    from executor_builders import open_executor

    from mds.errors import ConfigError

    (work / "data" / "tokenizer.json").unlink()
    with pytest.raises(ConfigError) as refused:
        open_executor(work / "plan.mds", 0)
    name, detail = failure(verify_plan(work / "plan.mds"))
    assert (name, detail) == ("source forum: replay", str(refused.value))


def test_a_source_indexed_for_lengths_only_fails_verify_as_it_fails_the_executor(tmp_path):
    from plan_builders import plan_config, synthetic

    from mds.errors import ConfigError
    from mds.executor import PlanExecutor
    from mds.planner.plan.build import build_plan

    train = {"steps": 4, "dp_size": 2, "micro_batches": 1, "samples_per_step": 4}
    train["max_tokens_per_micro_batch"] = 64
    data = synthetic(tmp_path, {"a": {"lengths": [5, 6, 7, 8], "weight": 1.0}}, train)
    build_plan(plan_config(tmp_path, data), tmp_path / "plan.mds")
    with pytest.raises(ConfigError) as refused:
        PlanExecutor(tmp_path / "plan.mds", 0)
    result = verify_plan(tmp_path / "plan.mds")
    assert failure(result) == ("source a: replay", str(refused.value))
    assert "indexed for lengths only" in str(refused.value)


def test_same_size_same_mtime_edit_passes_stat_but_fails_full(work):
    forum = work / "data" / "forum" / "forum.jsonl"
    same_size_edit(forum, forum.stat().st_size // 2)
    assert verify_plan(work / "plan.mds").ok
    name, detail = failure(verify_plan(work / "plan.mds", full=True))
    assert name == "source forum: files"
    assert detail.startswith("forum/forum.jsonl: content changed (sampled fingerprint")


def test_megatron_idx_edit_fails_full(work):
    idx = work / "data" / "math" / "math_text_document.idx"
    same_size_edit(idx, idx.stat().st_size - 3)
    assert verify_plan(work / "plan.mds").ok
    name, detail = failure(verify_plan(work / "plan.mds", full=True))
    assert name == "source math: files"
    assert detail.startswith("math/math_text_document.bin: content changed")


def test_touched_file_passes_the_stat_check_by_its_content(work):
    path = work / "data" / "web" / "part-00001.parquet"
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert verify_plan(work / "plan.mds").ok  # only the mtime differs: the content matches
    assert verify_plan(work / "plan.mds", full=True).ok


def test_changed_file_with_a_new_mtime_fails_the_stat_check(work):
    path = work / "data" / "web" / "part-00001.parquet"
    flip(path, path.stat().st_size // 2)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    name, detail = failure(verify_plan(work / "plan.mds"))
    assert name == "source web: files"
    assert detail.startswith("web/part-00001.parquet: content changed (sampled fingerprint")
    assert "modified (mtime_ns" in detail


def test_grown_file_fails_the_stat_check(work):
    path = work / "data" / "code" / "code-00001.jsonl.zst"
    with open(path, "ab") as f:
        f.write(b"\0")
    name, detail = failure(verify_plan(work / "plan.mds"))
    assert name == "source code: files"
    assert (
        detail
        == f"code/code-00001.jsonl.zst: size changed ({path.stat().st_size - 1} -> {path.stat().st_size} bytes)"
    )


@pytest.mark.parametrize("full", [False, True])
def test_deleted_source_file(work, full):
    (work / "data" / "web" / "part-00002.parquet").unlink()
    (work / "data" / "wiki" / "data-00000-of-00001.arrow").unlink()
    result = verify_plan(work / "plan.mds", full=full)
    assert failure(result) == ("source web: files", "web/part-00002.parquet: missing")
    assert check(result, "source wiki: files").detail == "wiki/data-00000-of-00001.arrow: missing"


def test_deleted_megatron_idx(work):
    (work / "data" / "math" / "math_text_document.idx").unlink()
    assert failure(verify_plan(work / "plan.mds")) == (
        "source math: files",
        "math/math_text_document.idx: missing",
    )


def test_several_changed_files_are_counted(work):
    for name in ("part-00000.parquet", "part-00002.parquet"):
        (work / "data" / "web" / name).unlink()
    detail = failure(verify_plan(work / "plan.mds"))[1]
    assert detail == "web/part-00000.parquet: missing (2 of 3 files differ)"


def test_symlink_out_of_the_root_is_refused(tmp_path):
    from mds.core.datacheck import safe_path

    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "secret.txt"
    outside.write_text("x")
    (root / "link.txt").symlink_to(outside)
    with pytest.raises(ValueError, match="leads outside the index root"):
        safe_path(root, "link.txt", "web files[0]")
    (root / "ok.txt").write_text("y")
    assert safe_path(root, "ok.txt", "web files[0]") == root / "ok.txt"
