"""`plan_frame` / `export_plan`: one row per planned sample, joined with its index row."""

from __future__ import annotations

import shutil
from collections import Counter

import numpy as np
import polars as pl
import pytest
from plan_builders import plan_config, plan_slots, sample_index, sample_plan_config, synthetic

from mds.core.planfile_reader import PlanReader
from mds.errors import ConfigError, DataChangedError, IndexFormatError, PlanError
from mds.planner.index.tables import read_manifest, source_frame
from mds.planner.plan.build import build_plan
from mds.planner.plan.chunk import Planner
from mds.planner.report.export import EXPORT_COLUMNS, export_plan, plan_frame

FIRST = ["step", "rank", "micro_batch", "sample_id", "source", "row", "epoch", "file"]
# DuckDB 2.0's reserved keywords (duckdb_keywords() where keyword_category = 'reserved'):
# no export column may need quoting there.
DUCKDB_RESERVED = set(
    "all analyse analyze and any array as asc asymmetric both case cast check collate column "
    "constraint create default deferrable desc describe distinct do else end except false "
    "fetch for foreign from group having in initially intersect into lambda lateral leading "
    "limit not null offset on only or order pivot pivot_longer pivot_wider placing primary "
    "qualify references returning select show some summarize symmetric table then to "
    "trailing true union unique unpivot using variadic when where window with".split()
)


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    index = sample_index(tmp_path_factory)
    out = tmp_path_factory.mktemp("export") / "plan.mds"
    build_plan(sample_plan_config(index), out)
    return index, out, plan_frame(out)


def test_columns_and_order(sample):
    _, _, frame = sample
    assert frame.columns[:8] == FIRST
    assert frame.columns[8:16] == [
        "file_id", "file_row", "byte_offset", "byte_length",
        "n_tokens", "planned_tokens", "cost", "cost_units",
    ]  # fmt: skip
    assert list(EXPORT_COLUMNS) == frame.columns[:16]
    assert set(frame.columns[16:]) == {"lang", "quality", "score", "repo_lang"}
    assert not set(EXPORT_COLUMNS) & DUCKDB_RESERVED
    for name, dtype in frame.schema.items():
        assert dtype in (pl.Int64, pl.Float64, pl.String), (name, dtype)  # no narrow ints
    keys = frame.select("step", "rank", "micro_batch")
    assert keys.equals(keys.sort("step", "rank", "micro_batch"))
    never_null = FIRST + ["n_tokens", "planned_tokens", "cost", "cost_units"]
    assert frame.null_count()[never_null].sum_horizontal().item() == 0
    gid = frame["sample_id"] - frame["row"]
    assert gid.n_unique() == frame["source"].n_unique()  # sample_id = source base + row


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
        if name == "web":  # its `offset` counts values in a row group: not exported
            table = table.drop("offset")
        table = table.rename({"offset": "byte_offset", "length": "byte_length"}, strict=False)
        cols = [c for c in table.columns if c != "row"]
        expected = table[part["row"].to_list()].select(cols)
        assert part.select(cols).equals(expected), name
    forum = frame.filter(pl.col("source") == "forum")
    assert forum["byte_offset"].null_count() == 0 and forum["byte_length"].min() > 0
    assert frame.filter(pl.col("source") == "web")["byte_offset"].null_count() > 0


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
    assert set(long["planned_tokens"].to_list()) == {100}
    assert set(long["cost"].to_list()) == {2.0 * 100 + 0.5 * 100**2}
    assert set(long["cost_units"].to_list()) == {2**40}  # the largest cost


def test_per_sample_constant_is_in_every_cost(tmp_path):
    data = synthetic(
        tmp_path,
        {"a": {"lengths": [5, 10, 20], "weight": 1}, "b": {"lengths": [7], "weight": 1}},
        TRAIN,
        cost={"a": 2.0, "b": 0.5, "d": 100.0},
    )
    build_plan(plan_config(tmp_path, data), tmp_path / "p.mds")
    with PlanReader(tmp_path / "p.mds") as reader:
        assert reader.footer["config"]["cost"]["d"] == 100.0
    frame = plan_frame(tmp_path / "p.mds")
    want = {2.0 * n + 0.5 * n * n + 100.0 for n in frame["n_tokens"].to_list()}
    assert set(frame["cost"].to_list()) == want
    assert max(frame["cost_units"].to_list()) == 2**40  # the largest cost, d included


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


# --- epochs and filters ------------------------------------------------------------------


def expected_epochs(config, plan) -> Counter:
    """(step, sample_id, epoch) of every draw, recomputed from the planner's streams and the
    plan's per-step source counts: stream position q is epoch q div eligible."""
    planner = Planner(config)
    with PlanReader(plan) as reader:
        counts = np.asarray(reader.section("source_samples"), dtype=np.int64)
        start = np.asarray(reader.section("cursor_consumed"), dtype=np.int64)[0]
        first = reader.first_step
    out: Counter = Counter()
    for s, (pool, stream) in enumerate(zip(planner.pools, planner.streams, strict=True)):
        q = int(start[s])
        for t, n in enumerate(counts[:, s].tolist()):
            gids = pool.base + pool.rows[stream.positions(q, n)]
            epochs = np.arange(q, q + n) // pool.n
            out.update(zip([first + t] * n, gids.tolist(), epochs.tolist(), strict=True))
            q += n
    return out


TINY = {  # eligible sets smaller than a step's draws: epochs cross inside most steps
    "a": {"lengths": [5, 6, 7], "weight": 0.5},
    "b": {"lengths": [8, 9, 10, 11, 12], "weight": 0.3},
    "c": {"lengths": [3 + i for i in range(40)], "weight": 0.2},
}


def test_epochs_follow_the_streams(tmp_path):
    data = synthetic(
        tmp_path,
        TINY,
        {**TRAIN, "steps": 12, "samples_per_step": 16, "max_tokens_per_micro_batch": 1000},
    )
    config = plan_config(tmp_path, data)
    build_plan(config, tmp_path / "p.mds")
    frame = plan_frame(tmp_path / "p.mds")
    assert frame["epoch"].null_count() == 0
    got = Counter(frame.select("step", "sample_id", "epoch").iter_rows())
    assert got == expected_epochs(config, tmp_path / "p.mds")
    assert frame.filter(pl.col("source") == "a")["epoch"].max() >= 20


@pytest.mark.parametrize(
    ("at_step", "boundary"),
    [(3, True), (5, False)],  # 'a' (3 samples, 8 a step) has drawn 24 = 8 epochs at step 3
)
def test_epochs_of_a_replanned_plan(tmp_path, at_step, boundary):
    sources = {
        **TINY,  # 'b' with a filter: its eligible samples are not its rows
        "b": {
            "lengths": [8, 9, 10, 11, 12, 13, 14],
            "weight": 0.3,
            "meta": {"q": [1, 0, 1, 1, 0, 1, 1]},
            "filter": "q >= 1",
        },
    }
    data = synthetic(
        tmp_path,
        sources,
        {**TRAIN, "steps": 12, "samples_per_step": 16, "max_tokens_per_micro_batch": 1000},
    )
    build_plan(plan_config(tmp_path, data), tmp_path / "p.mds")
    with PlanReader(tmp_path / "p.mds") as reader:
        drawn = reader.section("source_samples")[:at_step, 0].sum()
    assert (drawn % 3 == 0) == boundary
    data["source"][2]["weight"] = 0.6
    config = plan_config(tmp_path, data)
    build_plan(config, tmp_path / "q.mds", parent=tmp_path / "p.mds", at_step=at_step)
    frame = plan_frame(tmp_path / "q.mds")
    assert frame["step"].min() == at_step
    assert frame["epoch"].null_count() == 0
    got = Counter(frame.select("step", "sample_id", "epoch").iter_rows())
    assert got == expected_epochs(config, tmp_path / "q.mds")
    # every step crosses an epoch of 'a': its samples span two or three epochs
    assert frame.filter(pl.col("source") == "a").group_by("step").agg(
        pl.col("epoch").n_unique()
    )["epoch"].min() >= 2


def _tiny_plan(tmp_path, steps=12):
    data = synthetic(
        tmp_path,
        TINY,
        {**TRAIN, "steps": steps, "samples_per_step": 16, "max_tokens_per_micro_batch": 1000},
    )
    config = plan_config(tmp_path, data)
    build_plan(config, tmp_path / "p.mds")
    return config, tmp_path / "p.mds"


def test_epochs_of_a_plan_with_skipped_steps_are_the_old_plans(tmp_path):
    """A --skip-steps plan copies the old steps around the window: their samples keep the
    epochs the old plan's export gives them, though the streams jump over the window."""
    config, old = _tiny_plan(tmp_path)
    build_plan(config, tmp_path / "q.mds", parent=old, at_step=3, skipped=[(5, 7)])
    kept = plan_frame(old).filter(pl.col("step").is_between(3, 4) | (pl.col("step") >= 7))
    before = Counter(kept.select("step", "sample_id", "epoch").iter_rows())
    after = plan_frame(tmp_path / "q.mds")
    assert after["epoch"].null_count() == 0
    copied = after.filter(pl.col("step") < 10).with_columns(
        pl.when(pl.col("step") >= 5).then(pl.col("step") + 2).otherwise(pl.col("step")).alias("step")
    )
    got = Counter(copied.select("step", "sample_id", "epoch").iter_rows())
    assert got == before


def test_epochs_of_a_plan_with_excluded_documents_count_only_the_kept(tmp_path):
    """With documents excluded, an epoch of a source is its kept samples: each drawn once
    per epoch, and a full epoch holds exactly those."""
    from mds.core.index_manifest import index_sources
    from mds.planner.plan.exclude import Exclusion

    config, old = _tiny_plan(tmp_path)
    b = next(s for s in index_sources(read_manifest(config.index)) if s["name"] == "b")
    gone = np.array([b["base"] + 1], dtype=np.int64)  # 4 of b's 5 samples stay
    exclusion = Exclusion(gone, {"b": 1}, "list.csv", "0" * 32, 1)
    build_plan(config, tmp_path / "q.mds", parent=old, at_step=3, exclusion=exclusion)
    with PlanReader(tmp_path / "q.mds") as reader:
        entry = next(s for s in reader.footer["sources"] if s["name"] == "b")
    assert (entry["eligible"], entry["epoch_size"]) == (5, 4)
    frame = plan_frame(tmp_path / "q.mds").filter(pl.col("source") == "b")
    assert frame["epoch"].null_count() == 0 and int(gone[0]) not in frame["sample_id"].to_list()
    per_epoch = frame.group_by("epoch").agg(pl.len(), pl.col("sample_id").n_unique().alias("u"))
    assert (per_epoch["len"] == per_epoch["u"]).all() and (per_epoch["len"] <= 4).all()
    inner = per_epoch.filter(
        (pl.col("epoch") > frame["epoch"].min()) & (pl.col("epoch") < frame["epoch"].max())
    )
    assert inner.height >= 3 and (inner["len"] == 4).all()


def test_steps_and_rank_filters(sample, tmp_path):
    index, plan, frame = sample
    part = plan_frame(plan, steps=(3, 7), ranks=[1, 2])
    expected = frame.filter(pl.col("step").is_between(3, 6) & pl.col("rank").is_in([1, 2]))
    assert part.equals(expected)
    rows = export_plan(plan, tmp_path / "part.parquet", steps=(3, 7), ranks=[1])
    assert rows == expected.filter(pl.col("rank") == 1).height
    with pytest.raises(ConfigError, match="--steps 3:999 is not inside the plan's steps 0:64"):
        plan_frame(plan, steps=(3, 999))
    with pytest.raises(ConfigError, match="--rank 9 is not a DP rank of the plan"):
        plan_frame(plan, ranks=[9])
