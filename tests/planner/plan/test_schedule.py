"""Weight schedules: constant, piecewise-linear points and stages; their parse errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_builders import schedule_weights

from mds.errors import ConfigError
from mds.planner.plan.schedule import WeightSchedule, parse_schedule

STEPS = np.arange(0, 40)


def test_constant_holds_everywhere():
    s = parse_schedule(0.25, "w")
    assert s.kind == "constant"
    assert s.at(np.array([0, 5, 10**9])).tolist() == [0.25] * 3
    assert parse_schedule(3, "w").at(np.array([1])).dtype == np.float64


def test_linear_interpolates_and_holds_the_ends():
    s = parse_schedule([[10, 1.0], [20, 3.0]], "w")
    assert s.kind == "linear"
    assert s.at(np.array([0, 10, 15, 20, 100])).tolist() == [1.0, 1.0, 2.0, 3.0, 3.0]


def test_points_table_is_linear():
    s = parse_schedule({"points": [[0, 0.0], [4, 1.0]]}, "w")
    assert s.kind == "linear"
    assert s.at(np.array([1, 2, 3])).tolist() == [0.25, 0.5, 0.75]


def test_stages_are_step_functions():
    s = parse_schedule({"stages": [[5, 1.0], [10, 0.0], [12, 2.0]]}, "w")
    assert s.kind == "stages"
    got = s.at(np.arange(0, 15)).tolist()
    # before the first point the first weight holds
    assert got == [1.0] * 10 + [0.0, 0.0] + [2.0] * 3


def test_single_point_list():
    s = parse_schedule([[3, 0.5]], "w")
    assert s.at(np.array([0, 3, 9])).tolist() == [0.5] * 3


@pytest.mark.parametrize(
    "raw",
    [0.3, 2, [[0, 1.0], [7, 0.0]], {"points": [[1, 2.0], [3, 1.5]]}, {"stages": [[0, 1], [5, 2]]}],
)
def test_describe_round_trips(raw):
    s = parse_schedule(raw, "w")
    again = parse_schedule(s.describe(), "w")
    assert again == s
    assert np.array_equal(again.at(STEPS), s.at(STEPS))


point_lists = st.lists(
    st.tuples(st.integers(0, 60), st.floats(0, 10, allow_nan=False)),
    min_size=1,
    max_size=6,
    unique_by=lambda p: p[0],
).map(lambda ps: [[s, w] for s, w in sorted(ps)])


@settings(max_examples=30, deadline=None)
@given(points=point_lists, kind=st.sampled_from(["list", "points", "stages"]))
def test_schedules_match_an_independent_evaluation(points, kind):
    raw = points if kind == "list" else {kind: points}
    s = parse_schedule(raw, "w")
    np.testing.assert_allclose(s.at(STEPS), schedule_weights(raw, STEPS), rtol=1e-12, atol=1e-12)
    for step, weight in points:  # every point is hit exactly
        assert s.at(np.array([step]))[0] == pytest.approx(weight)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([[5, 1.0], [3, 2.0]], "strictly increasing, got 3 after 5"),
        ([[5, 1.0], [5, 2.0]], "strictly increasing"),
        ({"stages": [[0, 1.0], [0, 2.0]]}, "w.stages[1]: steps must be strictly increasing"),
        (-0.5, "must be >= 0"),
        ([[0, -1.0]], "w[0]: weight must be >= 0"),
        ({"points": [[0, 1.0], [4, -2]]}, "w.points[1]: weight must be >= 0"),
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        (True, "must be a number"),
        ("0.5", "must be a number"),
        ([], "non-empty list"),
        ([[0, 1.0, 2.0]], "w[0] must be a [step, weight] pair"),
        ([0, 1.0], "w[0] must be a [step, weight] pair"),
        ([[-1, 1.0]], "step must be an integer >= 0"),
        ([[1.5, 1.0]], "step must be an integer >= 0"),
        ([[True, 1.0]], "step must be an integer >= 0"),
        ([[0, "x"]], "weight must be a finite number"),
        ({"points": [[0, 1]], "stages": [[0, 1]]}, "exactly one key"),
        ({"ramp": [[0, 1]]}, "exactly one key, `points` or `stages`; got ramp"),
        ({}, "got none"),
        ({"stages": 3}, "w.stages must be a non-empty list"),
    ],
)
def test_bad_schedules(raw, message):
    with pytest.raises(ConfigError) as err:
        parse_schedule(raw, "w")
    assert message in str(err.value)


def test_schedule_is_frozen():
    s = WeightSchedule("constant", (0,), (1.0,))
    with pytest.raises(AttributeError):
        s.kind = "linear"  # type: ignore[misc]
