"""80-column output: no line is wider than the screen, no file name is split across lines,
and costs are shown in the config's units (FLOPs here), not the balancer's integers."""

from __future__ import annotations

import pytest
from cli_helpers import mds
from plan_builders import SAMPLE_CONFIG, sample_index

from mds.planner.index.tables import read_manifest


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    index = sample_index(tmp_path_factory)
    out = tmp_path_factory.mktemp("width")
    for name, extra in (("plan", []), ("plan2", ["--dp-size", "2"])):
        result = mds("plan", SAMPLE_CONFIG, "--index", index, "-o", out / f"{name}.mds", *extra)
        assert result.exit_code == 0, result.output
    files = [f["path"] for s in read_manifest(index).sources for f in s["files"]]
    return index, out, files


def _narrow(*args) -> str:
    result = mds(*args)
    assert result.exit_code == 0, result.output
    # `mds diff` keeps its "A:", "B:" and "first difference:" lines whole, for grep
    grep_lines = ("A: ", "B: ", "first difference: ")
    lines = [line for line in result.stdout.splitlines() if not line.startswith(grep_lines)]
    wide = [line for line in lines if len(line) > 80]
    assert wide == [], args
    return result.stdout


def test_commands_fit_80_columns(built):
    index, out, _ = built
    _narrow("plan", SAMPLE_CONFIG, "--index", index, "-o", out / "again.mds")
    _narrow("inspect", out / "plan.mds")
    _narrow("verify", out / "plan.mds")
    _narrow("diff", out / "plan.mds", out / "plan2.mds")


def test_file_names_are_whole(built):
    index, out, files = built
    listing = _narrow("inspect", index, "--files")
    step = _narrow("inspect", out / "plan.mds", "--step", 3)
    for name in files:
        assert name in listing
    body = step.split("per rank")[0].splitlines()[2:]  # below the title
    shown = [word for line in body for word in line.split() if "/" in word]
    assert shown and set(shown) - set(files) == set()


def test_costs_in_config_units(built):
    _, out, _ = built
    step = _narrow("inspect", out / "plan.mds", "--step", 3, "--rank", 1)
    assert "cost in FLOPs" in step
    assert "FLOP formula of [cost] model: a = " in _narrow("inspect", out / "plan.mds")
