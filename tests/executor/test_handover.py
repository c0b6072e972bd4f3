"""Switching a run to a plan re-planned from its own at step K: a state the old plan saved at
any step s <= K resumes on the new plan's executor, which replays the old steps s..K-1 and
then the new plan from K, no sample repeated or lost; states after K are refused."""

from __future__ import annotations

import shutil

import polars as pl
import pytest
from executor_builders import open_executor
from plan_builders import sample_index, sample_plan_config, step_ids

from mds.core.planfile_reader import PlanReader
from mds.errors import PlanError
from mds.planner.plan.build import build_plan, with_overrides
from mds.planner.plan.exclude import Exclusion

STEPS, K = 16, 6


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    index = sample_index(tmp_path_factory)
    config = with_overrides(sample_plan_config(index), steps=STEPS)
    root = tmp_path_factory.mktemp("handover")
    old, new = root / "old.mds", root / "new.mds"
    build_plan(config, old)
    bad = sorted({i for ids in step_ids(old, K, K + 2).values() for i in ids})
    build_plan(config, new, parent=old, at_step=K, exclusion=Exclusion(pl.Series(bad).to_numpy(), {}, "bad", "0", len(bad)))
    return old, new


def micro_ids(plan, rank, first, last) -> list[tuple[int, int, list[int]]]:
    """(step, micro_batch, sample ids) of `rank` for steps [first, last), from the plan."""
    with open_executor(plan, rank) as ex:
        return [
            (s, m, [int(i) for i in ex.sample_ids(s, m)])
            for s in range(first, last)
            for m in range(ex.micro_batches)
        ]


def seen(batches) -> list[tuple[int, int, list[int]]]:
    return [(int(b["step"]), int(b["micro_batch"]), [int(i) for i in b["sample_id"]]) for b in batches]


@pytest.mark.parametrize("s", [K - 3, K])
def test_an_old_state_before_k_replays_the_old_steps_then_the_new_plan(plans, s):
    old, new = plans
    with open_executor(old, 1) as a:
        run = iter(a)
        for _ in range(s * a.micro_batches):  # an uninterrupted run to step s
            next(run)
        state = a.state_dict()
    assert state["step"] == s
    with open_executor(new, 1) as b:
        b.load_state_dict(state)
        got = seen(b)
    assert got == micro_ids(old, 1, s, K) + micro_ids(new, 1, K, STEPS)


def test_a_checkpoint_during_the_replay_resumes_it(plans):
    old, new = plans
    with open_executor(old, 0) as a:
        a.seek(K - 2)
        state = a.state_dict()
    with open_executor(new, 0) as b:
        b.load_state_dict(state)
        run = iter(b)
        first = seen([next(run)])
        mid = b.state_dict()
    with PlanReader(old) as reader:
        assert mid["plan_id"] == reader.plan_id  # still on the old plan's steps
    with open_executor(new, 0) as c:
        c.load_state_dict(mid)
        rest = seen(c)
    assert first + rest == micro_ids(old, 0, K - 2, K) + micro_ids(new, 0, K, STEPS)


def test_the_dataloader_workers_replay_the_old_steps_too(plans):
    old, new = plans
    with open_executor(old, 2) as a:
        a.seek(K - 1, 1)
        state = a.state_dict()
    with open_executor(new, 2) as b:
        b.load_state_dict(state)
        got = seen(b.dataloader(num_workers=2))
    assert got == micro_ids(old, 2, K - 1, K)[1:] + micro_ids(new, 2, K, STEPS)


def test_a_state_after_k_is_refused(plans):
    old, new = plans
    with open_executor(old, 0) as a, open_executor(new, 0) as b:
        a.seek(K, 1)
        with pytest.raises(PlanError, match=rf"continues that plan from step {K}: the run already trained"):
            b.load_state_dict(a.state_dict())


def test_the_old_plan_must_be_found_and_be_the_parent(plans, tmp_path):
    old, new = plans
    moved = tmp_path / "new.mds"
    shutil.copy(new, moved)  # its recorded parent path no longer leads to the old plan
    with open_executor(old, 0) as a:
        a.seek(K - 1)
        state = a.state_dict()
    with open_executor(moved, 0) as b, pytest.raises(PlanError, match=rf"continues plan \w+ from step {K}, whose steps"):
        b.load_state_dict(state)
    with open_executor(moved, 0, parent_plan=old) as b:
        b.load_state_dict(state)
        assert b.position == (K - 1, 0)
    with open_executor(moved, 0, parent_plan=new) as b, pytest.raises(PlanError, match="pass parent_plan= the plan"):
        b.load_state_dict(state)
