"""The short kill-and-resume soak (`make soak` runs the long one): SIGKILL the 2-rank
training example at seeded random moments, resume, and check that what the final model
trained on is exactly the plan, nothing lost and nothing repeated."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from plan_builders import sample_index, sample_plan_config

_spec = importlib.util.spec_from_file_location("soak", Path(__file__).with_name("soak.py"))
soak = importlib.util.module_from_spec(_spec)
sys.modules["soak"] = soak  # dataclasses look their module up while the module runs
_spec.loader.exec_module(soak)


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    from mds.planner.plan.build import build_plan, with_overrides

    config = with_overrides(sample_plan_config(sample_index(tmp_path_factory)), dp_size=2)
    out = tmp_path_factory.mktemp("soak") / "plan-dp2.mds"
    build_plan(config, out, workers=1)
    return out


@pytest.mark.slow
def test_killed_runs_resume_to_exactly_the_plans_samples(plan, tmp_path):
    result = soak.soak(plan, tmp_path, kills=3, steps=6, seed=7)
    assert result.kills == 3
    assert result.launches >= 4
    assert result.steps == 6 * result.episodes
    assert result.samples == result.steps * 32  # samples_per_step of the sample config


def test_the_checks_catch_a_lost_or_repeated_sample(plan):
    expected = soak.planned_steps(plan, 2)
    history = [{"step": s, "sample_ids": expected[s]} for s in range(2)]
    soak._check_history(json.loads(json.dumps(history)), expected)
    repeated = [history[0], {"step": 1, "sample_ids": [expected[0][0], expected[1][1]]}]
    with pytest.raises(AssertionError, match="planned samples lost"):
        soak._check_history(repeated, expected)
    with pytest.raises(AssertionError, match="steps are"):
        soak._check_history(history[:1], expected)
    with pytest.raises(AssertionError, match="step 1 drew samples other than the plan's"):
        soak._check_attempt({"step": 1, "sample_ids": expected[0]}, expected)
