"""A small plan of sample_data/ for the framework tests: one DP rank (a single-process
trainer), 4 samples per step, so a tiny model's steps on CPU take well under a second."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from plan_builders import sample_index, sample_plan_config

STEPS = 4


@pytest.fixture(scope="session")
def small_plan(tmp_path_factory) -> Path:
    from mds.planner.plan import build_plan

    config = sample_plan_config(sample_index(tmp_path_factory))
    train = replace(config.train, steps=STEPS, dp_size=1, samples_per_step=4)
    out = tmp_path_factory.mktemp("integrations") / "plan.mds"
    build_plan(replace(config, train=train), out)
    return out
