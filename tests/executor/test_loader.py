"""PlanLoader: DataLoader workers return batches in plan order; the state counts what the
training loop received, so resuming after prefetch repeats nothing and skips nothing."""

from __future__ import annotations

import pytest
from executor_builders import batch_digest, open_executor, sample_plan, uninterrupted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mds.errors import ConfigError
from mds.executor import PlanLoader


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return sample_plan(tmp_path_factory)[1]


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_return_the_in_process_batches_in_plan_order(plan, workers):
    with open_executor(plan, 1) as ex:
        got = [batch_digest(b) for b in ex.dataloader(num_workers=workers, prefetch_factor=4)]
    assert got == uninterrupted(plan, 1)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_resume_after_prefetch_gives_the_uninterrupted_batches(plan, data):
    rank = data.draw(st.integers(0, 3), label="rank")
    full = uninterrupted(plan, rank)
    cut = data.draw(st.integers(0, len(full) - 1), label="cut")
    with open_executor(plan, rank) as ex:
        loader = ex.dataloader(num_workers=2, prefetch_factor=8)
        it = iter(loader)
        # workers build batches past the cut; the loop never receives them
        head = [batch_digest(next(it)) for _ in range(cut)]
        state = loader.state_dict()
        del it
    assert head == full[:cut]
    assert (state["step"], state["micro_batch"]) == divmod(cut, 2)
    with open_executor(plan, rank) as ex:
        loader = PlanLoader(ex, num_workers=2)
        loader.load_state_dict(state)
        assert [batch_digest(b) for b in loader] == full[cut:]


def test_seeking_while_workers_run_ahead_restarts_them_at_the_new_position(plan):
    full = uninterrupted(plan, 0)
    with open_executor(plan, 0) as ex:
        loader = ex.dataloader(num_workers=2, prefetch_factor=8)
        it = iter(loader)
        assert batch_digest(next(it)) == full[0]
        ex.seek(50, 1)
        assert [batch_digest(b) for b in it] == full[101:]


def test_zero_workers_is_plain_iteration(plan):
    with open_executor(plan, 2) as ex:
        assert [batch_digest(b) for b in ex.dataloader(num_workers=0)] == uninterrupted(plan, 2)


def test_arguments_the_plan_decides_are_refused(plan):
    with open_executor(plan, 0) as ex:
        with pytest.raises(ConfigError, match="PlanLoader sets DataLoader's 'batch_size' itself"):
            ex.dataloader(batch_size=4)
        with pytest.raises(ConfigError, match="num_workers=-1 must be an integer >= 0"):
            ex.dataloader(num_workers=-1)


def test_spawned_workers_rebuild_the_executor(plan):
    with open_executor(plan, 3) as ex:
        ex.seek(60)
        loader = ex.dataloader(num_workers=2, multiprocessing_context="spawn")
        assert [batch_digest(b) for b in loader] == uninterrupted(plan, 3)[120:]
