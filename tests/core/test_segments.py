"""Where an online run's segments and signal log lie, and the footer facts read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from mds.core.segments import first_segment, online_facts, segment_path, signals_path
from mds.errors import PlanError


def test_names_beside_the_plan():
    assert segment_path("run/plan.mds", 0) == Path("run/plan.mds")
    assert segment_path("run/plan.mds", 3) == Path("run/plan.w00003.mds")
    assert segment_path("run/plan", 12) == Path("run/plan.w00012")
    assert signals_path("run/plan.mds") == Path("run/plan.signals.json")
    assert segment_path("s3://b/run/plan.mds", 1) == "s3://b/run/plan.w00001.mds"
    assert signals_path("s3://b/run/plan.mds") == "s3://b/run/plan.signals.json"


def test_first_segment_inverts_segment_path():
    for plan in ("run/plan.mds", "run/plan", "s3://b/run/plan.mds"):
        for k in (0, 1, 12):
            assert first_segment(segment_path(plan, k), k) == segment_path(plan, 0)
    with pytest.raises(PlanError, match=r"window 2 of an online run is named STEM\.w00002\.mds"):
        first_segment("run/plan.w00003.mds", 2)


def test_facts_of_a_segment_and_of_a_damaged_one():
    raw = {"window": 2, "windows": 3, "window_steps": 4, "steps": 12, "weights": {"a": 1.0},
           "signal_windows": 1, "signal_digest": "d", "config_digest": "c"}
    facts = online_facts({"online": raw}, "p")
    assert facts.bounds(2) == (8, 12) and facts.weights == {"a": 1.0}
    assert online_facts({}, "p") is None
    with pytest.raises(PlanError, match="p: corrupt plan"):
        online_facts({"online": {"window": 1}}, "p")
