"""src/mds/cli/inspect_text.py: sparklines, bars and the line naming a plan's cost model."""

from __future__ import annotations

import pytest

from mds.cli.inspect_text import bar, cost_text, cost_unit, number, percent, resample, sparkline
from mds.cli.svg import nice_range
from mds.planner.plan.cost_label import cost_model


def test_drawing_helpers():
    assert sparkline(list(range(8)), 0, 7) == "▁▂▃▄▅▆▇█"
    assert sparkline([5.0, 5.0], 5.0, 5.0) == "▁▁"
    assert len(sparkline([0.5] * 1000, 0, 1)) == 60
    assert resample([1.0, 3.0, 5.0, 7.0], 2) == [2.0, 6.0]
    assert bar(4, 8, 10) == "█████" and bar(0, 8) == "" and bar(1, 8, 1) == "▏"
    lo, hi, ticks = nice_range(1.0, 2.58)
    assert (lo, hi) == (1.0, 3.0) and ticks == [1.0, 1.5, 2.0, 2.5, 3.0]


@pytest.mark.parametrize(
    ("cost", "kind", "text"),
    [
        ({"a": 1.0, "b": 0.5, "origin": "default"}, "default", "default (FLOP formula, causal, hidden 4096): a = 1, b = 0.5"),
        ({"a": 2.0, "b": 0.5, "origin": "given"}, "typed", "typed a, b: a = 2, b = 0.5"),
        ({"a": 2.0, "b": 0.5, "origin": "given", "c": 3.0}, "typed", "typed a, b: a = 2, b = 0.5, c = 3 per micro-batch"),
        ({"a": 2.0, "b": 0.5, "origin": "given", "c": 3.0, "d": 0.7}, "typed", "typed a, b: a = 2, b = 0.5, d = 0.7 per sample, c = 3 per micro-batch"),
        ({"expr": "n_tokens * 2"}, "expr", "SQL expression: n_tokens * 2"),
    ],
)  # fmt: skip
def test_cost_text(cost, kind, text):
    assert cost_model(cost) == kind
    assert cost_text(cost, kind) == text


def test_numbers_and_units():
    assert percent(None) == "-" and percent(0.12345) == "12.35%"
    assert number(None) == "-" and number(1.5) == "1.5000" and number(2.0, ".3g") == "2"
    assert cost_unit({"expr": "n_tokens * 2"}) == "n_tokens * 2"
    assert cost_unit({"a": 1, "b": 2, "origin": "model"}) == "FLOPs"
    assert cost_unit({"a": 1, "b": 2, "d": 3}) == "a*L + b*L^2 + d"
    assert cost_unit({"a": 1, "b": 2}) == "a*L + b*L^2"
