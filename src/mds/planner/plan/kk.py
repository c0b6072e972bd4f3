"""Karmarkar-Karp largest differencing for D-way partitions, vectorized over steps.

The multi-way form verl uses to balance DP ranks (equal-size blocks): a step's samples,
by cost descending (ties: lower index), are cut into blocks of D, one sample per rank
(zero-cost padding completes the last block). Each block is a partial partition. The two
partial partitions with the largest spread (heaviest part - lightest part; ties: heavier
top part, then lower block id) are joined, heaviest part of one with lightest part of the
other, until one is left; its parts, heaviest first, are ranks 0..D-1. Every step does
the same number of joins, so each join is a few numpy operations over all steps (the
largest live states by a masked max over the step's states, not a heap: steps hold
few states, and one max over them costs fewer numpy calls than a sift). Integer sums only: the result is exact.
"""

from __future__ import annotations

import numpy as np

__all__ = ["karmarkar_karp"]

# Steps per vectorized batch are chosen so one batch holds about this many sample slots.
_BATCH_ITEMS = 1 << 20
_LOW = np.iinfo(np.int64).min  # below any state's spread or top part


def karmarkar_karp(
    cost: np.ndarray, valid: np.ndarray, dp: int, fill: int | None = None
) -> np.ndarray:
    """Rank of every slot of [T, N] costs (-1 for invalid slots), by largest differencing."""
    T, N = cost.shape
    rank = np.full((T, N), -1, dtype=np.int64)
    if N == 0 or T == 0:
        return rank
    if dp == 1:
        return np.where(valid, 0, -1).astype(np.int64)
    per = max(1, _BATCH_ITEMS // max(N * dp // min(dp, fill or max(1, dp // 2)), 1))
    for a in range(0, T, per):
        b = min(T, a + per)
        rank[a:b] = _kk(np.where(valid[a:b], cost[a:b], 0), dp, min(dp, fill or max(1, dp // 2)))
    return np.where(valid, rank, -1)


def _kk(cost: np.ndarray, dp: int, fill: int) -> np.ndarray:
    T, N = cost.shape
    P = -(-N // fill)
    c = np.zeros((T, P * fill), dtype=np.int64)
    c[:, :N] = cost
    order = _descending(c)  # by cost descending, ties: lower index
    sums = np.zeros((T, P, dp), dtype=np.int64)
    sums[:, :, :fill] = np.take_along_axis(c, order, axis=1).reshape(T, P, fill)
    # Each part is named by one of its samples; empty parts by ids past the samples.
    labels = np.empty((T, P, dp), dtype=np.int64)
    labels[:, :, :fill] = order.reshape(T, P, fill)
    labels[:, :, fill:] = P * fill + np.arange(P * (dp - fill)).reshape(P, dp - fill)
    parent = np.broadcast_to(np.arange(P * dp), (T, P * dp)).copy()
    spread = sums[:, :, 0] - sums[:, :, -1]
    top = sums[:, :, 0].copy()
    rows = np.arange(T)
    alive = np.ones((T, P), dtype=bool)
    flip = np.arange(dp)[::-1]
    final = np.zeros(T, dtype=np.int64)  # the one partial partition left
    for _ in range(P - 1):
        s0 = _largest(alive, spread, top)
        alive[rows, s0] = False
        s1 = _largest(alive, spread, top)
        alive[rows, s1] = False
        merged = sums[rows, s0] + sums[rows, s1][:, flip]
        lab0, lab1 = labels[rows, s0], labels[rows, s1][:, flip]
        parent[rows[:, None], lab1] = lab0
        o = np.argsort(-merged, axis=1, kind="stable")
        merged = np.take_along_axis(merged, o, axis=1)
        sums[rows, s0] = merged
        labels[rows, s0] = np.take_along_axis(lab0, o, axis=1)
        spread[rows, s0] = merged[:, 0] - merged[:, -1]
        top[rows, s0] = merged[:, 0]
        alive[rows, s0] = True
        final = s0
    part_rank = np.full((T, P * dp), -1, dtype=np.int64)
    part_rank[rows[:, None], labels[rows, final]] = np.arange(dp)
    while True:  # pointer jumping: every sample to the part that absorbed its own
        nxt = np.take_along_axis(parent, parent, axis=1)
        if np.array_equal(nxt, parent):
            break
        parent = nxt
    return np.take_along_axis(part_rank, parent[:, :N], axis=1)


def _largest(alive: np.ndarray, spread: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Per row: the live state with the largest spread (ties: larger top part, then lower
    id), the one a binary heap under that order would pop."""
    sp = np.where(alive, spread, _LOW)
    best = sp == sp.max(axis=1, keepdims=True)
    tp = np.where(best, top, _LOW)
    best &= tp == tp.max(axis=1, keepdims=True)
    return np.argmax(best, axis=1)


def _descending(c: np.ndarray) -> np.ndarray:
    """Per row: indices by value descending, ties by lower index. Values in [0, 2^41) are
    packed with their index into unique keys, so numpy's fast unstable sort gives it."""
    bits = max(1, (c.shape[1] - 1).bit_length())
    if c.size and 0 <= int(c.min()) and int(c.max()) < 1 << 41 and 42 + bits <= 63:
        return np.argsort((((1 << 41) - 1 - c) << bits) | np.arange(c.shape[1]), axis=1)
    return np.argsort(-c, axis=1, kind="stable")
