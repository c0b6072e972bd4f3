"""End-to-end planning contracts: mix exactness, order, capacity, balance, purity, errors.

Checked on the sample data (sample_data/mds.toml) and on small synthetic indexes, against
independent re-computations from the plan file and from `mds export`'s frame.
"""

from __future__ import annotations

import os
import tomllib
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from plan_builders import (
    SAMPLE_CONFIG,
    ceil_div,
    frame_key,
    ideal_targets,
    plan_config,
    raw_chunk_blocks,
    sample_index,
    sample_plan_config,
    synthetic,
)

import mds.planner.plan.build as plan_mod
from mds.core.planfile_reader import PlanReader
from mds.core.planfile_writer import PlanWriter
from mds.errors import ConfigError, PlanError
from mds.planner.plan.build import build_plan, with_overrides
from mds.planner.plan.chunk import STAT_COLUMNS, Planner
from mds.planner.plan.mixing import MixState
from mds.planner.report.export import plan_frame
from mds.planner.runtime.engine import fork_shares_memory

SAMPLE_WEIGHTS = [s["weight"] for s in tomllib.loads(SAMPLE_CONFIG.read_text())["source"]]


class Planned:
    """A built plan with everything the checks need, computed once."""

    def __init__(self, config, path: Path, **kwargs):
        self.config = config
        self.path = path
        self.summary = build_plan(config, path, **kwargs)
        self.frame = plan_frame(path)
        with PlanReader(path) as r:
            self.footer = r.footer
            self.plan_id = r.plan_id
            self.sections = {name: np.array(r.section(name)) for name in r.sections}
        self.planner = Planner(config)
        self.stats = {c: self.sections["stats"][:, i] for i, c in enumerate(STAT_COLUMNS)}

    def chosen(self):
        """What the mixer chose, per step and source: index rows in stream order."""
        counts, _ = self.planner.mixer.run(self.planner.mixer.start(), self.config.train.steps)
        out = {}
        for s, (pool, stream) in enumerate(
            zip(self.planner.pools, self.planner.streams, strict=True)
        ):
            pos = stream.positions(0, int(counts[:, s].sum()))
            out[pool.name] = np.split(pool.rows[pos], np.cumsum(counts[:, s])[:-1])
        return counts, out


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    index = sample_index(tmp_path_factory)
    out = tmp_path_factory.mktemp("plan")
    return Planned(sample_plan_config(index), out / "plan.mds", workers=1)


# --- tokens-mode and small synthetic plans ----------------------------------------------------

RNG = np.random.default_rng(42)
TOKEN_SOURCES = {
    "short": {
        "lengths": RNG.integers(1, 60, 90).tolist(),
        "weight": [[0, 1.0], [30, 3.0]],
        "meta": {"q": RNG.random(90).round(3).tolist()},
    },
    "long": {
        "lengths": (RNG.pareto(1.0, 40) * 80 + 1).astype(int).clip(1, 1500).tolist(),
        "weight": {"stages": [[0, 2.0], [20, 0.5]]},
        "meta": {"q": RNG.random(40).round(3).tolist()},
    },
    "tiny": {"lengths": [7, 3, 11], "weight": 0.25, "meta": {"q": [0.5, 0.25, 1.0]}},
}
TOKEN_TRAIN = {
    "steps": 40,
    "dp_size": 3,
    "micro_batches": 2,
    "tokens_per_step": 2500,
    "max_tokens_per_micro_batch": 1500,
    "seed": 99,
}


@pytest.fixture(scope="module")
def token_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokens")
    synthetic(root, TOKEN_SOURCES, TOKEN_TRAIN, plan={"chunk_steps": 7})
    return root


@pytest.fixture(scope="module")
def tokens(token_root):
    data = synthetic(token_root, TOKEN_SOURCES, TOKEN_TRAIN, plan={"chunk_steps": 7}, build=False)
    return Planned(plan_config(token_root, data), token_root / "plan.mds")


# --- mix exactness ----------------------------------------------------------------------------


def test_sample_every_step_has_exactly_S_samples(sample):
    per_step = sample.frame.group_by("step").len().sort("step")
    assert per_step["step"].to_list() == list(range(64))
    assert set(per_step["len"].to_list()) == {32}
    assert np.all(sample.stats["samples"] == 32)
    assert sample.summary.samples == 64 * 32 == sample.frame.height


def test_sample_mix_is_within_one_sample_of_the_schedule_integral(sample):
    mixed = sample.sections["source_samples"]
    names = [s["name"] for s in sample.footer["sources"]]
    # the section agrees with the exported samples
    counts = (
        sample.frame.group_by("step", "source")
        .len()
        .pivot(on="source", index="step", values="len")
        .sort("step")
        .fill_null(0)
        .select(names)
        .to_numpy()
    )
    assert np.array_equal(counts, mixed)
    ideal = ideal_targets(SAMPLE_WEIGHTS, 32, 64)
    worst = np.abs(np.cumsum(mixed, axis=0) - ideal).max()
    assert worst <= 1 + 1e-9, worst


def test_tokens_mode_overshoots_by_less_than_one_sample(tokens):
    train = tokens.config.train
    weights = [s["weight"] for s in TOKEN_SOURCES.values()]
    ideal = ideal_targets(weights, train.tokens_per_step, train.steps)
    counts, chosen = tokens.chosen()
    assert np.array_equal(counts, tokens.sections["source_samples"])
    for s, pool in enumerate(tokens.planner.pools):
        stream = tokens.planner.streams[s]
        lens = pool.lengths[stream.positions(0, int(counts[:, s].sum()))]
        cum = np.concatenate([[0], np.cumsum(lens)])
        k = np.cumsum(counts[:, s])
        got = cum[k]
        assert np.all(got >= ideal[:, s] - 1e-6), pool.name
        last = lens[np.maximum(k - 1, 0)]
        assert np.all(np.where(k > 0, got - last < ideal[:, s] + 1e-6, ideal[:, s] <= 1e-9)), (
            pool.name
        )
        assert tokens.footer["sources"][s]["tokens"] == int(cum[-1])
    # and the exported tokens per (step, source) are what the mixer took
    exported = tokens.frame.group_by("step", "source").agg(pl.col("n_tokens").sum())
    total = exported.group_by("source").agg(pl.col("n_tokens").sum())
    assert dict(total.iter_rows()) == {s["name"]: s["tokens"] for s in tokens.footer["sources"]}


# --- order ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["sample", "tokens"])
def test_plan_holds_exactly_what_the_mixer_chose(which, request):
    plan = request.getfixturevalue(which)
    counts, chosen = plan.chosen()
    by_step_source = {
        key: Counter(part["row"].to_list())
        for key, part in plan.frame.group_by("step", "source", maintain_order=True)
    }
    for name, steps in chosen.items():
        for t, rows in enumerate(steps):
            assert by_step_source.get((t, name), Counter()) == Counter(rows.tolist()), (name, t)
    # the whole multiset, too
    assert Counter(zip(plan.frame["source"], plan.frame["row"], strict=True)) == Counter(
        (name, int(r)) for name, steps in chosen.items() for rows in steps for r in rows
    )


@pytest.mark.parametrize("which", ["sample", "tokens"])
def test_each_source_is_walked_epoch_after_epoch(which, request):
    plan = request.getfixturevalue(which)
    counts, _ = plan.chosen()
    for s, (pool, stream) in enumerate(zip(plan.planner.pools, plan.planner.streams, strict=True)):
        n, used = pool.n, int(counts[:, s].sum())
        order = pool.rows[stream.positions(0, used)]
        for e in range(used // n):  # completed epochs hold every eligible row exactly once
            assert sorted(order[e * n : (e + 1) * n].tolist()) == sorted(pool.rows.tolist())
        tail = order[(used // n) * n :]
        assert len(set(tail.tolist())) == len(tail)  # the started epoch has no repeats
        # from the export alone: the steps whose running count stays within one epoch
        # hold distinct rows
        rows = plan.frame.filter(pl.col("source") == pool.name).sort("step")
        cum = np.cumsum(counts[:, s])
        first_epoch = rows.filter(pl.col("step") <= int(np.searchsorted(cum, n, side="right")) - 1)
        assert first_epoch["row"].n_unique() == first_epoch.height


def test_sample_sources_that_wrap_complete_their_epochs(sample):
    epochs = {s["name"]: s for s in sample.footer["sources"]}
    assert epochs["books"]["epochs_started"] == 3 and epochs["books"]["samples"] > 2 * 120
    books = sample.frame.filter(pl.col("source") == "books")
    # every eligible book appears at least twice (two completed epochs), none more than 3 times
    times = books.group_by("row").len()["len"]
    assert times.len() == epochs["books"]["eligible"] and times.min() >= 2 and times.max() <= 3


def test_different_seeds_give_different_orders(sample, tmp_path):
    other = replace(sample.config, train=replace(sample.config.train, seed=1235, steps=4))
    build_plan(other, tmp_path / "p.mds")
    a = frame_key(sample.frame.filter(pl.col("step") < 4))
    b = frame_key(plan_frame(tmp_path / "p.mds"))
    assert not a.equals(b)
    # same seed, same steps: same samples
    same = replace(sample.config, train=replace(sample.config.train, steps=4))
    build_plan(same, tmp_path / "q.mds")
    assert frame_key(plan_frame(tmp_path / "q.mds")).equals(a)


# --- capacity -------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["sample", "tokens"])
def test_micro_batches_respect_capacity(which, request):
    plan = request.getfixturevalue(which)
    cap = plan.config.train.max_tokens_per_micro_batch
    micro = plan.frame.group_by("step", "rank", "micro_batch").agg(pl.col("n_tokens").sum())
    assert micro["n_tokens"].max() <= cap
    assert micro["rank"].max() < plan.config.train.dp_size
    assert micro["micro_batch"].max() < plan.config.train.micro_batches
    assert np.all(plan.stats["max_micro_tokens"] <= cap)
    assert micro.group_by("step").agg(pl.col("n_tokens").max()).sort("step")[
        "n_tokens"
    ].to_list() == [int(x) for x in plan.stats["max_micro_tokens"][plan.stats["samples"] > 0]]


# --- balance ------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["sample", "tokens"])
def test_stats_equal_a_recomputation_from_the_export(which, request):
    plan = request.getfixturevalue(which)
    D, T = plan.config.train.dp_size, plan.config.train.steps
    f = plan.frame
    load = np.zeros((T, D), dtype=np.int64)
    ranks = f.group_by("step", "rank").agg(pl.col("cost_units").sum())
    load[ranks["step"].to_numpy(), ranks["rank"].to_numpy()] = ranks["cost_units"].to_numpy()
    total = load.sum(axis=1)
    biggest = np.zeros(T, dtype=np.int64)
    per_step = f.group_by("step").agg(
        pl.col("cost_units").max(), pl.col("n_tokens").sum(), pl.len()
    )
    steps = per_step["step"].to_numpy()
    biggest[steps] = per_step["cost_units"].to_numpy()
    lb = np.maximum([ceil_div(int(x), D) for x in total], biggest)
    st = plan.stats
    assert np.array_equal(st["cost"], total)
    assert np.array_equal(st["max_rank_cost"], load.max(axis=1))
    assert np.array_equal(st["min_rank_cost"], load.min(axis=1))
    assert np.array_equal(st["lower_bound"], lb)
    assert np.all(st["max_rank_cost"] >= st["lower_bound"])  # sanity: nothing beats the bound
    assert np.all(st["naive_max_rank_cost"] >= st["lower_bound"])
    tokens = np.zeros(T, dtype=np.int64)
    tokens[steps] = per_step["n_tokens"].to_numpy()
    assert np.array_equal(st["tokens"], tokens)
    micro = f.group_by("step", "rank", "micro_batch").agg(pl.col("cost_units").sum())
    mc = np.zeros(T, dtype=np.int64)
    mm = micro.group_by("step").agg(pl.col("cost_units").max())
    mc[mm["step"].to_numpy()] = mm["cost_units"].to_numpy()
    assert np.array_equal(st["max_micro_cost"], mc)


def test_sample_summary(sample):
    s, st = sample.summary, sample.stats
    ratio = st["max_rank_cost"] / st["lower_bound"]
    naive = st["naive_max_rank_cost"] / st["lower_bound"]
    assert s.ratio_mean == round(float(ratio.mean()), 6) and s.ratio_max == round(
        float(ratio.max()), 6
    )
    assert s.naive_ratio_max == round(float(naive.max()), 6)
    assert s.ratio_mean >= 1.0 and s.ratio_max < s.naive_ratio_max
    assert s.speedup_vs_naive == round(
        int(st["naive_max_rank_cost"].sum()) / int(st["max_rank_cost"].sum()), 6
    )
    assert s.speedup_vs_naive > 1.0
    assert s.tokens == int(sample.frame["n_tokens"].sum())
    assert s.bytes == sample.path.stat().st_size
    assert s.plan_id == sample.plan_id
    assert [x["samples"] for x in s.sources] == sample.sections["source_samples"].sum(
        axis=0
    ).tolist()
    assert (s.steps, s.dp_size, s.micro_batches) == (64, 4, 2)
    data = s.to_json()
    assert data["bytes_per_sample"] == round(s.bytes / s.samples, 3)


def test_samples_longer_than_tokens_per_step_refused(tmp_path):
    """A source of samples longer than a step's token budget would plan mostly empty steps,
    each non-empty one 10x over budget: the config is refused instead."""
    train = {
        "steps": 12,
        "dp_size": 2,
        "tokens_per_step": 100,
        "max_tokens_per_micro_batch": 1000,
        "seed": 1,
    }
    data = synthetic(
        tmp_path, {"a": {"lengths": [1000] * 4, "weight": 1.0}}, train, plan={"chunk_steps": 4}
    )
    with pytest.raises(
        ConfigError, match=r"`tokens_per_step` \(100\) is smaller than source 'a' row 0"
    ):
        build_plan(plan_config(tmp_path, data), tmp_path / "p.mds")
    assert not (tmp_path / "p.mds").exists()


# --- purity -----------------------------------------------------------------------------------------


def recorded_state(sections, chunk: int, start: int) -> MixState:
    return MixState(
        start,
        sections["cursor_consumed"][chunk].astype(np.int64).copy(),
        sections["cursor_tokens"][chunk].astype(np.int64).copy(),
        sections["cursor_target"][chunk].astype(np.float64).copy(),
    )


def encode_alone(plan, result, tmp_path: Path) -> list[bytes]:
    """One chunk written on its own with the plan's geometry; its block bytes."""
    with PlanReader(plan.path) as r:
        dp, micro, width = r.dp, r.micro, r.id_width
    path = tmp_path / f"chunk-{result.start}.mds"
    writer = PlanWriter(path, tmp_path / "tmp", dp_size=dp, micro_batches=micro, id_width=width)
    writer.add_chunk(result.start, result.end, result.blocks)
    writer.commit({})
    return raw_chunk_blocks(path)[0]


@pytest.mark.parametrize("which", ["sample", "tokens"])
def test_a_chunk_planned_alone_equals_the_chunk_in_the_plan(which, request, tmp_path):
    plan = request.getfixturevalue(which)
    blocks = raw_chunk_blocks(plan.path)
    bounds = plan.planner.boundaries()
    assert len(blocks) == len(bounds) == len(plan.sections["cursor_consumed"]) - 1
    fresh = Planner(plan.config)  # a new process would build its own
    for c, (a, b) in enumerate(bounds):
        result = fresh.plan_chunk(recorded_state(plan.sections, c, a), b)
        assert (result.start, result.end) == (a, b)
        assert encode_alone(plan, result, tmp_path) == blocks[c], f"chunk {c}"
        rows = slice(a, b)
        assert np.array_equal(result.stats, plan.sections["stats"][rows])
        assert np.array_equal(result.source_samples, plan.sections["source_samples"][rows])


def test_recorded_cursors_are_the_mixing_states(tokens):
    states = tokens.planner.states()
    for key in ("consumed", "tokens", "target"):
        assert np.array_equal(
            np.stack([getattr(s, key) for s in states]), tokens.sections[f"cursor_{key}"]
        )


def test_planning_twice_gives_identical_bytes(sample, tmp_path):
    build_plan(sample.config, tmp_path / "again.mds")
    assert (tmp_path / "again.mds").read_bytes() == sample.path.read_bytes()


def test_two_workers_give_the_same_bytes(sample, tmp_path):
    s = build_plan(sample.config, tmp_path / "w2.mds", workers=2)
    assert (tmp_path / "w2.mds").read_bytes() == sample.path.read_bytes()
    assert s.plan_id == sample.plan_id
    assert s.workers == min(2, os.cpu_count() or 1) and s.notice is None
    assert sample.summary.workers == 1


@pytest.mark.skipif(not fork_shares_memory(), reason="workers are spawned here")
def test_forked_workers_plan_with_the_loaded_index(sample, tmp_path, monkeypatch):
    """The workers share the pools this process loaded: none builds a Planner of its own."""

    def refuse(run, config):
        raise AssertionError("a worker loaded the index again")

    monkeypatch.setattr(plan_mod, "_init_worker", refuse)
    config = replace(sample.config, chunk_steps=7)
    build_plan(config, tmp_path / "one.mds", workers=1)
    build_plan(config, tmp_path / "two.mds", workers=2)
    assert (tmp_path / "two.mds").read_bytes() == (tmp_path / "one.mds").read_bytes()


def test_a_single_chunk_plan_says_it_could_not_use_the_workers(sample, tmp_path):
    config = replace(sample.config, chunk_steps=sample.config.train.steps)
    s = build_plan(config, tmp_path / "one.mds", workers=2)
    assert s.workers == 1
    assert s.notice is not None and "1 of 2 workers used" in s.notice and "chunk_steps" in s.notice
    assert s.to_json()["notice"] == s.notice
    assert build_plan(config, tmp_path / "again.mds", workers=1).notice is None
    assert (tmp_path / "one.mds").read_bytes() == (tmp_path / "again.mds").read_bytes()


@pytest.mark.parametrize("chunk_steps", [1, 5, 64, 1000])
def test_chunk_steps_do_not_change_the_samples_or_their_ranks(sample, tmp_path, chunk_steps):
    config = replace(sample.config, chunk_steps=chunk_steps)
    build_plan(config, tmp_path / "p.mds")
    other = plan_frame(tmp_path / "p.mds")
    assert frame_key(other).equals(frame_key(sample.frame))
    cols = ["step", "rank", "micro_batch", "source", "row"]
    assert other.select(cols).sort(cols).equals(sample.frame.select(cols).sort(cols))
    with PlanReader(tmp_path / "p.mds") as r:
        assert len(r.chunks) == ceil_div(64, chunk_steps)
        assert np.array_equal(r.section("stats"), sample.sections["stats"])


@pytest.mark.parametrize("chunk_steps", [1, 3, 40])
def test_chunk_steps_in_tokens_mode(tokens, token_root, tmp_path, chunk_steps):
    config = replace(tokens.config, chunk_steps=chunk_steps)
    build_plan(config, tmp_path / "p.mds")
    other = plan_frame(tmp_path / "p.mds")
    cols = ["step", "rank", "micro_batch", "source", "row"]
    assert other.select(cols).sort(cols).equals(tokens.frame.select(cols).sort(cols))


def test_overrides(sample, tmp_path):
    cfg = with_overrides(sample.config, steps=3, dp_size=8)
    s = build_plan(cfg, tmp_path / "p.mds")
    assert (s.steps, s.dp_size, s.samples) == (3, 8, 96)
    assert plan_frame(tmp_path / "p.mds")["rank"].max() == 7
    with pytest.raises(ConfigError, match="--steps must be >= 1, got 0"):
        with_overrides(sample.config, steps=0)
    with pytest.raises(ConfigError, match="--dp-size must be >= 1"):
        with_overrides(sample.config, dp_size=0)
    with pytest.raises(ConfigError, match="--dp-size 33 exceeds samples_per_step = 32"):
        with_overrides(sample.config, dp_size=33)


def test_micro_batch_and_step_size_overrides(sample, tmp_path):
    cfg = with_overrides(sample.config, steps=2, micro_batches=4, samples_per_step=48)
    assert (cfg.train.micro_batches, cfg.train.samples_per_step) == (4, 48)
    s = build_plan(cfg, tmp_path / "p.mds")
    assert (s.steps, s.micro_batches, s.samples) == (2, 4, 96)
    with PlanReader(tmp_path / "p.mds") as reader:  # recorded as if written in [train]
        train = reader.footer["config"]["train"]
        assert (train["micro_batches"], train["samples_per_step"]) == (4, 48)
        assert reader.micro == 4
    # the same plan as a config that says so
    written = replace(
        sample.config,
        train=replace(sample.config.train, steps=2, micro_batches=4, samples_per_step=48),
    )
    build_plan(written, tmp_path / "q.mds")
    assert (tmp_path / "p.mds").read_bytes() == (tmp_path / "q.mds").read_bytes()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"micro_batches": 0}, "--micro-batches must be >= 1, got 0"),
        ({"samples_per_step": 0}, "--samples-per-step must be >= 1, got 0"),
        ({"samples_per_step": 3}, "`samples_per_step` (3) must be at least `dp_size` (4)"),
        ({"micro_batches": 2**20}, "--micro-batches: dp_size = 4 x micro_batches"),
    ],
)
def test_micro_batch_and_step_size_overrides_are_checked(sample, overrides, message):
    with pytest.raises(ConfigError) as err:
        with_overrides(sample.config, **overrides)
    assert message in str(err.value)


def test_samples_per_step_override_needs_a_step_in_samples(tokens):
    with pytest.raises(ConfigError, match="sizes a step in tokens"):
        with_overrides(tokens.config, samples_per_step=8)


def test_dp_size_override_rechecks_the_token_capacity(tokens):
    # 3 ranks x 2 micro-batches x 1500 tokens hold 2500; 1 rank holds 3000, still fine
    assert with_overrides(tokens.config, dp_size=1).train.dp_size == 1
    small = replace(tokens.config, train=replace(tokens.config.train, tokens_per_step=4000))
    with pytest.raises(ConfigError) as err:
        with_overrides(small, dp_size=1)
    assert "--dp-size 1: tokens_per_step (4000) exceeds the step's capacity" in str(err.value)
    assert "= 3000" in str(err.value)


# --- cost model -------------------------------------------------------------------------------------


def test_sample_cost_model(sample):
    layers, h, V = 12, 768, 2011
    a, b = 72 * layers * h * h + 6 * h * V, 6 * layers * h
    assert sample.footer["config"]["cost"] == {"a": a, "b": b, "origin": "model"}
    L = sample.frame["n_tokens"].cast(pl.Float64).to_numpy()
    np.testing.assert_allclose(sample.frame["cost"].to_numpy(), a * L + b * L * L, rtol=1e-12)
    scale = sample.footer["cost_scale"]
    peak = max(float(p.raw_costs.max()) for p in sample.planner.pools)
    assert scale == pytest.approx(2.0**40 / peak)
    units = np.maximum(np.rint(sample.frame["cost"].to_numpy() * scale), 1).astype(np.int64)
    assert np.array_equal(sample.frame["cost_units"].to_numpy(), units)


def test_sql_cost_expression_changes_the_balancing_inputs(tokens, token_root, tmp_path):
    data = synthetic(
        token_root, TOKEN_SOURCES, TOKEN_TRAIN, cost={"expr": "q * 1000 + 1"}, build=False
    )
    config = plan_config(token_root, data)
    build_plan(config, tmp_path / "p.mds")
    frame = plan_frame(tmp_path / "p.mds", token_root / "index")
    np.testing.assert_allclose(frame["cost"].to_numpy(), frame["q"].to_numpy() * 1000 + 1)
    # same samples (the mix does not depend on cost), different costs and balance
    assert (
        frame_key(frame)
        .select("step", "source", "row")
        .sort(pl.all())
        .equals(frame_key(tokens.frame).select("step", "source", "row").sort(pl.all()))
    )
    assert not np.allclose(
        frame.sort("step", "source", "row")["cost"].to_numpy(),
        tokens.frame.sort("step", "source", "row")["cost"].to_numpy(),
    )
    with PlanReader(tmp_path / "p.mds") as r:
        stats = r.section("stats")
        assert r.footer["config"]["cost"] == {"expr": "q * 1000 + 1"}
    cost = frame.group_by("step").agg(pl.col("cost_units").sum()).sort("step")
    assert (
        stats[cost["step"].to_numpy(), STAT_COLUMNS.index("cost")].tolist()
        == cost["cost_units"].to_list()
    )


# --- errors ------------------------------------------------------------------------------------------

SMALL = {
    "a": {"lengths": [5, 9, 2000, 40, 0, 17], "weight": 1.0, "meta": {"v": [1, 2, 3, 4, 5, 6]}},
    "b": {"lengths": [3, 4, 5, 6], "weight": 1.0, "meta": {"v": [0, 1, 2, 3]}},
}
SMALL_TRAIN = {
    "steps": 6,
    "dp_size": 2,
    "samples_per_step": 4,
    "max_tokens_per_micro_batch": 1000,
    "seed": 3,
}


@pytest.fixture(scope="module")
def small_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    synthetic(root, SMALL, SMALL_TRAIN)
    return root


def small(root, sources=None, cost=None, **train):
    data = synthetic(root, SMALL, SMALL_TRAIN, cost=cost, build=False)
    for table in data["source"]:
        table.update((sources or {}).get(table["name"], {}))
    return plan_config(root, data, **train)


def plan_error(config, tmp_path, kind=PlanError) -> str:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    with pytest.raises(kind) as err:
        build_plan(config, out / "p.mds")
    assert list(out.iterdir()) == []  # nothing written, no temporary file left
    return str(err.value)


def test_overlong_error(small_root, tmp_path):
    msg = plan_error(small(small_root), tmp_path)
    assert "source 'a' row 2: 2000 tokens exceed max_tokens_per_micro_batch = 1000" in msg


def test_overlong_drop(small_root, tmp_path):
    s = build_plan(small(small_root, overlong="drop"), tmp_path / "p.mds")
    a = s.sources[0]
    assert (a["name"], a["dropped_overlong"], a["truncated"], a["eligible"]) == ("a", 1, 0, 4)
    frame = plan_frame(tmp_path / "p.mds")
    assert 2 not in frame.filter(pl.col("source") == "a")["row"].to_list()
    assert 4 not in frame.filter(pl.col("source") == "a")["row"].to_list()  # 0 tokens


def test_overlong_truncate(small_root, tmp_path):
    cfg = small(small_root, overlong="truncate", steps=8)
    s = build_plan(cfg, tmp_path / "p.mds")
    a = s.sources[0]
    assert (a["dropped_overlong"], a["truncated"], a["eligible"]) == (0, 1, 5)
    frame = plan_frame(tmp_path / "p.mds")
    long = frame.filter((pl.col("source") == "a") & (pl.col("row") == 2))
    assert long.height >= 1 and long["n_tokens"].to_list()[0] == 2000  # the index's count
    # its cost is that of a 1000-token sample, and capacity holds with capped lengths
    capped = frame.with_columns(pl.min_horizontal("n_tokens", pl.lit(1000)).alias("eff"))
    assert (
        capped.group_by("step", "rank", "micro_batch").agg(pl.col("eff").sum())["eff"].max() <= 1000
    )
    c = cfg.cost
    assert long["cost"].to_list()[0] == pytest.approx(c.a * 1000 + c.b * 1000**2)


def test_all_weights_zero_at_some_step(small_root, tmp_path):
    going = {"weight": [[0, 1.0], [3, 0.0]]}
    msg = plan_error(small(small_root, {"a": going, "b": going}, overlong="drop"), tmp_path)
    assert "all source weights are 0 at step 3" in msg


def test_source_in_the_mix_but_not_in_the_index(small_root, tmp_path):
    sources = {**SMALL, "c": {"lengths": [1], "weight": 1.0}}
    data = synthetic(small_root, sources, SMALL_TRAIN, build=False)
    msg = plan_error(plan_config(small_root, data, overlong="drop"), tmp_path, ConfigError)
    assert "source 'c' is in the mix but not in the index" in msg and "(it has a, b)" in msg


def test_exhausted_source(small_root, tmp_path):
    cfg = small(small_root, {"b": {"max_epochs": 1}}, overlong="drop")
    msg = plan_error(cfg, tmp_path)
    # b gives 2 samples a step; its 4 samples last steps 0 and 1
    assert "source 'b' runs out at step 2" in msg and "max_epochs = 1" in msg
    build_plan(small(small_root, {"b": {"max_epochs": 3}}, overlong="drop"), tmp_path / "ok.mds")


def test_weighted_source_filtered_to_nothing(small_root, tmp_path):
    msg = plan_error(small(small_root, {"b": {"filter": "v > 100"}}, overlong="drop"), tmp_path)
    assert "source 'b' has weight > 0 but no samples" in msg


@pytest.mark.parametrize(
    ("sources", "cost", "message"),
    [
        ({"a": {"filter": "v >> 2"}}, None, "source 'a': `filter`: not a valid SQL expression"),
        (
            {"b": {"filter": "missing = 1"}},
            None,
            "source 'b': `filter`: 'missing = 1' uses an unknown column",
        ),
        (None, {"expr": "v *"}, "[cost] `expr` (source 'a'): not a valid SQL expression"),
        (None, {"expr": "v - 2"}, "[cost] `expr` (source 'a'): gives -1.0 for index row 0"),
        (
            None,
            {"expr": "nope + 1"},
            "[cost] `expr` (source 'a'): 'nope + 1' uses an unknown column",
        ),
    ],
)
def test_sql_errors(small_root, tmp_path, sources, cost, message):
    msg = plan_error(small(small_root, sources, cost, overlong="drop"), tmp_path, ConfigError)
    assert message in msg


def test_unpackable_step_leaves_no_file(small_root, tmp_path):
    # a's only eligible sample (40 tokens) twice a step, plus two of b's, cannot fit in
    # 2 ranks x 1 micro-batch of 41 tokens; this fails while chunks are written
    cfg = small(small_root, {"a": {"filter": "n_tokens = 40"}}, max_tokens_per_micro_batch=41)
    msg = plan_error(cfg, tmp_path)
    assert "cannot pack" in msg and "step " in msg


def test_index_must_exist(tmp_path):
    data = synthetic(tmp_path, {"a": {"lengths": [1], "weight": 1}}, SMALL_TRAIN, build=False)
    from mds.errors import IndexFormatError

    with pytest.raises(IndexFormatError, match="not an mds index"):
        build_plan(plan_config(tmp_path, data), tmp_path / "p.mds")
