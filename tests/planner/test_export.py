"""`plan_frame` / `export_plan`: one row per planned sample, joined with its index row."""

from __future__ import annotations

import shutil

import numpy as np
import polars as pl
import pytest
from plan_builders import plan_config, plan_slots, sample_index, sample_plan_config, synthetic

from mds.executor.errors import DataChangedError, IndexFormatError, PlanError
from mds.planner.export import export_plan, plan_frame
from mds.planner.index.manifest import read_manifest, source_frame
from mds.planner.plan import build_plan

FIRST = ["step", "rank", "micro_batch", "source", "row", "file", "file_id", "file_row"]


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    index = sample_index(tmp_path_factory)
    out = tmp_path_factory.mktemp("export") / "plan.mds"
    build_plan(sample_plan_config(index), out)
    return index, out, plan_frame(out)


def test_columns_and_order(sample):
    _, _, frame = sample
    assert frame.columns[:8] == FIRST
    assert frame.columns[8:13] == ["offset", "length", "n_tokens", "cost", "cost_units"]
    assert set(frame.columns[13:]) == {"lang", "quality", "score", "repo_lang"}
    assert frame.schema["step"] == pl.Int64 and frame.schema["row"] == pl.Int64
    assert frame.schema["cost"] == pl.Float64 and frame.schema["cost_units"] == pl.Int64
    keys = frame.select("step", "rank", "micro_batch")
    assert keys.equals(keys.sort("step", "rank", "micro_batch"))
    assert (
        frame.null_count()[FIRST + ["n_tokens", "cost", "cost_units"]].sum_horizontal().item() == 0
    )


def test_rows_follow_the_plan_file(sample):
    index, plan, frame = sample
    manifest = read_manifest(index)
    bases = {}
    base = 0
    for s in manifest.sources:
        bases[s["name"]] = base
        base += s["rows"]
    gids = (frame["row"] + frame["source"].replace_strict(bases, return_dtype=pl.Int64)).to_list()
    # file order is (chunk, rank, step, micro-batch); the frame's is (step, rank, micro-batch),
    # keeping the file's order inside a micro-batch
    slots = sorted(plan_slots(plan), key=lambda s: s[:3])
    assert [s[:3] for s in slots] == list(frame.select("step", "rank", "micro_batch").iter_rows())
    assert gids == [g for *_, g in slots]


def test_joined_columns_equal_the_index_rows(sample):
    index, _, frame = sample
    manifest = read_manifest(index)
    for name in ("web", "forum", "math"):
        part = frame.filter(pl.col("source") == name)
        table = source_frame(manifest, name).with_row_index("row").collect()
        cols = [c for c in table.columns if c != "row"]
        expected = table[part["row"].to_list()].select(cols)
        assert part.select(cols).equals(expected), name
    forum = frame.filter(pl.col("source") == "forum")
    assert forum["offset"].null_count() == 0 and forum["length"].min() > 0
    assert frame.filter(pl.col("source") == "web")["offset"].null_count() > 0


def test_export_plan_writes_parquet(sample, tmp_path):
    _, plan, frame = sample
    out = tmp_path / "deep" / "plan.parquet"
    rows = export_plan(plan, out)
    assert rows == frame.height == 64 * 32
    assert pl.read_parquet(out).equals(frame)
    assert sorted(p.name for p in out.parent.iterdir()) == ["plan.parquet"]  # no temp left


def test_plan_and_index_can_move_together(sample, tmp_path):
    index, _, frame = sample
    shutil.copytree(index, tmp_path / "a" / "index")
    build_plan(sample_plan_config(tmp_path / "a" / "index"), tmp_path / "a" / "plans" / "p.mds")
    shutil.move(tmp_path / "a", tmp_path / "b")  # the plan stores the index path relative to itself
    assert plan_frame(tmp_path / "b" / "plans" / "p.mds").equals(frame)


def test_index_override(sample, tmp_path):
    index, plan, frame = sample
    copy = tmp_path / "copy"
    shutil.copytree(index, copy)
    assert plan_frame(plan, copy).equals(frame)


def test_a_different_index_is_refused(sample, tmp_path):
    _, plan, _ = sample
    synthetic(
        tmp_path,
        {"web": {"lengths": [1, 2], "weight": 1}},
        {"steps": 1, "dp_size": 1, "samples_per_step": 1, "max_tokens_per_micro_batch": 10},
    )
    with pytest.raises(DataChangedError) as err:
        plan_frame(plan, tmp_path / "index")
    msg = str(err.value)
    assert "index fingerprint" in msg and "differs from the one the plan was made from" in msg


def test_missing_index(sample, tmp_path):
    _, plan, _ = sample
    with pytest.raises(IndexFormatError, match="not an mds index"):
        plan_frame(plan, tmp_path / "nowhere")


def test_corrupt_plan(sample, tmp_path):
    _, plan, _ = sample
    bad = tmp_path / "bad.mds"
    data = bytearray(plan.read_bytes())
    data[100] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(PlanError, match="checksum mismatch"):
        plan_frame(bad, sample[0])


TRAIN = {
    "steps": 6,
    "dp_size": 2,
    "samples_per_step": 4,
    "max_tokens_per_micro_batch": 100,
    "seed": 1,
}


def test_truncated_samples_cost_their_capped_length(tmp_path):
    data = synthetic(
        tmp_path,
        {"a": {"lengths": [500, 10, 20], "weight": 1}},
        {**TRAIN, "overlong": "truncate", "micro_batches": 2},
        cost={"a": 2.0, "b": 0.5},
    )
    build_plan(plan_config(tmp_path, data), tmp_path / "p.mds")
    frame = plan_frame(tmp_path / "p.mds")
    long = frame.filter(pl.col("row") == 0)
    assert long.height > 0
    assert set(long["n_tokens"].to_list()) == {500}
    assert set(long["cost"].to_list()) == {2.0 * 100 + 0.5 * 100**2}
    assert set(long["cost_units"].to_list()) == {2**40}  # the largest cost


def test_constant_cost_expression(tmp_path):
    data = synthetic(
        tmp_path,
        {"a": {"lengths": [5, 10, 20], "weight": 1}, "b": {"lengths": [7], "weight": 1}},
        TRAIN,
        cost={"expr": "1"},
    )
    build_plan(plan_config(tmp_path, data), tmp_path / "p.mds")
    frame = plan_frame(tmp_path / "p.mds")
    assert set(frame["cost"].to_list()) == {1.0}
    assert set(frame["cost_units"].to_list()) == {2**40}
    # every sample costs the same, so each rank gets half of each step's samples
    per_rank = frame.group_by("step", "rank").len()["len"]
    assert set(per_rank.to_list()) == {2}


def test_metadata_of_sources_without_a_column_is_null(tmp_path):
    data = synthetic(
        tmp_path,
        {
            "a": {"lengths": [5, 6], "weight": 1, "meta": {"tag": ["x", "y"]}},
            "b": {"lengths": [7], "weight": 1},
        },
        TRAIN,
    )
    build_plan(plan_config(tmp_path, data), tmp_path / "p.mds")
    frame = plan_frame(tmp_path / "p.mds")
    assert frame.columns[-1] == "tag"
    assert (
        frame.filter(pl.col("source") == "b")["tag"].null_count()
        == frame.filter(pl.col("source") == "b").height
    )
    tags = frame.filter(pl.col("source") == "a").select("row", "tag").unique().sort("row")
    assert tags.rows() == [(0, "x"), (1, "y")]
    assert np.all(frame["cost_units"].to_numpy() >= 1)
