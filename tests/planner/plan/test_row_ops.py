"""src/mds/planner/plan/row_ops.py: per-row gathers and scatters, and the slot and rank
orders the balancer sorts by (ties by index, one answer on every machine)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mds.planner.plan.row_ops import KEY_COST, ranks_by_load, rows_put, rows_take, slots_by_cost


def test_rows_take_and_put_are_take_and_put_along_the_last_axis():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 100, (4, 9))
    idx = np.argsort(rng.random((4, 9)), axis=1)
    assert np.array_equal(rows_take(a, idx), np.take_along_axis(a, idx, axis=1))
    cube = idx[:, :3, None].repeat(2, axis=2)  # more dimensions after the row
    assert np.array_equal(rows_take(a, cube), a[np.arange(4)[:, None, None], cube])
    out = np.zeros_like(a)
    rows_put(out, idx, a)
    expected = np.zeros_like(a)
    np.put_along_axis(expected, idx, a, axis=1)
    assert np.array_equal(out, expected)


@settings(max_examples=50, deadline=None)
@given(
    T=st.integers(1, 4),
    N=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    huge=st.booleans(),
)
def test_slots_by_cost_is_a_stable_sort_by_cost_descending(T, N, seed, huge):
    rng = np.random.default_rng(seed)
    cost = rng.integers(0, 5, (T, N)) + (int(KEY_COST) if huge else 0)  # ties; the slow path
    valid = rng.random((T, N)) < 0.8
    expected = np.argsort(np.where(valid, -cost, 1), axis=1, kind="stable")
    assert np.array_equal(slots_by_cost(cost, valid), expected)


def test_ranks_by_load_descending_ties_by_rank():
    load = np.array([[3, 7, 7, 1], [0, 0, 0, 0], [5, 2**62, 5, 0]])  # a spread too wide to pack
    assert ranks_by_load(load).tolist() == [[1, 2, 0, 3], [0, 1, 2, 3], [1, 0, 2, 3]]
