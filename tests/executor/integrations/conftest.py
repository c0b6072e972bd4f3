"""Small plans of sample_data/ for the framework tests: one or two DP ranks, 4 samples per
step, so a tiny model's steps on CPU take well under a second."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from plan_builders import sample_index, sample_plan_config

STEPS = 4


def _plan(tmp_path_factory, dp_size: int, **derive) -> Path:
    from mds.planner.plan.build import build_plan

    config = sample_plan_config(sample_index(tmp_path_factory))
    train = replace(config.train, steps=STEPS, dp_size=dp_size, samples_per_step=4)
    out = tmp_path_factory.mktemp("integrations") / "plan.mds"
    build_plan(replace(config, train=train), out, **derive)
    return out


@pytest.fixture(scope="session")
def small_plan(tmp_path_factory) -> Path:
    return _plan(tmp_path_factory, 1)


@pytest.fixture(scope="session")
def small_plan_dp2(tmp_path_factory) -> Path:
    """The same for two DP ranks (a two-process trainer)."""
    return _plan(tmp_path_factory, 2)


@pytest.fixture(scope="session")
def small_replan(tmp_path_factory, small_plan) -> Path:
    """small_plan re-planned from step 2 (`mds plan --from small_plan --at-step 2`)."""
    return _plan(tmp_path_factory, 1, parent=small_plan, at_step=2)


@pytest.fixture(scope="session")
def small_cp_plan(tmp_path_factory) -> Path:
    """small_plan's data planned for cp_size 2, with short samples kept whole and long ones
    split (cp_split_from 512)."""
    from mds.planner.plan.build import build_plan
    from mds.planner.plan.config import with_cp_linear

    config = sample_plan_config(sample_index(tmp_path_factory))
    train = replace(
        config.train, steps=STEPS, dp_size=1, samples_per_step=16, cp_size=2, cp_split_from=512
    )
    train = with_cp_linear(train, config.cost, config.vision, "")
    out = tmp_path_factory.mktemp("integrations-cp") / "plan.mds"
    build_plan(replace(config, train=train), out)
    return out
