"""PlanBatches: the sized, stateful iterable the framework adapters hand to training loops."""

from __future__ import annotations

import pytest
from executor_builders import open_executor

from mds.executor.integrations.batches import PlanBatches


@pytest.fixture
def plan(small_plan):
    return small_plan


def ids(batches):
    return [b["sample_id"].tolist() for b in batches]


def test_state_follows_the_used_batch_not_the_fetched_one(plan):
    with open_executor(plan, 0) as ex:
        batches = PlanBatches(ex)
        assert len(batches) == ex.steps * ex.micro_batches
        it = iter(batches)
        first, second = next(it), next(it)  # fetched two, as a prefetching loop does
        assert batches.state_dict()["micro_batch"] == 0 and batches.state_dict()["step"] == 1
        batches.used(first)
        state = batches.state_dict()
        assert (state["step"], state["micro_batch"]) == (0, 1)
        rest = ids(it)
    with open_executor(plan, 0) as ex:
        resumed = PlanBatches(ex)
        resumed.load_state_dict(state)
        assert ids(resumed) == ids([second]) + rest
        assert len(resumed) == ex.steps * ex.micro_batches  # the plan's, not what is left


def test_collate_and_workers(plan):
    with open_executor(plan, 0) as ex:
        plain = ids(PlanBatches(ex))
    with open_executor(plan, 0) as ex:
        got = list(PlanBatches(ex, num_workers=1, collate=lambda mb: {**mb, "seen": True}))
    assert ids(got) == plain and all(b["seen"] for b in got)


def test_another_plans_state_is_refused(plan):
    from mds.executor import PlanError

    with open_executor(plan, 0) as ex:
        batches = PlanBatches(ex)
        with pytest.raises(PlanError, match="plan"):
            batches.load_state_dict({**batches.state_dict(), "plan_id": "0" * 16})
