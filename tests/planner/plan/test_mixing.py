"""Mixing: per-step source counts follow the weight schedules exactly (within one sample)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_builders import ideal_targets, make_pools, mix_only_config

from mds.errors import ConfigError, PlanError
from mds.planner.plan.mixing import Mixer
from mds.planner.plan.stream import SourceStream

EPS = 1e-9
BASE = Path("/nonexistent-mds-test-root")  # nothing is read from disk


def mixer(weights: dict, lengths: dict | None = None, *, max_epochs=None, seed=5, **train):
    lengths = lengths or {name: [10] * 50 for name in weights}
    config = mix_only_config(weights, BASE, seed=seed, **train)
    pools = make_pools(lengths)
    for p in pools:
        p.max_epochs = max_epochs
    streams = [SourceStream(p, seed) for p in pools]
    return Mixer(config, pools, streams)


# --- samples_per_step --------------------------------------------------------------------------


def schedule(low: float = 0.0, high: float = 5.0):
    """A random `weight` value (constant, points list, `points` or `stages` table)."""
    weight = st.floats(low, high, allow_nan=False)
    points = st.lists(
        st.tuples(st.integers(0, 50), weight), min_size=1, max_size=4, unique_by=lambda p: p[0]
    ).map(lambda ps: [[s, w] for s, w in sorted(ps)])
    return st.one_of(
        weight, points, points.map(lambda p: {"stages": p}), points.map(lambda p: {"points": p})
    )


def check_samples_mix(schedules, size, steps):
    weights = {f"s{i}": w for i, w in enumerate(schedules)}
    m = mixer(weights, dp_size=1, samples_per_step=size, steps=steps)
    counts, state = m.run(m.start(), steps)
    assert counts.shape == (steps, len(weights))
    assert np.all(counts >= 0)
    assert np.all(counts.sum(axis=1) == size)  # exactly S samples every step
    actual = np.cumsum(counts, axis=0)
    ideal = ideal_targets(schedules, size, steps)
    assert state.step == steps
    assert np.array_equal(state.consumed, actual[-1])
    np.testing.assert_allclose(state.target, ideal[-1], rtol=1e-9)
    worst = np.abs(actual - ideal).max()
    assert worst <= 1 + 1e-6, f"a cumulative count is {worst:.4f} samples off its target"


@settings(max_examples=40, deadline=None)
@given(
    schedules=st.lists(st.one_of(schedule(1.0, 5.0), st.just(0.0)), min_size=1, max_size=5),
    extra=st.integers(0, 60),
    steps=st.integers(1, 60),
)
def test_samples_mode_stays_within_one_sample_of_the_integral(schedules, extra, steps):
    """Quotas of at least one sample per source and step."""
    schedules = [*schedules, 1.0]  # a positive constant keeps every step's total > 0
    check_samples_mix(schedules, 5 * len(schedules) + extra, steps)


@settings(max_examples=60, deadline=None)
@given(
    schedules=st.lists(st.one_of(schedule(0.0, 100.0), st.just(0.0)), min_size=1, max_size=7),
    size=st.integers(1, 9),
    steps=st.integers(1, 80),
)
def test_samples_mode_within_one_sample_for_any_weights(schedules, size, steps):
    """The contract in general: tiny quotas, weights that jump to 0 and back, S below the
    number of sources. Earliest-deadline-first keeps every lag within one sample."""
    schedules = [*schedules, 0.01]  # keeps every step's total > 0
    check_samples_mix(schedules, size, steps)


@pytest.mark.parametrize(
    ("schedules", "size", "steps"),
    [
        ([1.0, 1.0, 1.0, 100.0, 100.0], 3, 42),  # per-step rounding drifted 1.069 at step 41
        (
            [{"stages": [[0, 3.0], [2, 0.0]]}] * 3 + [10.0, 10.0],
            3,
            10,
        ),  # weights dropping to 0: per-step rounding drifted 1.069 at step 9
    ],
)
def test_samples_mode_within_one_sample_for_small_quotas(schedules, size, steps):
    check_samples_mix(schedules, size, steps)


def test_samples_mode_exact_shares():
    m = mixer({"a": 3, "b": 1}, samples_per_step=8, steps=4)
    counts, _ = m.run(m.start(), 4)
    assert counts.tolist() == [[6, 2]] * 4
    m = mixer({"a": 1, "b": 1, "c": 1}, samples_per_step=4, steps=3)
    counts, _ = m.run(m.start(), 3)
    assert np.cumsum(counts, axis=0)[-1].tolist() == [4, 4, 4]


def test_zero_weight_source_gets_nothing():
    m = mixer({"a": 1, "b": 0, "c": [[0, 0.0], [3, 1.0]]}, samples_per_step=10, steps=8)
    counts, _ = m.run(m.start(), 8)
    assert counts[:, 1].sum() == 0
    assert counts[0, 2] == 0  # weight 0 at step 0


@settings(max_examples=20, deadline=None)
@given(
    cuts=st.lists(st.integers(1, 39), max_size=5, unique=True).map(sorted),
    tokens=st.booleans(),
)
def test_running_in_pieces_equals_running_at_once(cuts, tokens):
    weights = {"a": [[0, 1.0], [40, 0.1]], "b": {"stages": [[0, 0.2], [20, 2.0]]}, "c": 0.3}
    lengths = {"a": [5, 50, 500], "b": [1, 2, 3, 400, 7], "c": [64] * 4}
    size = (
        {"tokens_per_step": 1500, "samples_per_step": None} if tokens else {"samples_per_step": 13}
    )
    m = mixer(weights, lengths, steps=40, max_tokens_per_micro_batch=1000, **size)
    whole, final = m.run(m.start(), 40)
    state, parts = m.start(), []
    for b in [*cuts, 40]:
        given, snapshot = state, state.copy()
        counts, state = m.run(given, b)
        parts.append(counts)
        for key in ("step", "consumed", "tokens", "target"):  # the input state is not mutated
            assert np.array_equal(getattr(given, key), getattr(snapshot, key))
    assert np.array_equal(np.concatenate(parts), whole)
    for key in ("consumed", "tokens", "target"):
        assert np.array_equal(getattr(state, key), getattr(final, key))


def test_run_does_not_mutate_its_input_state():
    m = mixer({"a": 1, "b": 2}, samples_per_step=6, steps=5)
    start = m.start()
    m.run(start, 5)
    assert start.step == 0 and start.consumed.tolist() == [0, 0] and start.target.tolist() == [0, 0]


# --- tokens_per_step ---------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    schedules=st.lists(schedule(), min_size=1, max_size=3),
    lengths=st.lists(
        st.lists(st.integers(1, 900), min_size=1, max_size=12), min_size=4, max_size=4
    ),
    size=st.integers(1, 4000),
    steps=st.integers(1, 40),
)
def test_tokens_mode_overshoots_by_less_than_one_sample(schedules, lengths, size, steps):
    schedules = [*schedules, 1.0]
    names = [f"s{i}" for i in range(len(schedules))]
    m = mixer(
        dict(zip(names, schedules, strict=True)),
        dict(zip(names, lengths, strict=False)),
        samples_per_step=None,
        tokens_per_step=size,
        steps=steps,
    )
    counts, state = m.run(m.start(), steps)
    ideal = ideal_targets(schedules, size, steps)
    consumed = np.cumsum(counts, axis=0)
    for s, stream in enumerate(m.streams):
        lens = stream.pool.lengths[stream.positions(0, int(consumed[-1, s]))]
        cum = np.concatenate([[0], np.cumsum(lens)])
        for t in range(steps):
            k = int(consumed[t, s])
            got, target = int(cum[k]), ideal[t, s]
            assert got >= target - 1e-6 * max(1.0, target), (s, t, got, target)
            if k:  # before its last sample, the source was still below target
                assert got - int(lens[k - 1]) < target + 1e-6 * max(1.0, target), (s, t)
            else:
                assert target <= 1e-6
        assert int(state.tokens[s]) == int(cum[-1])
    assert np.array_equal(state.consumed, consumed[-1])


def test_tokens_mode_steps_can_be_empty():
    m = mixer({"a": 1.0}, {"a": [1000]}, samples_per_step=None, tokens_per_step=100, steps=12)
    counts, state = m.run(m.start(), 12)
    assert counts[:, 0].tolist() == [1] + [0] * 9 + [1, 0]
    assert state.tokens.tolist() == [2000]


# --- errors ------------------------------------------------------------------------------------


def test_all_weights_zero_at_a_step():
    m = mixer({"a": [[0, 1.0], [5, 0.0]], "b": {"stages": [[0, 2.0], [4, 0.0]]}}, steps=10)
    counts, _ = m.run(m.start(), 5)  # fine up to step 4
    assert counts.shape == (5, 2)
    with pytest.raises(
        PlanError, match=r"all source weights are 0 at step 5; at least one must be > 0"
    ):
        m.run(m.start(), 10)


def test_source_without_samples_but_with_weight():
    m = mixer({"a": 1, "b": [[0, 0.0], [3, 1.0]]}, {"a": [1, 2], "b": []}, steps=10)
    m.run(m.start(), 1)  # weight 0 so far: fine
    with pytest.raises(PlanError, match=r"source 'b' has weight > 0 but no samples"):
        m.run(m.start(), 10)


def test_source_without_samples_and_zero_weight_is_fine():
    for size in ({"samples_per_step": 4}, {"samples_per_step": None, "tokens_per_step": 40}):
        m = mixer({"a": 1, "b": 0}, {"a": [1, 2], "b": []}, steps=6, **size)
        counts, _ = m.run(m.start(), 6)
        assert counts[:, 1].sum() == 0


@pytest.mark.parametrize("tokens", [False, True])
def test_exhausted_source_names_source_and_step(tokens):
    size = {"samples_per_step": None, "tokens_per_step": 40} if tokens else {"samples_per_step": 4}
    # a: 5 samples of 10 tokens, half the mix: 2 samples (20 tokens) a step
    m = mixer({"a": 1, "b": 1}, {"a": [10] * 5, "b": [10] * 100}, max_epochs=1, steps=10, **size)
    m.pools[1].max_epochs = None
    m.run(m.start(), 2)  # 4 of 5 samples: fine
    with pytest.raises(PlanError) as err:
        m.run(m.start(), 10)
    msg = str(err.value)
    assert "source 'a' runs out at step 2" in msg
    assert "max_epochs = 1 passes over its 5 samples" in msg


def test_exhaustion_step_inside_a_later_range():
    m = mixer({"a": 1}, {"a": [10] * 5}, max_epochs=2, samples_per_step=2, steps=10)
    _, state = m.run(m.start(), 3)  # 6 consumed
    with pytest.raises(PlanError, match="runs out at step 5"):  # 12 > 10 after step 5
        m.run(state, 10)


@pytest.mark.parametrize("weights", [{"a": 1e308, "b": 1e308}, {"a": 1.7e308, "b": 1.0}])
def test_overflowing_weights_are_a_config_error_without_a_numpy_warning(weights):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ConfigError, match=r"\[\[source\]\] #\d \('\w'\): `weight`"):
            mixer(weights, samples_per_step=8, steps=4)
