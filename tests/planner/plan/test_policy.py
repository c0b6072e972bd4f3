"""The online mixing policies as pure functions: the one-window lag, the floor, the
checks on a policy's weights, and determinism (same log, same weights, bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mds.core.signal_log import SignalLog, window_signal
from mds.errors import PlanError
from mds.planner.plan.online_config import OnlineSpec
from mds.planner.plan.policy import GRID, apply_floor, check_weights, on_grid, weights_for

NAMES = ("a", "b", "c")
INITIAL = np.array([0.5, 0.3, 0.2])


def log_of(losses, counts=(10, 10, 10)):
    log = SignalLog("p", NAMES, 4)
    for k, loss in enumerate(losses):
        log.append(window_signal(k, 4 * k, 4 * k + 4, loss, counts))
    return log


DOREMI = OnlineSpec("doremi", 4, 0.01, step_size=1.0, smoothing=0.1,
                    reference=(("a", 1.0), ("b", 1.0), ("c", 1.0)))
BANDIT = OnlineSpec("bandit", 4, 0.01, step_size=0.1, exploration=0.1, seed=3)


def test_windows_0_and_1_keep_the_config_weights():
    weights = weights_for(DOREMI, NAMES, INITIAL, log_of([]), 1)
    assert np.array_equal(weights[0], INITIAL) and np.array_equal(weights[1], INITIAL)


def test_doremi_moves_weight_to_the_source_with_the_largest_excess():
    log = log_of([[11.0, 1.0, 1.0]])  # mean loss: a 1.1 over its reference, b and c 0.1
    w = weights_for(DOREMI, NAMES, INITIAL, log, 2)[2]
    expected = INITIAL * np.exp([0.1, 0.0, 0.0])
    expected = 0.9 * expected / expected.sum() + 0.1 / 3
    np.testing.assert_allclose(w, expected, rtol=1e-8)  # rounded to 2^-32 (on_grid)
    assert w[0] > INITIAL[0]


def test_weights_on_the_grid_hide_last_bit_differences_of_exp():
    w = np.array([0.1, 0.2, 0.7]) * np.exp([1.0, 2.0, 3.0])
    nudged = np.nextafter(w, np.inf)  # what another CPU's exp might give
    assert np.array_equal(on_grid(w), on_grid(nudged))
    assert (on_grid(w) / GRID == np.round(on_grid(w) / GRID)).all()


def test_doremi_with_a_huge_excess_does_not_overflow():
    w = weights_for(DOREMI, NAMES, INITIAL, log_of([[1e308, 1.0, 1.0]], (1, 1, 1)), 2)[2]
    assert np.isfinite(w).all() and w.sum() == pytest.approx(1.0)


def test_the_bandit_is_seeded_and_rewards_the_drawn_source():
    log = log_of([[30.0, 10.0, 10.0], [30.0, 10.0, 10.0], [30.0, 10.0, 10.0]])
    one = weights_for(BANDIT, NAMES, INITIAL, log, 4)
    two = weights_for(BANDIT, NAMES, INITIAL, log, 4)
    assert all(np.array_equal(x, y) for x, y in zip(one, two, strict=True))
    other = weights_for(OnlineSpec("bandit", 4, 0.01, 0.1, exploration=0.1, seed=4),
                        NAMES, INITIAL, log, 4)
    assert any(not np.array_equal(x, y) for x, y in zip(one, other, strict=True))
    assert all(w.min() >= 0.1 / 3 - 1e-12 for w in one[2:])  # exploration's share


@given(st.lists(st.floats(0, 1e6), min_size=3, max_size=3).filter(lambda w: sum(w) > 0),
       st.floats(0, 1 / 3))
def test_the_floor_holds_and_the_weights_add_to_one(weights, floor):
    w = apply_floor(np.array(weights), floor)
    assert w.sum() == pytest.approx(1.0)
    assert (w >= floor - 1e-12).all()


def test_the_floor_keeps_the_ratios_above_it():
    w = apply_floor(np.array([0.0, 0.3, 0.6]), 0.1)
    assert w[0] == pytest.approx(0.1) and w[2] / w[1] == pytest.approx(2.0)


@pytest.mark.parametrize(
    "raw, message",
    [
        ([1, 2, 3], "must be a mapping"),
        ({"a": 1, "b": 1}, "no weight for source 'c'"),
        ({"a": 1, "b": 1, "c": 1, "d": 1}, "'d', which is not a source"),
        ({"a": -1, "b": 1, "c": 1}, "must be finite and >= 0, got -1"),
        ({"a": float("nan"), "b": 1, "c": 1}, "must be finite"),
        ({"a": "1", "b": 1, "c": 1}, "must be a number"),
        ({"a": 0, "b": 0, "c": 0}, "at least one must be > 0"),
    ],
)
def test_a_policy_s_weights_are_checked(raw, message):
    with pytest.raises(PlanError, match=message):
        check_weights(raw, NAMES, "policy")


def test_a_log_too_short_for_the_window_is_refused():
    with pytest.raises(PlanError, match="log holds 1 windows"):
        weights_for(DOREMI, NAMES, INITIAL, log_of([[1.0, 1.0, 1.0]]), 3)


def test_a_callable_that_cannot_be_imported_is_one_line():
    spec = OnlineSpec("no_such_module_here:f", 4, 0.0)
    with pytest.raises(PlanError, match="cannot import 'no_such_module_here'"):
        weights_for(spec, NAMES, INITIAL, log_of([[1.0, 1.0, 1.0]]), 2)
