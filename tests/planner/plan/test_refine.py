"""src/mds/planner/plan/refine.py: pairwise swaps between ranks never make a step's
most-loaded rank heavier, keep every rank within token room and only move samples."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mds.planner.plan.refine import refine


def dealt(rng, T: int, D: int, per_rank: int, empty: int):
    """T steps of D ranks holding `per_rank` samples each (dealt in order: unbalanced),
    plus `empty` empty slots per rank: (slots, costs, tokens, cost, length)."""
    N = D * per_rank
    cost = rng.integers(1, 1000, (T, N)) * rng.integers(1, 50, (T, N))
    length = rng.integers(1, 100, (T, N))
    W = per_rank + empty
    slots = np.full((T, D, W), -1, dtype=np.int64)
    slots[:, :, :per_rank] = np.arange(N).reshape(D, per_rank)
    take = np.where(slots >= 0, slots, 0)
    rows = np.arange(T)[:, None, None]
    cm = np.where(slots >= 0, cost[rows, take], 0)
    lm = np.where(slots >= 0, length[rows, take], 0)
    return slots, cm, lm, cost, length


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(1, 4),
    D=st.integers(1, 20),
    per_rank=st.integers(1, 12),
    seed=st.integers(0, 2**32 - 1),
    tight=st.booleans(),
)
def test_swaps_only_even_the_loads_within_token_room(T, D, per_rank, seed, tight):
    rng = np.random.default_rng(seed)
    slots, cm, lm, cost, length = dealt(rng, T, D, per_rank, empty=2)
    cap = int(lm.sum(axis=2).max()) + (0 if tight else 10**6)
    before = cm.sum(axis=2).max(axis=1)
    skip = np.zeros(T, dtype=bool)
    skip[0] = T > 1  # a skipped step stays as it is
    kept = slots[0].copy()
    refine(slots, cm, lm, cost, length, cap, skip)
    rows = np.arange(T)[:, None, None]
    take = np.where(slots >= 0, slots, 0)
    # the costs and tokens moved with their samples, and every sample is still placed once
    assert np.array_equal(cm, np.where(slots >= 0, cost[rows, take], 0))
    assert np.array_equal(lm, np.where(slots >= 0, length[rows, take], 0))
    for t in range(T):
        assert sorted(slots[t][slots[t] >= 0].tolist()) == list(range(D * per_rank))
    assert np.all(cm.sum(axis=2).max(axis=1) <= before)
    assert np.all(lm.sum(axis=2) <= cap)
    if T > 1:
        assert np.array_equal(slots[0], kept)


def test_a_dealt_step_comes_close_to_its_lower_bound():
    rng = np.random.default_rng(7)
    slots, cm, lm, cost, length = dealt(rng, 1, 8, 32, empty=2)
    refine(slots, cm, lm, cost, length, 10**9, np.zeros(1, dtype=bool))
    load = cm.sum(axis=2)
    assert load.max() / (cost.sum() / 8) < 1.01
