"""`mds plan --skip-steps` and `--exclude` from the command line: the summary and --json
report, the one-line errors, and inspect, diff, export and verify on the result."""

from __future__ import annotations

import json

import polars as pl
import pytest
from cli_helpers import mds, one_error_line
from plan_builders import sample_index, sample_plan_config

from mds.planner.plan.build import build_plan, with_overrides

STEPS = 30


@pytest.fixture(scope="module")
def old(tmp_path_factory):
    index = sample_index(tmp_path_factory)
    out = tmp_path_factory.mktemp("replan") / "old.mds"
    build_plan(with_overrides(sample_plan_config(index), steps=STEPS), out)
    return index, out


def base(index, out, old):
    return ["plan", "sample_data/mds.toml", "--index", index, "--steps", STEPS, "-o", out, "--from", old]


def test_exclude_reports_per_source_and_the_result_works_everywhere(old, tmp_path):
    index, plan = old
    bad = tmp_path / "bad.parquet"
    assert mds("export", plan, "-o", bad, "--steps", "12:14", "--index", index).exit_code == 0
    new = tmp_path / "new.mds"
    shown = mds(*base(index, new, plan), "--at-step", "10", "--exclude", bad, "--json")
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.output)["exclude"]
    given = pl.read_parquet(bad)
    assert (report["entries"], report["list"]) == (given.height, "bad.parquet")
    assert report["matched"] == given.select("source", "row").unique().height
    assert sum(s["given"] for s in report["sources"].values()) == given.height
    text = mds(*base(index, tmp_path / "again.mds", plan), "--at-step", "10", "--exclude", bad)
    assert "excluded per source" in text.output and "trained before K" in text.output
    header = json.loads(mds("inspect", new, "--json").output)["header"]
    assert header["lineage"]["exclude"]["digest"] == report["digest"]
    assert "excluded documents" in mds("inspect", new).output
    assert mds("diff", plan, new).exit_code == 0
    assert mds("verify", new, "--index", index).exit_code == 0
    exported = tmp_path / "new.parquet"
    assert mds("export", new, "-o", exported, "--index", index).exit_code == 0
    after = pl.read_parquet(exported)
    assert after.join(given, on=["source", "row"], how="semi").height == 0


def test_skip_steps_is_repeatable_and_recorded(old, tmp_path):
    index, plan = old
    new = tmp_path / "skip.mds"
    shown = mds(*base(index, new, plan), "--at-step", "10", "--skip-steps", "20:22", "--skip-steps", "12:15", "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["skipped"] == [[12, 15], [20, 22]]
    header = json.loads(mds("inspect", new, "--json").output)["header"]
    assert header["lineage"]["skipped"] == [[12, 15], [20, 22]]
    assert "12-14, 20-21" in mds("inspect", new).output
    assert "skipped the old plan's steps 12:15" in mds(*base(index, new, plan), "--at-step", "10", "--skip-steps", "12:15", "--skip-steps", "20:22").output
    assert mds("export", new, "-o", tmp_path / "skip.parquet", "--index", index).exit_code == 0
    assert "lineage" in mds("diff", plan, new).output
    assert mds("verify", new, "--index", index).exit_code == 0


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--skip-steps", "14"], "--skip-steps '14': give A:B"),
        (["--skip-steps", "8:12"], "starts before --at-step 10"),
        (["--skip-steps", "12:16", "--skip-steps", "14:18"], "overlap"),
        (["--exclude-missing", "maybe"], "use error or ignore"),
    ],
)
def test_bad_flags_are_one_error_line(old, tmp_path, extra, needle):
    index, plan = old
    one_error_line(mds(*base(index, tmp_path / "x.mds", plan), "--at-step", "10", *extra), needle)


def test_documents_listed_by_content_hash_are_found_by_reading_the_index(old, tmp_path):
    index, plan = old
    exported = tmp_path / "bad.parquet"
    assert mds("export", plan, "-o", exported, "--steps", "12:13", "--index", index, "--hash").exit_code == 0
    bad = pl.read_parquet(exported)
    listed = tmp_path / "hashes.csv"
    bad.select("content_hash").write_csv(listed)
    new = tmp_path / "new.mds"
    shown = mds(*base(index, new, plan), "--at-step", "10", "--exclude", listed, "--json")
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.output)["exclude"]
    assert report["entries"] == bad.height
    assert report["matched"] >= bad.select("source", "row").unique().height
    after = tmp_path / "new.parquet"
    assert mds("export", new, "-o", after, "--index", index, "--hash").exit_code == 0
    hashes = set(bad["content_hash"].to_list())
    assert not hashes & set(pl.read_parquet(after)["content_hash"].to_list())


def test_a_content_hash_no_document_has_names_its_row(old, tmp_path):
    index, plan = old
    listed = tmp_path / "hashes.csv"
    listed.write_text("content_hash\nabc123\n")
    args = (*base(index, tmp_path / "x.mds", plan), "--at-step", "10", "--exclude", listed)
    one_error_line(mds(*args), "--exclude row 1: no document of the index has content_hash 'abc123'")
    assert mds(*args, "--exclude-missing", "ignore").exit_code == 0


def test_skip_and_exclude_need_a_parent(old, tmp_path):
    index, _plan = old
    one_error_line(
        mds("plan", "sample_data/mds.toml", "--index", index, "-o", tmp_path / "x.mds", "--skip-steps", "1:2"),
        "give --from PLAN --at-step K",
    )


def test_a_re_plan_with_an_exclude_list_parses_the_index_manifest_once(old, tmp_path, monkeypatch):
    """The list is resolved against the manifest that is then planned from (every parse
    ends in index_manifest._check)."""
    from mds.core import index_manifest

    index, plan = old
    listed = tmp_path / "bad.csv"
    listed.write_text("source,row\nweb,3\n")
    checked = []
    check = index_manifest._check
    monkeypatch.setattr(index_manifest, "_check", lambda d, w: (checked.append(w), check(d, w))[1])
    shown = mds(*base(index, tmp_path / "new.mds", plan), "--at-step", "10", "--exclude", listed)
    assert shown.exit_code == 0, shown.output
    assert len(checked) == 1
