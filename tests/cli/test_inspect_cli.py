"""`mds inspect` from the command line: terminal output, the JSON schema of docs/inspect.md,
the HTML report (well-formed, SVG parses, optional headless render) and one-line errors."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest
from chart_layout import NO_BROWSER, chart_layout, find_chromium
from cli_helpers import mds
from cli_helpers import one_error_line as _one_error_line
from plan_builders import SAMPLE_CONFIG

from mds.planner.index.build import build_index
from mds.planner.index.config import load_config
from mds.planner.plan.build import build_plan, with_overrides
from mds.planner.plan.chunk import STAT_COLUMNS
from mds.planner.plan.config import load_plan_config
from mds.planner.report.export import plan_frame


def ok(*args):
    result = mds(*args)
    assert result.exit_code == 0, result.output
    return result


def one_error_line(result, *needles):
    assert result.stdout == ""
    return _one_error_line(result, *needles)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("inspect")
    index = out / "index"
    build_index(load_config(SAMPLE_CONFIG), index, workers=1)
    plan = out / "plan.mds"
    build_plan(with_overrides(load_plan_config(SAMPLE_CONFIG), index=index), plan)
    return index, plan


# --- the JSON schema (docs/inspect.md), as key -> type -----------------------------------------

NUM = (int, float)
OPT_NUM = (int, float, type(None))
OPT_INT = (int, type(None))
OPT_STR = (str, type(None))
STATS = {"mean": OPT_NUM, "min": OPT_NUM, "median": OPT_NUM, "p99": OPT_NUM, "max": OPT_NUM}
SHARE = {"name": str, "target": NUM, "realized": NUM}
INDEX_SCHEMA = {
    "schema": int,
    "kind": str,
    "path": str,
    "format_version": int,
    "fingerprint": str,
    "fingerprint_mode": str,
    "root": str,
    "rows": int,
    "tokens": int,
    "exact": bool,
    "sources": [
        {
            "name": str,
            "format": str,
            "rows": int,
            "tokens": int,
            "exact": bool,
            "length": dict,
            "lengths": {
                "min": OPT_INT,
                "mean": OPT_NUM,
                "p50": OPT_INT,
                "p90": OPT_INT,
                "p99": OPT_INT,
                "max": OPT_INT,
            },
            "histogram": [{"lo": int, "hi": int, "count": int}],
            "metadata": list,
            "files": [
                {
                    "id": int,
                    "path": str,
                    "index_path": OPT_STR,
                    "size": int,
                    "fingerprint": str,
                    "rows": int,
                    "tokens": int,
                }
            ],
        }
    ],
}
PLAN_SCHEMA = {
    "schema": int,
    "kind": str,
    "path": str,
    "header": {
        "format_version": int,
        "plan_id": str,
        "bytes": int,
        "steps": int,
        "dp_size": int,
        "micro_batches": int,
        "samples_per_step": OPT_INT,
        "tokens_per_step": OPT_INT,
        "weight_by": str,
        "capacity": int,
        "overlong": str,
        "seed": int,
        "cost": dict,
        "cost_model": str,
        "cost_label": str,
        "cost_scale": NUM,
        "index_fingerprint": str,
        "index_path": str,
        "chunk_steps": int,
        "chunks": int,
        "first_step": int,
        "last_step": int,
        "lineage": (dict, type(None)),
    },
    "totals": {"samples": int, "tokens": int},
    "share_unit": str,
    "sources": [
        {
            **SHARE,
            "eligible": int,
            "samples": int,
            "tokens": OPT_INT,
            "epochs": NUM,
            "epochs_started": int,
            "dropped_overlong": int,
            "truncated": int,
            "weight": (int, float, dict),
            "filter": OPT_STR,
            "max_epochs": OPT_INT,
        }
    ],
    "phases": [{"start": int, "end": int, "sources": [SHARE]}],
    "imbalance": {
        "max_over_mean": STATS,
        "max_over_lower_bound": STATS,
        "naive_over_lower_bound": STATS,
        "speedup_vs_naive": NUM,
        "speedup_vs_naive_with_c": OPT_NUM,
        "interleave_over_lower_bound": STATS,
        "speedup_vs_interleave": NUM,
        "stronger_baseline": str,
    },
    "capacity_fill": {"step": STATS, "max_micro_batch": STATS},
    "series": {
        "bucket": int,
        "start": [int],
        "ratio": [NUM],
        "naive_ratio": [NUM],
        "interleave_ratio": [NUM],
        "sources": [{"name": str, "target": [NUM], "realized": [NUM]}],
    },
    "warnings": [str],  # books is drawn 2.37 epochs, past the default warn_epochs = 2
}
TOTAL = {"samples": int, "tokens": int, "cost": NUM, "cost_units": int}
STEP_SCHEMA = {
    "schema": int,
    "kind": str,
    "path": str,
    "plan_id": str,
    "index": str,
    "index_root": str,
    "step": int,
    "dp_size": int,
    "micro_batches": int,
    "ranks": [int],
    "stats": dict.fromkeys(STAT_COLUMNS, int),
    "samples": [
        {
            "rank": int,
            "micro_batch": int,
            "source": str,
            "row": int,
            "file": str,
            "file_row": int,
            "offset": OPT_INT,
            "length": OPT_INT,
            "n_tokens": int,
            "cost": NUM,
            "cost_units": int,
        }
    ],
    "rank_totals": [{"rank": int, **TOTAL, "micro_batches": [{"micro_batch": int, **TOTAL}]}],
}


def check(value, spec, where="$"):
    """`value` has exactly the keys of `spec` with the documented types."""
    if isinstance(spec, dict):
        assert isinstance(value, dict), where
        assert set(value) == set(spec), (where, set(value) ^ set(spec))
        for key, sub in spec.items():
            check(value[key], sub, f"{where}.{key}")
    elif isinstance(spec, list):
        assert isinstance(value, list) and value, where
        for i, item in enumerate(value):
            check(item, spec[0], f"{where}[{i}]")
    else:
        assert isinstance(value, spec), (where, value)
        if spec is int or spec == OPT_INT:
            assert not isinstance(value, bool), where


def as_json(*args):
    return json.loads(ok(*args, "--json").stdout)


# --- index ---------------------------------------------------------------------------------------


def test_index_json_schema(built):
    index, _ = built
    report = as_json("inspect", index)
    check(report, INDEX_SCHEMA)
    assert (report["schema"], report["kind"]) == (1, "index")
    code = next(s for s in report["sources"] if s["name"] == "code")
    assert code["exact"] is False and report["exact"] is False
    for s in report["sources"]:
        for m in s["metadata"]:
            assert {"column", "dtype", "nulls", "kind"} <= set(m)
            keys = (
                {"min", "mean", "max"} if m["kind"] == "numeric" else {"distinct", "top", "other"}
            )
            assert keys <= set(m)


def test_index_terminal(built):
    index, _ = built
    out = ok("inspect", index).stdout
    for text in ("web", "books", "forum", "code", "wiki", "math", "p99", "█", "lang"):
        assert text in out
    assert "~94,623" in out  # the estimated source is marked
    assert "sampled:" not in out
    assert "sampled:" in ok("inspect", index, "--files").stdout


# --- plan ----------------------------------------------------------------------------------------


def test_plan_json_schema(built):
    _, plan = built
    report = as_json("inspect", plan)
    check(report, PLAN_SCHEMA)
    assert report["kind"] == "plan" and report["header"]["steps"] == 64


def test_plan_terminal(built):
    _, plan = built
    out = ok("inspect", plan).stdout
    for text in ("64 (steps 0-63) x 4 x 2", "target", "realized", "steps 32-62", "epochs"):
        assert text in out
    assert any(c in out for c in "▁▂▃▄▅▆▇") and "naive / lower bound" in out


def test_a_re_planned_plan_shows_the_steps_it_holds(built, tmp_path):
    index, plan = built
    replan = tmp_path / "replan.mds"
    config = with_overrides(load_plan_config(SAMPLE_CONFIG), index=index)
    build_plan(config, replan, parent=plan, at_step=32)
    header = as_json("inspect", replan)["header"]
    assert (header["first_step"], header["last_step"], header["steps"]) == (32, 63, 64)
    out = ok("inspect", replan).stdout
    assert "32 (steps 32-63) x 4 x 2" in out and "64 x 4 x 2" not in out
    assert "over steps 32-63" in out
    ok("inspect", replan, "--html", tmp_path / "r.html")
    assert "32 (steps 32-63) x 4 x 2" in (tmp_path / "r.html").read_text(encoding="utf-8")


# --- step ----------------------------------------------------------------------------------------


def test_step_json_equals_plan_frame(built):
    _, plan = built
    report = as_json("inspect", plan, "--step", 21, "--rank", 2, "--rank", 0)
    check(report, STEP_SCHEMA)
    assert report["ranks"] == [0, 2]
    keys = ["rank", "micro_batch", "source", "row", "file_row", "offset", "n_tokens", "cost"]
    frame = plan_frame(plan).filter((pl.col("step") == 21) & pl.col("rank").is_in([0, 2]))
    frame = frame.rename({"byte_offset": "offset"})
    expected = frame.with_columns(pl.col("n_tokens").cast(pl.Int64)).select(keys).to_dicts()
    assert [{k: s[k] for k in keys} for s in report["samples"]] == expected


def test_step_terminal(built):
    _, plan = built
    out = ok("inspect", plan, "--step", 3, "--rank", 1).stdout
    assert "step 3" in out and "rank 1" in out and "per rank" in out
    assert ".parquet" in out or ".jsonl" in out or ".arrow" in out or ".bin" in out


def test_step_with_index_option(built, tmp_path):
    index, plan = built
    moved = tmp_path / "plan.mds"
    shutil.copy(plan, moved)  # the footer's relative index path no longer resolves
    one_error_line(mds("inspect", moved, "--step", 0), "its index was expected at", "pass --index")
    report = as_json("inspect", moved, "--step", 0, "--index", index)
    assert report["index"] == str(index)


# --- HTML ----------------------------------------------------------------------------------------

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}


class WellFormed(HTMLParser):
    """Every non-void tag is closed, in order; records external references."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("src", "href") or (value and "url(" in value):
                self.external.append(f"{tag} {name}={value}")
        if tag in ("script", "link", "img", "iframe"):
            self.external.append(tag)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        for name, value in attrs:
            if name in ("src", "href"):
                self.external.append(f"{tag} {name}={value}")

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()


def check_html(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    parser = WellFormed()
    parser.feed(text)
    parser.close()
    assert parser.errors == [] and parser.stack == [], (parser.errors, parser.stack)
    assert parser.external == []
    svgs = []
    start = 0
    while (i := text.find("<svg", start)) >= 0:
        j = text.index("</svg>", i) + len("</svg>")
        svgs.append(ET.fromstring(text[i:j]))
        start = j
    assert svgs
    ns = "{http://www.w3.org/2000/svg}"
    for svg in svgs:
        width, height = float(svg.get("width")), float(svg.get("height"))
        for line in svg.iter(f"{ns}polyline"):
            for point in line.get("points").split():
                x, y = map(float, point.split(","))
                assert 0 <= x <= width and 0 <= y <= height
    return text


@pytest.fixture(scope="module")
def html_reports(built, tmp_path_factory):
    index, plan = built
    out = tmp_path_factory.mktemp("html")
    paths = {}
    for name, args in (
        ("index", [index]),
        ("plan", [plan]),
        ("step", [plan, "--step", 5]),
    ):
        paths[name] = out / f"{name}.html"
        result = ok("inspect", *args, "--html", paths[name])
        assert f"wrote {paths[name]}" in result.stdout
    return paths


def test_html_reports_are_well_formed(html_reports):
    index = check_html(html_reports["index"])
    assert "samples per length bucket" in index and "sampled:" in index
    plan = check_html(html_reports["plan"])
    # the realized and target mix, six share charts and the imbalance chart
    assert plan.count("<svg") == 9
    assert 'stroke-dasharray="5 4"' in plan and "rank imbalance per step" in plan
    assert '<p class="warn">warning: source &#x27;books&#x27; is drawn 2.37 epochs' in plan
    assert "64 (steps 0-63) x 4 x 2" in plan
    step = check_html(html_reports["step"])
    assert "cost per rank (as configured)" in step
    leftovers = [p for p in html_reports["index"].parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # atomic write: no temporary files stay


def test_html_with_json(built, tmp_path):
    index, _ = built
    result = ok("inspect", index, "--html", tmp_path / "r.html", "--json")
    assert json.loads(result.stdout)["kind"] == "index"
    check_html(tmp_path / "r.html")


# --- the charts as a browser lays them out --------------------------------------------------------


@pytest.mark.skipif(find_chromium() is None, reason=NO_BROWSER)
def test_charts_fit_in_chromium(html_reports, tmp_path):
    """The three reports' charts laid out by a real browser (tests/chart_layout.py): every
    text inside its SVG, tick labels apart and short, each chart with a title, two axis
    titles and a legend when it draws more than one series. A screenshot of all charts goes
    to build/inspect-html/charts.png for review."""
    pages = [html_reports[name].read_text(encoding="utf-8") for name in ("index", "plan", "step")]
    charts, problems, png = chart_layout(pages, tmp_path, "charts.png")
    assert len(charts) >= 10
    assert problems == []
    assert png.exists() and png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- errors and help -------------------------------------------------------------------------------


def test_errors(built, tmp_path):
    index, plan = built
    notes = tmp_path / "notes.txt"
    notes.write_text("not a plan")
    one_error_line(mds("inspect", notes), "neither an mds plan file nor an mds index")
    one_error_line(mds("inspect", tmp_path), "neither an mds index")
    one_error_line(mds("inspect", tmp_path / "missing"), "no such file or directory")
    one_error_line(mds("inspect", plan, "--step", 64), "--step 64 is outside the plan's 64 steps")
    one_error_line(mds("inspect", plan, "--step", -1), "--step -1 is outside")
    one_error_line(
        mds("inspect", plan, "--step", 0, "--rank", 4), "--rank 4 is outside the plan's dp_size 4"
    )
    one_error_line(mds("inspect", plan, "--rank", 1), "--rank needs --step")
    one_error_line(mds("inspect", index, "--step", 1), "--step needs a plan file")
    one_error_line(mds("inspect", plan, "--files"), "--files needs an index directory")


def test_fingerprint_mismatch(built, tmp_path):
    index, plan = built
    other = tmp_path / "index"
    shutil.copytree(index, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["fingerprint"] = "blake2b:" + "f" * 32
    (other / "manifest.json").write_text(json.dumps(manifest))
    one_error_line(
        mds("inspect", plan, "--step", 0, "--index", other), "differs from the one the plan"
    )


def test_corrupt_plan_is_one_line(built, tmp_path):
    _, plan = built
    bad = tmp_path / "bad.mds"
    data = bytearray(plan.read_bytes())
    data[-40] ^= 0xFF  # inside the footer: its checksum no longer matches
    bad.write_bytes(bytes(data))
    one_error_line(mds("inspect", bad), "checksum mismatch")


def test_help_has_examples():
    out = ok("inspect", "--help").stdout
    assert "Example" in out and "mds inspect build/plan.mds --step 10 --rank 3" in out
    assert "inspect" in ok("--help").stdout


# --- the cost model a plan used ----------------------------------------------------------------


def test_plan_names_its_cost_model(built, tmp_path):
    import dataclasses

    from mds.cli.inspect_text import cost_text
    from mds.planner.plan.config import CostSpec

    index, plan = built
    text = ok("inspect", plan).stdout
    assert "cost model" in text and "FLOP formula" in text
    header = json.loads(ok("inspect", plan, "--json").stdout)["header"]
    assert header["cost_model"] == "flop_formula"
    fit = {"max": 0.181, "median": 0.079, "points": 37}
    cost = CostSpec(a=6.8e-05, b=8.0e-08, c=0.003, origin="calibrated", fit_error=fit)
    cfg = dataclasses.replace(
        with_overrides(load_plan_config(SAMPLE_CONFIG), index=index), cost=cost
    )
    calibrated = tmp_path / "calibrated.mds"
    build_plan(cfg, calibrated)
    words = ok("inspect", calibrated).stdout.split()
    assert {"calibrated", "18.1%,", "7.9%"} <= set(words)  # the cell may wrap between words
    header = json.loads(ok("inspect", calibrated, "--json").stdout)["header"]
    assert header["cost_model"] == "calibrated"
    assert cost_text(header["cost"], header["cost_model"]) == (
        "calibrated (mds calibrate): a = 6.8e-05, b = 8e-08, c = 0.003 per micro-batch; "
        "fit error max 18.1%, median 7.9% over 37 micro-batches"
    )
    assert header["cost"] == {"a": 6.8e-05, "b": 8.0e-08, "c": 0.003, "origin": "calibrated",
                              "fit_error": fit}  # fmt: skip
    imb = json.loads(ok("inspect", calibrated, "--json").stdout)["imbalance"]
    # c adds the same time to every rank: it dilutes the speedup, never reverses it.
    assert 1.0 <= imb["speedup_vs_naive_with_c"] < imb["speedup_vs_naive"]
    assert "counting c per micro-batch" in ok("inspect", calibrated).stdout
    assert (
        json.loads(ok("inspect", plan, "--json").stdout)["imbalance"]["speedup_vs_naive_with_c"]
        is None
    )
    html = tmp_path / "report.html"
    ok("inspect", calibrated, "--html", html)
    assert "fit error max 18.1%" in html.read_text()
    assert "counting c per micro-batch" in html.read_text()


def test_default_cost_is_named_with_its_band_and_others_without(built, tmp_path):
    import dataclasses

    from mds.planner.plan.config import CostSpec

    index, plan = built
    config = with_overrides(load_plan_config(SAMPLE_CONFIG), index=index)
    default = tmp_path / "default.mds"
    summary = build_plan(dataclasses.replace(config, cost=CostSpec()), default).to_json()
    assert summary["cost"]["kind"] == "default"
    assert "hidden 4096" in summary["cost"]["label"]
    band = summary["cost"]["band"]
    assert band["b_factors"] == [0.25, 4.0]
    assert band["low"] <= summary["speedup_vs_naive"] <= band["high"]
    report = json.loads(ok("inspect", default, "--json").stdout)
    assert report["header"]["cost_model"] == "default"
    assert "built-in default" in report["header"]["cost_label"]
    assert report["imbalance"]["speedup_vs_naive_band"]["low"] == band["low"]
    assert "ranges" in ok("inspect", default).stdout
    html = tmp_path / "default.html"
    ok("inspect", default, "--html", html)
    assert "built-in default" in html.read_text() and "ranges" in html.read_text()
    text = SAMPLE_CONFIG.read_text()
    start = text.index("[cost]")
    no_cost = tmp_path / "no-cost.toml"  # planning reads the index only: any directory does
    end = text.find("\n[", start + 1)
    no_cost.write_text(text[:start] + (text[end:] if end >= 0 else ""))
    out = ok("plan", no_cost, "--index", index, "-o", tmp_path / "again.mds").stdout
    assert "range over b" in out and "built-in default" in out

    # Any other cost: named, with no band (and the plan summary keeps its keys).
    summary = build_plan(config, tmp_path / "model.mds").to_json()
    assert "cost" not in summary
    report = json.loads(ok("inspect", plan, "--json").stdout)
    assert report["header"]["cost_label"].startswith("FLOP model of [cost] model")
    assert "speedup_vs_naive_band" not in report["imbalance"]
    assert "ranges" not in ok("inspect", plan).stdout


def test_urls_keep_both_slashes_in_every_message(built, monkeypatch, tmp_path):
    """An s3:// plan or index given to any command is named as given (`s3://bucket/...`),
    never folded to `s3:/bucket/...` by a path; one that is there is read."""
    from s3_store import s3_server

    index, plan = built
    with s3_server(monkeypatch) as store:
        missing = store.url("plans/missing.mds")
        for args in (
            ("inspect", missing),
            ("inspect", missing, "--json"),
            ("export", missing, "-o", tmp_path / "out.parquet"),
            ("diff", missing, missing),
            ("plan", SAMPLE_CONFIG, "--index", index, "--from", missing, "--at-step", "2",
             "-o", tmp_path / "x.mds"),
        ):
            result = mds(*args)
            assert result.exit_code == 1, result.output
            assert missing in result.output and "s3:/mds-test" not in result.output, args
        result = mds("verify", missing)
        assert missing in result.stderr and "s3:/mds-test" not in result.output
        one_error_line(mds("inspect", store.url("nothing")), f"{store.url('nothing')}: no such")
        store.upload(index, "index")
        store.put("plan.mds", plan.read_bytes())  # its index beside it, as recorded
        assert as_json("inspect", store.url("plan.mds"))["kind"] == "plan"
        report = as_json("inspect", store.url("index"))
        assert report["kind"] == "index" and report["path"] == store.url("index")
        step = as_json("inspect", store.url("plan.mds"), "--step", "0")  # the index beside it
        assert step["kind"] == "step" and step["index"] == store.url("index")
        assert "identical" in ok("diff", store.url("plan.mds"), plan).stdout
        out = tmp_path / "plan.parquet"
        ok("export", store.url("plan.mds"), "--index", index, "-o", out)
        assert pl.read_parquet(out).height == plan_frame(plan).height
