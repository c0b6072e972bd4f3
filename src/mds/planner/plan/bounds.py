"""What a step's balance is measured against: lower bounds no assignment can beat
(lower_bound, pigeonhole_bound) and the baselines a plan's speedup is reported over
(naive_ranks: a random deal; interleave_ranks: in-order round-robin; greedy_lpt: plain LPT
for benchmarks), with group_sums, the exact integer per-group sums the loads are made of.
"""

from __future__ import annotations

import numpy as np

from mds.planner.plan.permutation import splitmix64

__all__ = [
    "greedy_lpt",
    "group_sums",
    "interleave_ranks",
    "lower_bound",
    "naive_ranks",
    "pigeonhole_bound",
]


def lower_bound(cost: np.ndarray, dp: int) -> np.ndarray:
    """Per step: max(ceil(total / D), largest sample cost); no assignment can beat it."""
    total = cost.sum(axis=1)
    return np.maximum(-(-total // dp), cost.max(axis=1, initial=0))


def pigeonhole_bound(cost: np.ndarray, dp: int) -> np.ndarray:
    """Per step: a lower bound at least lower_bound's, for reports next to it (balancing
    and the plan's stats use lower_bound).

    With costs sorted descending, c_1 >= c_2 >= ..., and any k >= 1 with kD + 1 samples: the
    kD + 1 costliest samples lie on D ranks, so some rank holds k + 1 of them (pigeonhole),
    and those k + 1 cost at least the k + 1 cheapest of the kD + 1, c_(kD-k+1) + ... +
    c_(kD+1). Costs are not negative, so that rank's load, and the most-loaded rank's, is at
    least that sum in every assignment. The bound is the largest such sum over k, or
    lower_bound where that is larger (k = 0 gives the largest sample). It binds when a step
    has a few more large samples than a multiple of D (long context: 17 samples of 24k+
    tokens on 8 ranks put 3 on some rank)."""
    T, N = cost.shape
    best = lower_bound(cost, dp)
    if N <= dp:
        return best
    c = -np.sort(-cost, axis=1)
    prefix = np.concatenate([np.zeros((T, 1), c.dtype), np.cumsum(c, axis=1)], axis=1)
    k = np.arange(1, (N - 1) // dp + 1)
    # 0-based, the k + 1 cheapest of the top kD + 1 are c[kD - k .. kD]
    sums = prefix[:, k * dp + 1] - prefix[:, k * dp - k]
    return np.maximum(best, sums.max(axis=1))


def naive_ranks(valid: np.ndarray, dp: int, steps: np.ndarray) -> np.ndarray:
    """Naive sharding: the step's samples in a seeded random order, dealt round-robin.

    What a loader does when every rank draws its share without looking at lengths.
    """
    T, N = valid.shape
    x = (steps.astype(np.uint64)[:, None] << np.uint64(32)) | np.arange(N, dtype=np.uint64)[None, :]
    # The full splitmix64 finalizer: one multiply and shift left the sort order a Weyl
    # sequence, the same near-contiguous blocks at every step instead of a random order.
    x = splitmix64(x + np.uint64(0x9E3779B97F4A7C15))
    if N <= 1 << 16:
        # Keep the hash's high bits and put the slot index in the low 16: keys are unique,
        # so numpy's fast unstable sort gives one order on every machine.
        x = (x & ~np.uint64(0xFFFF)) | np.arange(N, dtype=np.uint64)[None, :]
        order = np.argsort(np.where(valid, x, np.uint64(2**64 - 1)), axis=1)
    else:
        order = np.argsort(np.where(valid, x, np.uint64(2**64 - 1)), axis=1, kind="stable")
    rank = np.full((T, N), -1, dtype=np.int64)
    np.put_along_axis(rank, order, np.arange(N)[None, :] % dp, axis=1)
    return np.where(valid, rank, -1)


def interleave_ranks(valid: np.ndarray, dp: int) -> np.ndarray:
    """In-order interleaving: the step's k-th sample (plan order) to rank k % D.

    What an evenly interleaving loader does; on mixed data it is a stronger baseline than
    a random deal, because each source's samples spread evenly over the ranks."""
    k = np.cumsum(valid, axis=1) - 1
    return np.where(valid, k % dp, -1).astype(np.int64)


def greedy_lpt(cost: np.ndarray, valid: np.ndarray, dp: int) -> np.ndarray:
    """Plain greedy LPT over ranks, no capacity: each sample, by cost descending, to the
    least-loaded rank. A reference for benchmarks (one pass per sample, so slower)."""
    T, N = cost.shape
    order = np.argsort(np.where(valid, -cost, 1), axis=1, kind="stable")
    load = np.zeros((T, dp), dtype=np.int64)
    rank = np.full((T, N), -1, dtype=np.int64)
    ar = np.arange(T)
    for k in range(N):
        idx = order[:, k]
        v = valid[ar, idx]
        if not v.any():
            break
        r = np.argmin(load, axis=1)
        load[ar, r] += cost[ar, idx] * v
        rank[ar, idx] = np.where(v, r, -1)
    return rank


def group_sums(groups: np.ndarray, weights: np.ndarray, size: int) -> np.ndarray:
    """Exact int64 sums of `weights` per group id in [0, size).

    np.bincount sums in float64: exact while no group's running sum can reach 2^53 (largest
    |weight| x largest group below 2^53); otherwise fall back to np.add.at."""
    groups, weights = groups.ravel(), weights.ravel()
    if not weights.size:
        return np.zeros(size, dtype=np.int64)
    biggest = int(np.bincount(groups, minlength=size).max())
    if int(np.abs(weights).max()) * biggest < 1 << 53:
        return np.bincount(groups, weights=weights, minlength=size)[:size].astype(np.int64)
    out = np.zeros(size, dtype=np.int64)
    np.add.at(out, groups, weights)
    return out
