"""Context parallelism in the plan: the [train] keys, the footer's CP settings, the CP stats
(recomputed here from the plan's blocks with src/mds/core/cp_layout.py) and the layout's
properties."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_builders import plan_config, synthetic, train_table

from mds.core.cp_layout import SLACK_BITS, SPLIT, cp_layout, rank_work, split_work, whole_work
from mds.core.planfile_reader import PlanReader
from mds.errors import ConfigError
from mds.planner.plan.build import build_plan
from mds.planner.plan.config import DEFAULT_CP_SPLIT_FROM, plan_config_from_dict
from mds.planner.plan.cp import CP_STAT_COLUMNS, contiguous_rank_work
from mds.planner.report.plan import plan_report


def _doc(train: dict, cost: dict | None = None) -> dict:
    data = {
        "source": [{"name": "a", "path": "a/*", "count": "n", "weight": 1.0}],
        "train": train_table(**train),
    }
    if cost is not None:
        data["cost"] = cost
    return data


def _parse(tmp_path: Path, train: dict, cost: dict | None = None):
    return plan_config_from_dict(_doc(train, cost), base=tmp_path)


def test_cp_keys_defaults_and_canonical(tmp_path: Path) -> None:
    plain = _parse(tmp_path, {})
    assert (plain.train.cp_size, plain.train.cp_split_from, plain.train.cp_linear) == (
        1,
        None,
        None,
    )
    assert not any(k.startswith("cp_") for k in plain.canonical()["train"])
    # cp_size = 1 written out is the same config as none
    assert _parse(tmp_path, {"cp_size": 1}).canonical() == plain.canonical()
    cfg = _parse(tmp_path, {"cp_size": 4}, {"a": 3.0, "b": 0.5})
    train = cfg.canonical()["train"]
    assert (train["cp_size"], train["cp_split_from"], train["cp_linear"]) == (
        4,
        DEFAULT_CP_SPLIT_FROM,
        6,
    )
    model = _parse(
        tmp_path, {"cp_size": 2, "cp_split_from": 4}, {"model": {"layers": 2, "hidden": 64}}
    )
    assert model.train.cp_linear == round((72 * 2 * 64 * 64) / (6 * 2 * 64))  # 12 * hidden
    default = _parse(tmp_path, {"cp_size": 2})
    assert default.train.cp_linear == 6 * 4096  # a = 1, b = 1 / 24576


@pytest.mark.parametrize(
    ("train", "cost", "message"),
    [
        ({"cp_size": 0}, None, r"\[train\]: `cp_size` must be an integer >= 1, got 0"),
        ({"cp_size": 2.0}, None, r"`cp_size` must be an integer >= 1, got 2.0"),
        ({"cp_split_from": 100}, None, r"`cp_split_from` needs `cp_size` > 1"),
        (
            {"cp_size": 4, "cp_split_from": 0},
            None,
            r"`cp_split_from` must be an integer >= 1, got 0",
        ),
        (
            {"cp_size": 2},
            {"expr": "n_tokens"},
            r"`cp_size = 2` needs a cost of the form a\*L \+ b\*L\^2",
        ),
        ({"cp_size": 2}, {"a": 1.0, "b": 0.0}, r"`cp_size = 2` needs \[cost\] `b` > 0"),
        ({"cp_size": 2}, {"a": 1e30, "b": 1e-30}, r"past int64's 2\^62 margin"),
        ({"cp_sise": 2}, None, r"cp_size"),  # a typo names the key it meant
    ],
)
def test_cp_config_errors_name_the_key(tmp_path: Path, train, cost, message) -> None:
    with pytest.raises(ConfigError, match=message):
        _parse(tmp_path, train, cost)


# --- the layout ----------------------------------------------------------------------------

lengths_st = st.lists(
    st.one_of(st.integers(0, 64), st.integers(0, 5000), st.integers(0, 200_000)), max_size=12
)


@settings(max_examples=300, deadline=None)
@given(lengths_st, st.sampled_from([2, 3, 4, 8]), st.integers(0, 20_000), st.integers(0, 100_000))
def test_layout_places_every_sample_evenly_and_deterministically(lengths, cp, split_from, linear):
    split_from = max(split_from, 2 * cp)
    L = np.array(lengths, dtype=np.int64)
    layout = np.array(cp_layout(L, cp, split_from, linear), dtype=np.int64)
    assert layout.shape == L.shape
    assert ((layout == SPLIT) | ((layout >= 0) & (layout < cp))).all()  # every sample placed
    assert (layout[L >= split_from] == SPLIT).all()
    # a split sample's work is the same on every CP rank: the head-tail pair of chunks
    for n in L[layout == SPLIT].tolist():
        c = -(-n // (2 * cp))
        pairs = [
            c * i * c + c * (c + 1) // 2 + c * (2 * cp - 1 - i) * c + c * (c + 1) // 2
            for i in range(cp)
        ]
        assert len(set(pairs)) == 1
        assert int(split_work(np.array([n]), cp, linear)[0]) == linear * 2 * c + 2 * pairs[0]
    work = rank_work(lengths, layout.tolist(), cp, linear)
    assert sum(work) >= int(whole_work(L, linear).sum())  # splitting never saves work
    assert cp_layout(list(lengths), cp, split_from, linear) == layout.tolist()  # deterministic
    # never more than 2^-SLACK_BITS busier than head-tail everywhere
    everywhere = sum(split_work(n, cp, linear) for n in lengths)
    assert max(work, default=0) <= everywhere + (everywhere >> SLACK_BITS)


def test_short_samples_stay_whole_and_a_lone_large_one_is_split():
    many = [1000] * 64
    assert SPLIT not in cp_layout(many, 8, 8192, 4096)
    assert cp_layout([6000, 100, 100], 2, 8192, 4096)[0] == SPLIT


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 100_000), max_size=20),
    st.sampled_from([2, 4, 8]),
    st.integers(0, 50_000),
)
def test_contiguous_pieces_add_up_to_the_whole_sample(lengths, cp, linear):
    L = np.array(lengths, dtype=np.int64)
    per_rank = contiguous_rank_work(L, cp, linear)
    assert np.array_equal(per_rank.sum(axis=1), whole_work(L, linear))
    even = L % cp == 0  # pieces of equal size: later ones attend to more keys
    assert (np.diff(per_rank, axis=1)[even] >= 0).all()


# --- the stats, recomputed from the plan's blocks -------------------------------------------


def _cp_plan(tmp_path: Path, **train):
    rng = np.random.default_rng(5)
    lengths = np.exp(rng.uniform(math.log(16), math.log(4000), 400)).astype(int).tolist()
    data = synthetic(
        tmp_path,
        {"long": {"lengths": lengths, "weight": 1.0}},
        train_table(
            steps=12,
            dp_size=3,
            micro_batches=2,
            samples_per_step=18,
            max_tokens_per_micro_batch=8000,
        ),
        cost={"a": 2.0, "b": 0.001},
    )
    config = plan_config(tmp_path, data, **train)
    out = tmp_path / "plan.mds"
    summary = build_plan(config, out)
    return config, out, summary, np.array(lengths)


def _recompute(reader: PlanReader, cp: int, split_from: int, linear: int) -> np.ndarray:
    """CP_STAT_COLUMNS per step, from each rank's block (tokens from the fetch records)."""
    D, M = reader.dp, reader.micro
    rows = []
    per_rank = [[reader.rank_chunk(c, r) for c in range(len(reader.chunks))] for r in range(D)]
    for step in range(reader.steps):
        chunk = reader.chunk_of(step)
        times = {k: [0] * D for k in ("mds", "ht", "contig")}
        ratios = {k: [] for k in ("mds", "ht", "contig")}
        split = padding = 0
        every = []
        for r in range(D):
            block = per_rank[r][chunk]
            t = step - block.step_start
            flat = block.counts.reshape(-1)
            start = int(flat[: t * M].sum())
            for m in range(M):
                n = int(block.counts[t, m])
                L = block.fetch.tokens[start : start + n].astype(np.int64)
                start += n
                every.extend(L.tolist())
                if n == 0:
                    continue
                layout = np.array(cp_layout(L, cp, split_from, linear), dtype=np.int64)
                work = {
                    "mds": np.array(rank_work(L, layout, cp, linear)),
                    "ht": np.full(cp, split_work(L, cp, linear).sum()),
                    "contig": contiguous_rank_work(L, cp, linear).sum(axis=0),
                }
                for k, w in work.items():
                    times[k][r] += int(w.max())
                    ratios[k].append(w.max() * cp / w.sum())
                cut = L[layout == SPLIT]
                split += len(cut)
                padding += int((-(-cut // (2 * cp)) * 2 * cp - cut).sum())
        w = whole_work(np.array(every, dtype=np.int64), linear)
        bound = max(-(-int(w.sum()) // (D * cp)), -(-int(w.max(initial=0)) // cp))
        ppm = [
            round(1e6 * float(np.mean(ratios[k]))) if ratios[k] else 1_000_000
            for k in ("mds", "ht", "contig")
        ]
        rows.append(
            [max(times["mds"]), bound, max(times["ht"]), max(times["contig"]), *ppm, split, padding]
        )
    return np.array(rows, dtype=np.int64)


@pytest.mark.parametrize("cp", [2, 4])
def test_stats_equal_a_recomputation_from_the_blocks(tmp_path: Path, cp: int) -> None:
    config, out, summary, _ = _cp_plan(tmp_path, cp_size=cp, cp_split_from=1000)
    reader = PlanReader(out)
    footer = reader.footer
    train = footer["config"]["train"]
    assert (train["cp_size"], train["cp_split_from"], train["cp_linear"]) == (cp, 1000, 2000)
    columns = footer["stats_columns"]
    assert columns[-len(CP_STAT_COLUMNS) :] == list(CP_STAT_COLUMNS)
    stats = reader.section("stats")[:, -len(CP_STAT_COLUMNS) :]
    expect = _recompute(reader, cp, 1000, 2000)
    # the imbalance means are floats: allow one millionth of rounding
    assert np.array_equal(np.delete(stats, [4, 5, 6], axis=1), np.delete(expect, [4, 5, 6], axis=1))
    assert np.abs(stats[:, 4:7] - expect[:, 4:7]).max() <= 1
    assert (stats[:, 5] == 1_000_000).all()  # head-tail everywhere: every CP rank the same
    assert (stats[:, 0] >= stats[:, 1]).all() and (stats[:, 2] >= stats[:, 1]).all()
    assert (stats[:, 3] >= stats[:, 1]).all() and (stats[:, 7] > 0).any()
    assert summary.cp is not None and summary.cp["ratio_mean"] >= 1.0
    report = plan_report(reader)["cp"]
    assert report["cp_size"] == cp and report["samples_split"] == int(stats[:, 7].sum())


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_split_from_1_splits_every_sample(tmp_path: Path, cp: int) -> None:
    """`cp_split_from = 1` (what Megatron-core's CP needs): every sample of every
    micro-batch is split head-tail, samples shorter than 2 x cp and short ones that would
    otherwise stay whole included."""
    lengths = [1, 2, 3, 5, 7, 16, 40, 100, 300, 2000] * 4
    data = synthetic(
        tmp_path,
        {"mixed": {"lengths": lengths, "weight": 1.0}},
        train_table(
            steps=4, dp_size=2, micro_batches=2, samples_per_step=10, max_tokens_per_micro_batch=4000
        ),
        cost={"a": 2.0, "b": 0.001},
    )
    out = tmp_path / "plan.mds"
    build_plan(plan_config(tmp_path, data, cp_size=cp, cp_split_from=1), out)
    reader = PlanReader(out)
    train = reader.footer["config"]["train"]
    assert train["cp_split_from"] == 1
    seen = set()
    for r in range(reader.dp):
        for c in range(len(reader.chunks)):
            block = reader.rank_chunk(c, r)
            start = 0
            for n in block.counts.reshape(-1).tolist():
                L = block.fetch.tokens[start : start + n].astype(np.int64).tolist()
                start += n
                seen.update(L)
                assert cp_layout(L, cp, 1, train["cp_linear"]) == [SPLIT] * n
    assert {1, 2, 3} <= seen  # samples shorter than 2 x cp were planned, and split
    stats = reader.section("stats")
    split = stats[:, reader.footer["stats_columns"].index("cp_split_samples")]
    assert (split == 10).all()  # every sample of every step
    # with the default, the short samples stay whole
    default = tmp_path / "default.mds"
    build_plan(plan_config(tmp_path, data, cp_size=cp), default)
    dstats = PlanReader(default).section("stats")
    assert (dstats[:, reader.footer["stats_columns"].index("cp_split_samples")] < 10).all()


def test_a_plan_without_cp_keeps_its_bytes(tmp_path: Path) -> None:
    """cp_size = 1 written out plans the same bytes as no CP key, without CP columns or
    report entries; the golden test (tests/golden) checks the sample plan's bytes."""
    config, out, summary, _ = _cp_plan(tmp_path)
    again = tmp_path / "again.mds"
    build_plan(replace(config, train=replace(config.train, cp_size=1)), again)
    assert out.read_bytes() == again.read_bytes()
    reader = PlanReader(out)
    assert not any(c.startswith("cp_") for c in reader.footer["stats_columns"])
    assert not any(k.startswith("cp_") for k in reader.footer["config"]["train"])
    assert summary.cp is None and "cp" not in summary.to_json()
    assert "cp" not in plan_report(reader)
