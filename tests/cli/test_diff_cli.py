"""`mds diff` from the command line: exit 0 for identical or different plans, --json, errors."""

from __future__ import annotations

import json

import pytest
from cli_helpers import mds
from plan_builders import SAMPLE_CONFIG, sample_index


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    index = sample_index(tmp_path_factory)
    out = tmp_path_factory.mktemp("diff-cli")
    paths = {}
    for name, extra in (("a", []), ("b", []), ("dp8", ["--dp-size", "8"])):
        paths[name] = out / f"{name}.mds"
        result = mds("plan", SAMPLE_CONFIG, "--index", index, "-o", paths[name], "--json", *extra)
        assert result.exit_code == 0, result.output
    paths["replan"] = out / "replan.mds"
    args = ("--from", paths["a"], "--at-step", "32")
    result = mds("plan", SAMPLE_CONFIG, "--index", index, "-o", paths["replan"], "--json", *args)
    assert result.exit_code == 0, result.output
    return paths


def test_a_re_plan_is_compared_over_the_shared_steps(plans):
    result = mds("diff", plans["a"], plans["replan"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "(plan id" in out and "64 steps: steps 0-63" in out and "32 steps: steps 32-63" in out
    assert "the plans differ: first_step, lineage" in out
    assert "samples per source, over the 32 steps both plans hold: steps 32-63" in out
    assert "+0.00 pp" in out
    data = json.loads(mds("diff", plans["a"], plans["replan"], "--json").stdout)
    assert data["shared_steps"] == {"first": 32, "last": 63, "count": 32}


def test_identical(plans):
    result = mds("diff", plans["a"], plans["b"])
    assert result.exit_code == 0, result.output
    assert "identical" in result.stdout
    data = json.loads(mds("diff", plans["a"], plans["b"], "--json").stdout)
    assert data["identical"] is True and data["header"] == []


def test_different_dp_size(plans):
    result = mds("diff", plans["a"], plans["dp8"])
    assert result.exit_code == 0, result.output
    for text in ("the plans differ: train.dp_size", "same samples, different assignment"):
        assert text in result.stdout
    assert "samples per source" in result.stdout and "+0.00 pp" in result.stdout


def test_json(plans):
    result = mds("diff", plans["a"], plans["dp8"], "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"identical", "header", "first_difference", "sources", "only_in_a", "only_in_b"} <= set(
        data
    )
    assert data["identical"] is False
    assert [h["text"] for h in data["header"]] == ["train.dp_size: 4 -> 8"]
    assert data["first_difference"] == {
        "step": 0,
        "rank": None,
        "same_samples": True,
        "detail": "dp_size differs (4 -> 8); step 0: same samples, different assignment",
    }
    assert data["first_sample_difference"] is None
    assert [s["name"] for s in data["sources"]] == ["web", "books", "forum", "code", "wiki", "math"]


def test_unreadable_plan_is_one_error_line(plans, tmp_path):
    bad = tmp_path / "bad.mds"
    bad.write_bytes(b"not a plan at all, but long enough to have a trailer......")
    result = mds("diff", plans["a"], bad)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "not an mds plan" in lines[0]
    assert "Traceback" not in result.output


def test_help_has_examples():
    result = mds("diff", "--help")
    assert result.exit_code == 0
    assert "Example" in result.stdout and "mds diff build/plan.mds" in result.stdout


def test_exit_code(plans):
    assert mds("diff", plans["a"], plans["b"], "--exit-code").exit_code == 0
    different = mds("diff", plans["a"], plans["dp8"], "--exit-code")
    assert different.exit_code == 1 and "the plans differ" in different.stdout
    assert mds("diff", plans["a"], plans["dp8"], "--exit-code", "--json").exit_code == 1
    missing = mds("diff", plans["a"], plans["a"].with_name("missing.mds"), "--exit-code")
    assert missing.exit_code == 2 and missing.stderr.startswith("error: ")
