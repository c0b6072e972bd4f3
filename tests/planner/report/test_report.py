"""`mds inspect` reports (planner.report*): every figure against an independent computation
from the index tables, `plan_frame` or the config, on the sample data."""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from dataclasses import replace

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from plan_builders import SAMPLE_CONFIG, schedule_weights, synthetic, train_table

from mds.core.planfile_reader import PlanReader
from mds.errors import ConfigError, DataChangedError
from mds.planner.index.build import build_index
from mds.planner.index.config import load_config
from mds.planner.index.tables import read_manifest
from mds.planner.plan.build import build_plan, with_overrides
from mds.planner.plan.config import load_plan_config
from mds.planner.report.common import detect
from mds.planner.report.export import plan_frame
from mds.planner.report.index import TOP_VALUES, index_report, length_histogram
from mds.planner.report.plan import breakpoints, phases, plan_report
from mds.planner.report.step import step_report

SOURCES = ["web", "books", "forum", "code", "wiki", "math"]
CAPACITY = 8192


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    index = out / "index"
    build_index(load_config(SAMPLE_CONFIG), index, workers=1)
    config = with_overrides(load_plan_config(SAMPLE_CONFIG), index=index)
    plan = out / "plan.mds"
    summary = build_plan(config, plan)
    # the same sources in token mode (shares of tokens), with overlong samples truncated
    train = replace(
        config.train,
        samples_per_step=None,
        tokens_per_step=12000,
        weight_by="tokens",
        max_tokens_per_micro_batch=2048,
        overlong="truncate",
    )
    tokens_plan = out / "tokens.mds"
    build_plan(replace(config, train=train), tokens_plan)
    with PlanReader(plan) as reader:
        report = plan_report(reader)
    return {
        "index": index,
        "manifest": read_manifest(index),
        "plan": plan,
        "summary": summary,
        "frame": plan_frame(plan),
        "report": report,
        "tokens_plan": tokens_plan,
    }


# --- index ---------------------------------------------------------------------------------------


def test_index_report_sizes_and_lengths(sample):
    manifest = sample["manifest"]
    report = index_report(manifest)
    assert (report["schema"], report["kind"]) == (1, "index")
    assert report["fingerprint"] == manifest.fingerprint
    assert [s["name"] for s in report["sources"]] == SOURCES
    assert report["exact"] is False  # code's lengths are a bytes/4 estimate
    for entry, s in zip(manifest.sources, report["sources"], strict=True):
        assert (s["rows"], s["tokens"], s["format"]) == (
            entry["rows"],
            entry["tokens"],
            entry["format"],
        )
        assert s["exact"] is (s["name"] != "code")
        # the manifest's length_stats were computed by the index build, a separate code path
        for key in ("min", "p50", "p90", "p99", "max"):
            assert s["lengths"][key] == entry["length_stats"][key], (s["name"], key)
        n = pq.read_table(manifest.path / entry["table"])["n_tokens"].to_numpy()
        assert s["lengths"]["mean"] == pytest.approx(n.mean())
        hist = s["histogram"]
        assert sum(b["count"] for b in hist) == len(n)
        for b, nxt in zip(hist, hist[1:], strict=False):
            assert b["hi"] == nxt["lo"]
        for b in hist:
            assert b["hi"] == (1 if b["lo"] == 0 else 2 * b["lo"])
            assert b["count"] == int(((n >= b["lo"]) & (n < b["hi"])).sum())
        assert hist[0]["lo"] <= n.min() and n.max() < hist[-1]["hi"]
        assert hist[0]["count"] > 0 and hist[-1]["count"] > 0
        files = {f["path"]: f for f in entry["files"]}
        for f in s["files"]:
            assert (f["size"], f["fingerprint"]) == (
                files[f["path"]]["size"],
                files[f["path"]]["fingerprint"],
            )


def test_length_histogram_buckets():
    hist = length_histogram(pl.Series([0, 1, 2, 3, 4, 7, 8, 1000, 1024], dtype=pl.UInt32))
    got = {(b["lo"], b["hi"]): b["count"] for b in hist}
    assert got[(0, 1)] == 1 and got[(1, 2)] == 1 and got[(2, 4)] == 2 and got[(4, 8)] == 2
    assert got[(8, 16)] == 1 and got[(512, 1024)] == 1 and got[(1024, 2048)] == 1
    assert got[(16, 32)] == 0  # empty buckets in between are listed
    assert length_histogram(pl.Series([], dtype=pl.UInt32)) == []


def test_index_metadata(sample):
    manifest = sample["manifest"]
    report = {s["name"]: s for s in index_report(manifest)["sources"]}
    web = pq.read_table(manifest.path / manifest.source("web")["table"]).to_pydict()
    lang, quality = report["web"]["metadata"]
    assert (lang["column"], lang["kind"], quality["kind"]) == ("lang", "categorical", "numeric")
    counts = Counter(web["lang"])
    assert [(t["value"], t["count"]) for t in lang["top"]] == sorted(
        counts.items(), key=lambda kv: (-kv[1], kv[0])
    )
    assert lang["distinct"] == len(counts) and lang["other"] == 0
    q = np.array(web["quality"])
    assert (quality["min"], quality["max"]) == (q.min(), q.max())
    assert quality["mean"] == pytest.approx(q.mean())
    assert [m["column"] for m in report["forum"]["metadata"]] == ["lang", "score"]
    assert report["math"]["metadata"] == []


def test_index_metadata_top_values(tmp_path):
    tags = [f"t{i:02d}" for i in range(15) for _ in range(15 - i)]  # t00 x15 ... t14 x1
    synthetic(
        tmp_path,
        {"a": {"lengths": [5] * len(tags), "weight": 1.0, "meta": {"tag": tags}}},
        train_table(),
    )
    (tag,) = index_report(read_manifest(tmp_path / "index"))["sources"][0]["metadata"]
    assert len(tag["top"]) == TOP_VALUES and tag["distinct"] == 15
    assert [t["value"] for t in tag["top"]] == [f"t{i:02d}" for i in range(10)]
    assert tag["other"] == sum(range(1, 6))


# --- plan ----------------------------------------------------------------------------------------


def per_step(frame: pl.DataFrame) -> pl.DataFrame:
    """The balance figures, recomputed from the exported rows."""
    ranks = frame.group_by("step", "rank").agg(pl.col("cost_units").sum().alias("load"))
    steps = frame.group_by("step").agg(
        pl.col("cost_units").sum().alias("total"),
        pl.col("cost_units").max().alias("largest"),
        pl.col("n_tokens").sum().alias("tokens"),
    )
    micro = (
        frame.group_by("step", "rank", "micro_batch")
        .agg(pl.col("n_tokens").sum().alias("micro_tokens"))
        .group_by("step")
        .agg(pl.col("micro_tokens").max())
    )
    return (
        ranks.group_by("step")
        .agg(pl.col("load").max().alias("max_load"))
        .join(steps, on="step")
        .join(micro, on="step")
        .sort("step")
    )


def test_header(sample):
    h = sample["report"]["header"]
    assert (h["steps"], h["dp_size"], h["micro_batches"]) == (64, 4, 2)
    assert (h["samples_per_step"], h["tokens_per_step"], h["capacity"]) == (32, None, CAPACITY)
    assert (h["seed"], h["chunk_steps"], h["chunks"], h["format_version"]) == (1234, 16, 4, 4)
    assert h["plan_id"] == sample["summary"].plan_id
    assert h["index_fingerprint"] == sample["manifest"].fingerprint
    assert h["cost"]["origin"] == "model"


def test_imbalance_matches_plan_frame(sample):
    report, D = sample["report"], 4
    steps = per_step(sample["frame"])
    max_load = steps["max_load"].to_numpy().astype(float)
    total = steps["total"].to_numpy()
    lower = np.maximum(-(-total // D), steps["largest"].to_numpy())
    ratio = max_load / lower
    imb = report["imbalance"]["max_over_lower_bound"]
    assert imb["median"] == pytest.approx(np.median(ratio))
    assert imb["p99"] == pytest.approx(np.percentile(ratio, 99))
    assert imb["max"] == pytest.approx(ratio.max())
    assert imb["mean"] == pytest.approx(ratio.mean()) == pytest.approx(sample["summary"].ratio_mean)
    over_mean = report["imbalance"]["max_over_mean"]
    assert over_mean["median"] == pytest.approx(np.median(max_load / (total / D)))
    assert over_mean["max"] == pytest.approx((max_load / (total / D)).max())
    naive = report["imbalance"]["naive_over_lower_bound"]
    assert naive["mean"] == pytest.approx(sample["summary"].naive_ratio_mean, abs=1e-6)
    assert report["imbalance"]["speedup_vs_naive"] == pytest.approx(
        sample["summary"].speedup_vs_naive, abs=1e-6
    )
    assert report["series"]["bucket"] == 1
    assert report["series"]["ratio"] == pytest.approx(ratio.tolist())


def test_capacity_fill_matches_plan_frame(sample):
    fill = sample["report"]["capacity_fill"]
    steps = per_step(sample["frame"])
    step_fill = steps["tokens"].to_numpy() / (4 * 2 * CAPACITY)
    micro_fill = steps["micro_tokens"].to_numpy() / CAPACITY
    assert fill["step"]["mean"] == pytest.approx(step_fill.mean())
    assert fill["step"]["min"] == pytest.approx(step_fill.min())
    assert fill["max_micro_batch"]["max"] == pytest.approx(micro_fill.max())
    assert fill["max_micro_batch"]["mean"] == pytest.approx(micro_fill.mean())


def expected_targets(steps: range) -> np.ndarray:
    """Normalized target shares written from the config's schedules, without the library."""
    import tomllib

    raw = tomllib.loads(SAMPLE_CONFIG.read_text())["source"]
    w = np.stack([schedule_weights(s["weight"], np.array(steps)) for s in raw], axis=1)
    return w / w.sum(axis=1, keepdims=True)


def test_shares_whole_run(sample):
    report, frame = sample["report"], sample["frame"]
    counts = frame.group_by("source").len()
    counts = dict(zip(counts["source"], counts["len"], strict=True))
    target = expected_targets(range(64)).mean(axis=0)
    assert [s["name"] for s in report["sources"]] == SOURCES
    for i, s in enumerate(report["sources"]):
        assert s["realized"] == pytest.approx(counts[s["name"]] / frame.height)
        assert s["target"] == pytest.approx(target[i])
    assert sum(s["target"] for s in report["sources"]) == pytest.approx(1.0)
    assert sum(s["realized"] for s in report["sources"]) == pytest.approx(1.0)
    footer = {s["name"]: s for s in PlanReader(sample["plan"]).footer["sources"]}
    for s in report["sources"]:
        f = footer[s["name"]]
        assert (s["samples"], s["eligible"], s["epochs"], s["epochs_started"]) == (
            f["samples"],
            f["eligible"],
            f["epochs"],
            f["epochs_started"],
        )
        assert s["samples"] == counts[s["name"]]


def test_shares_per_phase(sample):
    report, frame = sample["report"], sample["frame"]
    # books: points at 0 and 63; code: stages at 0 and 32
    assert [(p["start"], p["end"]) for p in report["phases"]] == [(0, 32), (32, 63), (63, 64)]
    for p in report["phases"]:
        part = frame.filter(pl.col("step").is_between(p["start"], p["end"] - 1))
        counts = Counter(part["source"].to_list())
        target = expected_targets(range(p["start"], p["end"])).mean(axis=0)
        assert [s["name"] for s in p["sources"]] == SOURCES
        for i, s in enumerate(p["sources"]):
            assert s["realized"] == pytest.approx(counts[s["name"]] / part.height)
            assert s["target"] == pytest.approx(target[i])
        assert sum(s["target"] for s in p["sources"]) == pytest.approx(1.0)


def test_series_shares(sample):
    series = sample["report"]["series"]
    frame = sample["frame"]
    target = expected_targets(range(64))
    per = frame.group_by("step", "source").len()
    for i, s in enumerate(series["sources"]):
        assert s["target"] == pytest.approx(target[:, i].tolist())
        got = dict(per.filter(pl.col("source") == s["name"]).select("step", "len").iter_rows())
        assert s["realized"] == pytest.approx([got.get(t, 0) / 32 for t in range(64)])


def test_series_buckets(sample):
    with PlanReader(sample["plan"]) as reader:
        report = plan_report(reader, points=10)
    series = report["series"]
    assert series["bucket"] == 7 and series["start"] == list(range(0, 64, 7))
    ratio = np.array(sample["report"]["series"]["ratio"])
    assert series["ratio"][-1] == pytest.approx(ratio[63:].mean())
    assert series["ratio"][0] == pytest.approx(ratio[:7].mean())
    for k in range(len(series["start"])):
        assert sum(s["target"][k] for s in series["sources"]) == pytest.approx(1.0)
        assert sum(s["realized"][k] for s in series["sources"]) == pytest.approx(1.0)


def test_token_mode_shares(sample):
    with PlanReader(sample["tokens_plan"]) as reader:
        report = plan_report(reader)
    assert report["share_unit"] == "tokens" and report["header"]["tokens_per_step"] == 12000
    assert sum(s["truncated"] for s in report["sources"]) > 0
    frame = plan_frame(sample["tokens_plan"]).with_columns(
        pl.min_horizontal(pl.col("n_tokens").cast(pl.Int64), pl.lit(2048)).alias("n_tokens")
    )
    tokens = dict(frame.group_by("source").agg(pl.col("n_tokens").sum()).iter_rows())
    total = sum(tokens.values())
    assert total == report["totals"]["tokens"]
    for s in report["sources"]:
        assert s["realized"] == pytest.approx(tokens[s["name"]] / total)
        assert s["tokens"] == tokens[s["name"]]  # the planner's own count, from the footer
    assert sum(s["target"] for s in report["sources"]) == pytest.approx(1.0)
    for p in report["phases"]:
        part = frame.filter(pl.col("step").is_between(p["start"], p["end"] - 1))
        got = dict(part.group_by("source").agg(pl.col("n_tokens").sum()).iter_rows())
        for s in p["sources"]:
            assert s["realized"] == pytest.approx(got.get(s["name"], 0) / part["n_tokens"].sum())


def test_phases():
    assert phases([], 100) == [(0, 100)]
    assert phases([0, 100, 250], 100) == [(0, 100)]
    assert phases([30, 60], 100) == [(0, 30), (30, 60), (60, 100)]
    # a phase under 1% of the run joins its shorter neighbour
    assert phases([500, 505], 1000) == [(0, 500), (500, 1000)]
    assert phases([500, 505], 1005) == [(0, 505), (505, 1005)]  # a tie: the earlier one
    assert phases([5, 600], 1000) == [(0, 600), (600, 1000)]
    many = phases(list(range(10, 1000, 10)), 1000)
    assert len(many) == 8 and many[0][0] == 0 and many[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in zip(many, many[1:], strict=False))
    assert phases(list(range(1, 5)), 5, max_phases=8, min_fraction=0.0) == [
        (0, 1),
        (1, 2),
        (2, 3),
        (3, 4),
        (4, 5),
    ]


def test_breakpoints_only_inside_the_run(sample):
    footer = PlanReader(sample["plan"]).footer
    assert breakpoints(footer, 64) == [32, 63]
    assert breakpoints(footer, 40) == [32]


def test_report_is_json(sample):
    assert json.loads(json.dumps(sample["report"], allow_nan=False)) == sample["report"]


# --- step ----------------------------------------------------------------------------------------

STEP_COLUMNS = [
    "rank",
    "micro_batch",
    "source",
    "row",
    "file_row",
    "offset",
    "length",
    "n_tokens",
    "cost",
    "cost_units",
]


def expected_slice(sample, step: int, ranks: list[int]) -> list[dict]:
    frame = sample["frame"].filter((pl.col("step") == step) & pl.col("rank").is_in(ranks))
    frame = frame.with_columns(pl.col("n_tokens").cast(pl.Int64))
    # the export names the JSONL byte range byte_offset/byte_length; the step report offset
    frame = frame.rename({"byte_offset": "offset", "byte_length": "length"})
    return frame.select(STEP_COLUMNS).to_dicts()


@pytest.mark.parametrize(("step", "ranks"), [(0, None), (17, [1, 3]), (63, [2])])
def test_step_slice_equals_plan_frame(sample, step, ranks):
    with PlanReader(sample["plan"]) as reader:
        report = step_report(reader, step, ranks)
    shown = ranks or [0, 1, 2, 3]
    assert report["ranks"] == shown and report["step"] == step
    got = [{k: s[k] for k in STEP_COLUMNS} for s in report["samples"]]
    assert got == expected_slice(sample, step, shown)
    manifest = sample["manifest"]
    frame = sample["frame"].filter((pl.col("step") == step) & pl.col("rank").is_in(shown))
    for s, file_id in zip(report["samples"], frame["file_id"], strict=True):
        assert s["file"] == manifest.source(s["source"])["files"][file_id]["path"]
    for total in report["rank_totals"]:
        mine = [s for s in report["samples"] if s["rank"] == total["rank"]]
        assert total["samples"] == len(mine)
        assert total["tokens"] == sum(s["n_tokens"] for s in mine)
        assert total["cost_units"] == sum(s["cost_units"] for s in mine)
        assert total["cost_units"] == sum(m["cost_units"] for m in total["micro_batches"])
        assert len(total["micro_batches"]) == 2


def test_step_totals_match_stats(sample):
    with PlanReader(sample["plan"]) as reader:
        report = step_report(reader, 9)
    loads = [t["cost_units"] for t in report["rank_totals"]]
    assert max(loads) == report["stats"]["max_rank_cost"]
    assert min(loads) == report["stats"]["min_rank_cost"]
    assert sum(loads) == report["stats"]["cost"]
    assert sum(t["tokens"] for t in report["rank_totals"]) == report["stats"]["tokens"]


def test_step_reads_only_the_asked_ranks(sample, monkeypatch):
    calls = []
    original = PlanReader.rank_chunk

    def spy(self, chunk, rank):
        calls.append((chunk, rank))
        return original(self, chunk, rank)

    monkeypatch.setattr(PlanReader, "rank_chunk", spy)
    with PlanReader(sample["plan"]) as reader:
        step_report(reader, 40, [3, 1])
    assert calls == [(2, 1), (2, 3)]


def test_step_errors(sample, tmp_path):
    with PlanReader(sample["plan"]) as reader:
        for step in (-1, 64):
            with pytest.raises(ConfigError, match=rf"--step {step} is outside the plan's 64 steps"):
                step_report(reader, step)
        with pytest.raises(ConfigError, match="--rank 4 is outside the plan's dp_size 4"):
            step_report(reader, 0, [4])
        other = tmp_path / "index"
        shutil.copytree(sample["index"], other)
        manifest = json.loads((other / "manifest.json").read_text())
        manifest["fingerprint"] = "blake2b:" + "0" * 32
        (other / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(DataChangedError, match="differs from the one the plan"):
            step_report(reader, 0, index=other)


def test_detect(sample, tmp_path):
    assert detect(sample["index"]) == "index"
    assert detect(sample["plan"]) == "plan"
    (tmp_path / "notes.txt").write_text("hello")
    for bad, needle in (
        (tmp_path / "notes.txt", "neither"),
        (tmp_path, "neither"),
        (tmp_path / "missing", "no such file"),
    ):
        with pytest.raises(ConfigError, match=needle):
            detect(bad)


def test_summary_helpers_handle_empty_steps():
    from mds.planner.report.common import ratio, summary

    assert ratio(np.array([0, 5]), np.array([0, 4])).tolist() == [1.0, 1.25]
    assert summary(np.array([])) == {k: None for k in ("mean", "min", "median", "p99", "max")}
    assert math.isclose(summary(np.array([1.0, 3.0]))["median"], 2.0)
