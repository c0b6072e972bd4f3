"""src/mds/cli/svg.py: round ticks with short labels, and the charts' frame (titles, legend,
margins sized from the labels, the plan's line drawn last)."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mds.cli.svg import axis_ticks, bar_chart, line_chart, stacked_area_chart, text_width

NS = "{http://www.w3.org/2000/svg}"


def is_round(step: float) -> bool:
    mantissa = step / 10 ** math.floor(math.log10(step))
    return any(math.isclose(mantissa, m) for m in (1, 2, 5))


@pytest.mark.parametrize(
    ("lo", "hi", "kw", "labels"),
    [
        (0, 1.169e14, {}, ["0", "50T", "100T", "150T"]),
        (0, 52_860, {}, ["0", "20k", "40k", "60k"]),
        (0, 1.2e6, {}, ["0", "0.5M", "1.0M", "1.5M"]),
        (1.0, 1.08, {}, ["1.00", "1.02", "1.04", "1.06", "1.08"]),
        (1.0, 2.58, {}, ["1.0", "1.5", "2.0", "2.5", "3.0"]),
        (0, 0.31, {"percent": True}, ["0%", "10%", "20%", "30%", "40%"]),
        (0, 0.0123, {"percent": True}, ["0%", "0.5%", "1.0%", "1.5%"]),
        (0, 63, {"inside": True, "integer": True}, ["0", "20", "40", "60"]),
        (0, 3, {"inside": True, "integer": True}, ["0", "1", "2", "3"]),
        (-3e-5, 2e-5, {}, ["-40µ", "-20µ", "0", "20µ"]),
        (100_000, 100_100, {}, ["100.0k", "100.1k"]),  # longer labels: a coarser step
        (0, 5e22, {}, ["0", "2e22", "4e22", "6e22"]),  # beyond the prefixes
        (0, 3e-14, {}, ["0", "1e-14", "2e-14", "3e-14"]),
    ],
)
def test_axis_ticks_examples(lo, hi, kw, labels):
    assert axis_ticks(lo, hi, **kw).labels == labels


def test_degenerate_ranges():
    assert axis_ticks(5.0, 5.0).labels == ["5.0", "5.2", "5.4", "5.6"]
    assert axis_ticks(0.0, 0.0).labels[0] == "0"
    assert axis_ticks(float("nan"), 1.0).labels[-1] == "1.0"


@settings(max_examples=300, deadline=None)
@given(
    st.floats(-1e25, 1e25, allow_nan=False),
    st.floats(1e-6, 1e3, allow_nan=False),
    st.floats(0, 1, exclude_max=True),
    st.booleans(),
)
def test_axis_ticks_are_round_cover_and_short(lo, relative_span, share, percent):
    hi = lo + relative_span * max(abs(lo), 1e-3)
    if percent:
        lo, hi = share * 0.99, 1.0
    a = axis_ticks(lo, hi, percent=percent)
    assert is_round(a.step)
    slack = 1e-6 * a.step  # a sliver past a tick does not earn another one
    assert a.ticks[0] <= lo + slack and a.ticks[-1] >= hi - slack
    assert a.lo <= lo and a.hi >= hi
    for t in a.ticks:  # every tick a multiple of the step
        assert math.isclose(t / a.step, round(t / a.step), abs_tol=1e-6)
    assert all(len(label) <= 6 for label in a.labels), a.labels
    assert len(set(a.labels)) == len(a.labels), a.labels  # no two ticks read the same
    assert len(a.ticks) >= 2


def texts(svg: str) -> dict[str, list[ET.Element]]:
    root = ET.fromstring(svg)
    out: dict[str, list[ET.Element]] = {}
    for t in root.iter(f"{NS}text"):
        for cls in (t.get("class") or "").split():
            out.setdefault(cls, []).append(t)
    return out


def test_left_margin_follows_the_longest_label():
    chart = bar_chart("cost per rank", ["r0", "r1"], [1.169e14, 9e13], x_title="DP rank",
                      y_title="cost (FLOPs)")  # fmt: skip
    t = texts(chart)
    labels = [e.text for e in t["y-tick"]]
    assert labels == ["0", "50T", "100T", "150T"]
    x_right = float(t["y-tick"][0].get("x"))
    assert x_right - text_width("150T") > 18 + 4  # the y title sits left of the labels
    assert [e.text for e in t["chart-title"]] == ["cost per rank"]
    assert [e.text for e in t["axis-title"]] == ["cost (FLOPs)", "DP rank"]
    assert "legend" not in chart  # one series: no legend


def test_line_chart_draws_the_front_line_last_and_has_a_legend():
    lines = [
        {"label": "mds: max / lower bound", "values": [1.01, 1.02], "color": "#000", "front": True},
        {"label": "naive / lower bound", "values": [1.3, 1.2], "color": "#f00", "dashed": True},
    ]
    chart = line_chart("imbalance", [0, 1], lines, 1.0, 1.3, y_title="ratio")
    root = ET.fromstring(chart)
    drawn = [p.find(f"{NS}title").text for p in root.iter(f"{NS}polyline")]
    assert drawn == ["naive / lower bound", "mds: max / lower bound"]
    legend = [g.find(f"{NS}text").text for g in root.iter(f"{NS}g") if g.get("class") == "legend"]
    assert legend == ["mds: max / lower bound", "naive / lower bound"]
    assert root.get("data-series") == "2"


def test_stacked_area_chart_stacks_to_one():
    layers = [
        {"label": "a", "values": [0.25, 0.5], "color": "#111"},
        {"label": "b", "values": [0.75, 0.5], "color": "#222"},
    ]
    chart = stacked_area_chart("mix", [0, 10], layers, y_title="share of samples (%)")
    root = ET.fromstring(chart)
    polys = list(root.iter(f"{NS}polygon"))
    assert len(polys) == 2
    plot = [r for r in root.iter(f"{NS}rect") if r.get("fill") == "none"][0]  # the frame
    top, height = float(plot.get("y")), float(plot.get("height"))

    def ys(poly):
        return [float(p.split(",")[1]) for p in poly.get("points").split()]

    assert max(ys(polys[0])) == pytest.approx(top + height)  # the first layer starts at 0
    assert min(ys(polys[1])) == pytest.approx(top)  # the last one ends at 100%
    assert re.search(r">100%<", chart)
    one = stacked_area_chart("mix", [3], [{"label": "a", "values": [1.0], "color": "#111"}])
    assert "<polygon" in one
