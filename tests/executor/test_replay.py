"""The positional interface PlanLoader and shared() drive an executor through: PlanExecutor
implements it, and handing out micro-batches through it keeps the executor's state as
iterating does."""

from __future__ import annotations

import pytest
from executor_builders import open_executor, sample_plan

from mds.errors import PlanError
from mds.executor.batch import expand
from mds.executor.replay import Replay


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return sample_plan(tmp_path_factory)[1]


def test_the_executor_is_a_replay(plan):
    with open_executor(plan, 0) as ex:
        assert isinstance(ex, Replay)


def test_micro_batches_handed_out_by_position_move_the_state_as_iteration_does(plan):
    with open_executor(plan, 1, read_ahead=0) as ex:
        expected = [next(iter(ex)) for _ in range(3)]
        after = ex.state_dict()
        ex.seek(0)
        assert ex.cursor == 0
        for pos, want in enumerate(expected):
            got = expand(ex.compact_at(ex.cursor, narrow=True))
            assert ex.cursor == pos  # building a micro-batch does not move the position
            assert all((got[k] == want[k]).all() for k in ("input_ids", "cu_seqlens"))
            ex.mark_delivered(pos)
        assert ex.state_dict() == after
        assert ex.position == divmod(ex.cursor, ex.micro_batches)
        with pytest.raises(PlanError, match="outside the plan"):
            ex.mark_delivered(ex.total)
