"""`mds plan` and `mds inspect` of a context-parallel plan through the command line: the
summary gives the DP x CP step over its lower bound, and the report shows the CP layout in
the terminal, as JSON and as HTML."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import numpy as np
import pytest
from chart_layout import NO_BROWSER, chart_layout, find_chromium
from plan_builders import index_data, write_source
from typer.testing import CliRunner

from mds.cli.main import app

CONFIG = """
[index]
output = "index"

[[source]]
name = "docs"
path = "docs/data.parquet"
count = "n"
weight = 1.0

[train]
steps = 10
dp_size = 2
micro_batches = 2
samples_per_step = 16
max_tokens_per_micro_batch = 16384
seed = 3
cp_size = 4
cp_split_from = 2048

[cost]
model = { layers = 4, hidden = 256 }
"""


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cp")
    rng = np.random.default_rng(11)
    lengths = np.exp(rng.uniform(math.log(64), math.log(12000), 300)).astype(int)
    write_source(root, "docs", lengths.tolist())
    (root / "mds.toml").write_text(CONFIG)
    index_data(root, tomllib.loads(CONFIG))
    out = root / "plan.mds"
    args = ["plan", str(root / "mds.toml"), "-o", str(out)]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    cp = json.loads(result.stdout)["cp"]
    assert cp["cp_size"] == 4 and 1.0 <= cp["ratio_mean"] <= cp["ratio_max"]
    assert cp["contiguous_ratio_mean"] > cp["ratio_mean"] and cp["samples_split"] > 0
    result = CliRunner().invoke(app, args, env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "DP x CP step / lower bound (cp 4)" in result.output
    return out


def test_inspect_shows_the_cp_layout(plan: Path) -> None:
    result = CliRunner().invoke(app, ["inspect", str(plan)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    for needle in (
        "context parallelism: cp 4",
        "head-tail everywhere",
        "contiguous",
        "samples split:",
    ):
        assert needle in result.output


def test_inspect_json_and_html(plan: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["inspect", str(plan), "--json"])
    assert result.exit_code == 0, result.output
    cp = json.loads(result.stdout)["cp"]
    assert (cp["cp_size"], cp["split_from"], cp["linear"]) == (4, 2048, 12 * 256)
    layouts = cp["layouts"]
    assert layouts["headtail"]["imbalance"]["max"] == 1.0
    assert layouts["contiguous"]["imbalance"]["mean"] > layouts["mds"]["imbalance"]["mean"] >= 1.0
    assert layouts["mds"]["step_time_over_mds"] == 1.0
    html = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["inspect", str(plan), "--html", str(html)])
    assert result.exit_code == 0, result.output
    page = html.read_text()
    assert "<h2>Context parallelism</h2>" in page and "head-tail everywhere" in page


@pytest.mark.skipif(find_chromium() is None, reason=NO_BROWSER)
def test_html_charts_fit_in_chromium(plan: Path, tmp_path: Path) -> None:
    """The cp report's charts as headless chromium lays them out (tests/chart_layout.py)."""
    html = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["inspect", str(plan), "--html", str(html)])
    assert result.exit_code == 0, result.output
    charts, problems, _ = chart_layout([html.read_text()], tmp_path, "cp-charts.png")
    assert charts and problems == []
