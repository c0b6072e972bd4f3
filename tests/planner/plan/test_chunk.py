"""src/mds/planner/plan/chunk.py: one chunk of steps planned from a mixing state, alone
(the chunks of whole plans are checked against the file in tests/planner/plan/test_build.py)."""

from __future__ import annotations

import numpy as np
import pytest
from plan_builders import plan_config, synthetic

from mds.planner.plan.chunk import STAT_COLUMNS, Planner, _stable_order

SOURCES = {
    "a": {"lengths": [5, 9, 13, 2, 7, 30, 4, 8], "weight": 1.0},
    "b": {"lengths": [40, 3, 17, 22, 6], "weight": 2.0},
}
TRAIN = {"steps": 6, "dp_size": 2, "micro_batches": 2, "samples_per_step": 6,
         "max_tokens_per_micro_batch": 200, "seed": 3}  # fmt: skip


@pytest.fixture(scope="module")
def planner(tmp_path_factory):
    root = tmp_path_factory.mktemp("chunk")
    return Planner(plan_config(root, synthetic(root, SOURCES, TRAIN)))


def test_a_chunk_is_a_pure_function_of_its_start_state(planner):
    state, end, counts, _after = next(planner.mix_chunks())
    one = planner.plan_chunk(state.copy(), end, counts)
    two = planner.plan_chunk(state.copy(), end)  # the mixer's counts worked out again
    assert (one.start, one.end) == (0, end)
    assert np.array_equal(one.blocks.ids, two.blocks.ids)
    assert np.array_equal(one.blocks.counts, two.blocks.counts)
    assert np.array_equal(one.stats, two.stats)
    assert one.stats.shape == (end, len(STAT_COLUMNS))
    samples = one.stats[:, STAT_COLUMNS.index("samples")]
    assert samples.tolist() == [6] * end == one.source_samples.sum(axis=1).tolist()
    assert one.blocks.counts.shape == (2, end, 2)  # [ranks, steps, micro-batches]
    assert int(one.blocks.counts.sum()) == len(one.blocks.ids) == 6 * end


def test_the_boundaries_tile_the_steps(planner):
    bounds = planner.boundaries()
    assert bounds[0][0] == 0 and bounds[-1][1] == TRAIN["steps"]
    assert all(a < b == c for (a, b), (c, _) in zip(bounds, bounds[1:], strict=False))
    assert len(planner.states()) == len(bounds) + 1


@pytest.mark.parametrize("size", [1, 300, 1 << 16, (1 << 16) + 1, 1 << 20, 1 << 32, 1 << 40])
def test_stable_order_is_a_stable_argsort(size):
    keys = np.random.default_rng(size).integers(0, size, 5000)
    assert np.array_equal(_stable_order(keys, size), np.argsort(keys, kind="stable"))
