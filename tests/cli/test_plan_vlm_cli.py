"""`mds plan` and `mds inspect` of the image-text sample data through the command line: the
plan summary gives each part's balance, and the report shows encoder and backbone side by
side, patches and images per source, in the terminal, as JSON and as HTML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chart_layout import NO_BROWSER, chart_layout, find_chromium
from typer.testing import CliRunner

from mds.cli.main import app

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data"

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vlm")
    runner = CliRunner()
    result = runner.invoke(app, ["index", str(SAMPLE / "vlm.toml"), "-o", str(out / "index")])
    assert result.exit_code == 0, result.output
    args = ["plan", str(SAMPLE / "vlm.toml"), "--index", str(out / "index"), "-o", str(out / "plan.mds")]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    for part in ("encoder", "backbone"):
        q = summary["parts"][part]
        assert 1.0 <= q["ratio_mean"] <= q["ratio_max"] and q["naive_ratio_mean"] >= 1.0
    return out / "plan.mds"


def test_inspect_shows_both_parts(plan: Path) -> None:
    result = CliRunner().invoke(app, ["inspect", str(plan)], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    text = result.output
    for needle in ("two-part balance", "encoder", "backbone", "patches per image", "captions:", "charts:"):
        assert needle in text


def test_inspect_json_and_html(plan: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["inspect", str(plan), "--json"])
    assert result.exit_code == 0, result.output
    vision = json.loads(result.stdout)["vision"]
    assert vision["geometry"]["patch_size"] == 14
    names = [s["name"] for s in vision["sources"]]
    assert names == ["captions", "charts"]
    captions = vision["sources"][0]
    assert captions["images"] == sum(b["images"] for b in captions["patch_histogram"])
    html = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["inspect", str(plan), "--html", str(html)])
    assert result.exit_code == 0, result.output
    page = html.read_text()
    assert "<h2>Encoder and backbone</h2>" in page and "patches per image" in page


def test_verify_checks_backbone_lengths_against_the_index(plan: Path) -> None:
    result = CliRunner().invoke(app, ["verify", str(plan)])
    assert result.exit_code == 0, result.output
    assert "fetch records" in result.output


@pytest.mark.skipif(find_chromium() is None, reason=NO_BROWSER)
def test_html_charts_fit_in_chromium(plan: Path, tmp_path: Path) -> None:
    """The vlm report's charts as headless chromium lays them out (tests/chart_layout.py)."""
    html = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["inspect", str(plan), "--html", str(html)])
    assert result.exit_code == 0, result.output
    charts, problems, _ = chart_layout([html.read_text()], tmp_path, "vlm-charts.png")
    assert any("images per bucket of patches per image" in t["text"] for c in charts for t in c["texts"])
    assert charts and problems == []
