"""src/mds/planner/plan/bounds.py: the lower bounds no assignment beats and the baselines
(random deal, in-order interleave, plain LPT) a plan's balance is reported against."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mds.planner.plan.bounds import (
    greedy_lpt,
    group_sums,
    interleave_ranks,
    lower_bound,
    naive_ranks,
    pigeonhole_bound,
)


def test_lower_bound():
    cost = np.array([[10, 1, 1], [3, 3, 3], [0, 0, 0], [7, 0, 0]])
    assert lower_bound(cost, 2).tolist() == [10, 5, 0, 7]
    assert lower_bound(np.zeros((2, 0), np.int64), 3).tolist() == [0, 0]


def naive_reference_counts(rank, valid, dp):
    return np.stack([np.bincount(r[v], minlength=dp) for r, v in zip(rank, valid, strict=True)])


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 6), N=st.integers(0, 50), dp=st.integers(1, 9), seed=st.integers(0, 999))
def test_naive_ranks_deal_round_robin(T, N, dp, seed):
    rng = np.random.default_rng(seed)
    valid = rng.random((T, N)) < 0.8
    steps = rng.integers(0, 10**6, T)
    rank = naive_ranks(valid, dp, steps)
    assert np.all(rank[~valid] == -1)
    assert np.all((rank[valid] >= 0) & (rank[valid] < dp))
    counts = naive_reference_counts(rank, valid, dp)
    assert np.all(counts.max(axis=1) - counts.min(axis=1) <= 1)
    assert np.array_equal(rank, naive_ranks(valid, dp, steps))


def test_naive_ranks_are_a_fresh_random_order_every_step():
    valid = np.ones((200, 32), bool)
    rank = naive_ranks(valid, 4, np.arange(200))
    assert len({tuple(r) for r in rank}) == 200  # (it was 4: rotations of one pattern)
    # random, not contiguous runs: neighbouring slots share a rank about 1/4 of the time
    same = (rank[:, 1:] == rank[:, :-1]).mean()
    assert 0.15 < same < 0.35, same
    # every rank gets slot 0 about equally often
    assert np.bincount(rank[:, 0], minlength=4).min() > 25


def greedy_reference(cost, valid, dp):
    out = np.full(cost.shape, -1)
    for t in range(cost.shape[0]):
        load = [0] * dp
        order = sorted(np.flatnonzero(valid[t]), key=lambda j: (-cost[t, j], j))
        for j in order:
            r = min(range(dp), key=lambda k: (load[k], k))
            out[t, j] = r
            load[r] += cost[t, j]
    return out


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 4), N=st.integers(0, 30), dp=st.integers(1, 6), seed=st.integers(0, 999))
def test_greedy_lpt_matches_a_plain_implementation(T, N, dp, seed):
    rng = np.random.default_rng(seed)
    cost = rng.integers(1, 50, (T, N))
    valid = rng.random((T, N)) < 0.8
    assert np.array_equal(greedy_lpt(cost, valid, dp), greedy_reference(cost, valid, dp))


def test_group_sums_is_exact_on_both_paths():
    rng = np.random.default_rng(3)
    groups = rng.integers(0, 7, 500)
    small = rng.integers(0, 1 << 40, 500)
    huge = np.full(500, (1 << 62) // 500, dtype=np.int64)  # forces the integer fallback
    for weights in (small, huge):
        expected = np.zeros(8, dtype=np.int64)
        np.add.at(expected, groups, weights)
        assert np.array_equal(group_sums(groups, weights, 8), expected)


def test_interleave_ranks_deal_in_order():
    valid = np.array([[True, False, True, True, True, True], [False] * 6])
    assert interleave_ranks(valid, 2).tolist() == [[0, -1, 1, 0, 1, 0], [-1] * 6]


def best_max_load(cost: list[int], dp: int) -> int:
    """The optimal most-loaded rank, by trying every assignment (tiny cases only)."""
    import itertools

    best = None
    for ranks in itertools.product(range(dp), repeat=len(cost)):
        load = [0] * dp
        for c, r in zip(cost, ranks, strict=True):
            load[r] += c
        best = max(load) if best is None else min(best, max(load))
    return best or 0


@settings(max_examples=60, deadline=None)
@given(
    dp=st.integers(1, 4),
    cost=st.lists(st.integers(0, 50), min_size=0, max_size=8),
)
def test_pigeonhole_bound_is_a_lower_bound_and_at_least_the_simple_one(dp, cost):
    arr = np.array([cost], dtype=np.int64).reshape(1, len(cost))
    bound = int(pigeonhole_bound(arr, dp)[0])
    assert bound >= int(lower_bound(arr, dp)[0])
    assert bound <= best_max_load(cost, dp)


def test_pigeonhole_bound_sees_three_large_samples_on_some_rank():
    # 5 samples of 10 on 2 ranks: some rank holds 3 (30); total / 2 is only 25 + 1
    cost = np.array([[10, 10, 10, 10, 10, 1]])
    assert lower_bound(cost, 2).tolist() == [26]
    assert pigeonhole_bound(cost, 2).tolist() == [30]
