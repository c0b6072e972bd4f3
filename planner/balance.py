"""Assign each step's samples to DP ranks and micro-batches by cost, under token capacity.

Method, vectorized over all steps of a chunk (integer costs, so results are exact):
1. Greedy LPT: samples by cost, descending, each to the least-loaded rank that still has
   token room (micro_batches x capacity).
2. Steps where a sample found no such rank are redone one by one with a greedy LPT over
   micro-batch bins, which only places a sample where a bin has room.
3. Refinement: repeatedly take the most-loaded rank and try every move or swap of one of
   its samples with one sample (or an empty slot) of the least-loaded ranks; apply the one
   that lowers the larger of the two loads the most, while both ranks stay within capacity.
4. Micro-batches: inside each rank, samples by cost, descending, each into the cheapest
   micro-batch that still has token room (first-fit decreasing by tokens as a fallback).

The lower bound of a step is max(total cost / D, largest sample cost); `ratio` in the
stats is the most-loaded rank's cost over it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mds.executor.errors import PlanError
from mds.planner.permutation import splitmix64

__all__ = ["Assignment", "balance", "greedy_lpt", "group_sums", "lower_bound", "naive_ranks"]

INF = np.iinfo(np.int64).max
PARTNERS = 4
REFINE_ROUNDS = 48
SLACK = 2
_KEY_BITS = 41
_KEY_COST = np.int64(1 << _KEY_BITS)


@dataclass
class Assignment:
    """rank and micro-batch of every sample slot [T, N]; -1 for padding slots."""

    rank: np.ndarray
    micro: np.ndarray
    load: np.ndarray  # [T, D] rank costs


def lower_bound(cost: np.ndarray, dp: int) -> np.ndarray:
    """Per step: max(ceil(total / D), largest sample cost); no assignment can beat it."""
    total = cost.sum(axis=1)
    return np.maximum(-(-total // dp), cost.max(axis=1, initial=0))


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


def _lpt(
    cost: np.ndarray, length: np.ndarray, valid: np.ndarray, dp: int, cap_rank: int
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy LPT over ranks that still have token room; returns ranks and steps where
    some sample found no rank with room (those are redone exactly)."""
    T, N = cost.shape
    order = _by_cost(cost, valid)
    # Columns of the sorted arrays, contiguous, so each pass reads one row.
    cs = np.ascontiguousarray(np.take_along_axis(cost, order, axis=1).T)
    ls = np.ascontiguousarray(np.take_along_axis(length, order, axis=1).T)
    vs = np.ascontiguousarray(np.take_along_axis(valid, order, axis=1).T)
    load = np.zeros((T, dp), dtype=np.int64)
    tok = np.zeros((T, dp), dtype=np.int64)
    flat_load, flat_tok = load.reshape(-1), tok.reshape(-1)
    chosen = np.full((N, T), -1, dtype=np.int64)
    stuck = np.zeros(T, dtype=bool)
    base = np.arange(T) * dp
    for k in range(N):
        v = vs[k]
        if not v.any():
            break
        n = ls[k]
        r = np.argmin(load, axis=1)
        # Capacity rarely binds: check the least-loaded rank first, mask only where it is full.
        full = flat_tok[base + r] + n > cap_rank
        if full.any():
            rows = np.flatnonzero(full)
            fits = tok[rows] + n[rows, None] <= cap_rank
            r[rows] = np.argmin(np.where(fits, load[rows], INF), axis=1)
            full[rows] = ~fits[np.arange(len(rows)), r[rows]]
        ok = v & ~full
        stuck |= v & full
        cell = base + r
        flat_load[cell] += cs[k] * ok
        flat_tok[cell] += n * ok
        chosen[k] = np.where(ok, r, -1)
    rank = np.full((T, N), -1, dtype=np.int64)
    np.put_along_axis(rank, order, chosen.T, axis=1)
    return rank, stuck


def _greedy_capacity(
    cost: np.ndarray, length: np.ndarray, dp: int, micro: int, capacity: int, step: int
) -> tuple[np.ndarray, np.ndarray]:
    """One step, greedy LPT over micro-batch bins with capacity; the slow, exact fallback."""
    n = len(cost)
    order = np.lexsort((np.arange(n), -cost))
    rank_load = np.zeros(dp, dtype=np.int64)
    bin_tok = np.zeros((dp, micro), dtype=np.int64)
    rank = np.empty(n, dtype=np.int64)
    mb = np.empty(n, dtype=np.int64)
    for i in order:
        fits = bin_tok + length[i] <= capacity
        ok = fits.any(axis=1)
        if not ok.any():
            raise PlanError(
                f"step {step}: cannot pack {n} samples ({int(length.sum())} tokens) into "
                f"{dp} ranks x {micro} micro-batches of {capacity} tokens; raise "
                "`max_tokens_per_micro_batch` or `micro_batches`, or lower the step size"
            )
        r = int(np.argmin(np.where(ok, rank_load, INF)))
        m = int(np.argmax(fits[r]))
        rank[i], mb[i] = r, m
        rank_load[r] += cost[i]
        bin_tok[r, m] += length[i]
    return rank, mb


def _slots(rank: np.ndarray, cost: np.ndarray, dp: int) -> np.ndarray:
    """[T, D, P] sample indices per rank (by cost, descending), -1 for empty slots."""
    T, N = rank.shape
    key = np.where(rank >= 0, rank, dp).astype(np.int64)
    if cost.max(initial=0) < _KEY_COST:
        # One packed key (rank, then cost descending); a stable sort keeps index order on ties.
        order = np.argsort((key << _KEY_BITS) | (_KEY_COST - 1 - cost), axis=1, kind="stable")
    else:
        order = np.lexsort((np.broadcast_to(np.arange(N), (T, N)), -cost, key))
    flat = (key + (dp + 1) * np.arange(T)[:, None]).ravel()
    counts = np.bincount(flat, minlength=T * (dp + 1)).reshape(T, dp + 1)[:, :dp]
    width = int(counts.max(initial=0)) + SLACK
    starts = np.concatenate([np.zeros((T, 1), np.int64), np.cumsum(counts, axis=1)[:, :-1]], axis=1)
    pos = starts[:, :, None] + np.arange(width)[None, None, :]
    inside = np.arange(width)[None, None, :] < counts[:, :, None]
    picked = np.take_along_axis(order, np.minimum(pos, N - 1).reshape(T, -1), axis=1).reshape(
        T, dp, width
    )
    return np.where(inside, picked, -1)


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


def _by_cost(cost: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Per row: valid slots by cost descending (ties: lower index), then padding.

    A packed unique key lets numpy use its fast unstable sort and still give one answer."""
    T, N = cost.shape
    bits = max(1, (N - 1).bit_length())
    if cost.max(initial=0) < _KEY_COST and _KEY_BITS + 1 + bits <= 63:
        rank_key = np.where(valid, _KEY_COST - 1 - cost, _KEY_COST)  # padding sorts last
        return np.argsort((rank_key << bits) | np.arange(N), axis=1)
    return np.argsort(np.where(valid, -cost, 1), axis=1, kind="stable")


def _least(load: np.ndarray, q: int) -> np.ndarray:
    """Indices of the q least-loaded ranks per row (ties: lower index), by repeated argmin."""
    work = load.copy()
    rows = np.arange(len(load))
    out = np.empty((len(load), q), dtype=np.int64)
    for i in range(q):
        out[:, i] = np.argmin(work, axis=1)
        work[rows, out[:, i]] = INF
    return out


def _refine(
    slots: np.ndarray, cost: np.ndarray, length: np.ndarray, cap_rank: int, skip: np.ndarray
) -> None:
    """Step 3 of the module docstring, in place on `slots`; steps in `skip` stay as they are."""
    T, D, P = slots.shape
    if D < 2 or T == 0:
        return
    ar = np.arange(T)
    cpad = np.concatenate([cost, np.zeros((T, 1), np.int64)], axis=1)
    lpad = np.concatenate([length, np.zeros((T, 1), np.int64)], axis=1)
    col = np.where(slots >= 0, slots, cost.shape[1])
    cm = np.take_along_axis(cpad, col.reshape(T, -1), axis=1).reshape(T, D, P)
    lm = np.take_along_axis(lpad, col.reshape(T, -1), axis=1).reshape(T, D, P)
    load, tok = cm.sum(axis=2), lm.sum(axis=2)
    longest = int(length.max(initial=0))
    q = min(PARTNERS, D - 1)
    active = ~skip
    for _ in range(REFINE_ROUNDS):
        t = ar[active]
        if t.size == 0:
            break
        r1 = np.argmax(load[t], axis=1)
        part = _least(load[t], q)
        l1, k1 = load[t, r1], tok[t, r1]
        lq, kq = load[t[:, None], part], tok[t[:, None], part]
        c1, n1 = cm[t, r1], lm[t, r1]  # [t, P]
        cq, nq = cm[t[:, None], part], lm[t[:, None], part]  # [t, q, P]
        s1 = slots[t, r1] >= 0
        delta = c1[:, :, None, None] - cq[:, None, :, :]  # [t, P, q, P]
        # A swap helps iff 0 < delta < l1 - lq; the best brings delta closest to half of that.
        score = np.maximum(l1[:, None, None, None] - delta, lq[:, None, :, None] + delta)
        ok = (delta > 0) & s1[:, :, None, None]
        if int(tok.max()) + longest > cap_rank:  # token room can bind: check both ranks
            dtok = n1[:, :, None, None] - nq[:, None, :, :]
            ok &= (k1[:, None, None, None] - dtok <= cap_rank) & (
                kq[:, None, :, None] + dtok <= cap_rank
            )
        score = np.where(ok, score, INF).reshape(len(t), -1)
        best = np.argmin(score, axis=1)
        gain = score[np.arange(len(t)), best] < l1
        active[t[~gain]] = False
        if not gain.any():
            break
        t, r1, best, part = t[gain], r1[gain], best[gain], part[gain]
        i, rest = np.divmod(best, q * P)
        qi, j = np.divmod(rest, P)
        r2 = part[np.arange(len(t)), qi]
        for arr in (slots, cm, lm):
            a, b = arr[t, r1, i].copy(), arr[t, r2, j].copy()
            arr[t, r1, i], arr[t, r2, j] = b, a
        load[t, r1] = cm[t, r1].sum(axis=1)
        load[t, r2] = cm[t, r2].sum(axis=1)
        tok[t, r1] = lm[t, r1].sum(axis=1)
        tok[t, r2] = lm[t, r2].sum(axis=1)


def _micro(
    slots: np.ndarray,
    cost: np.ndarray,
    length: np.ndarray,
    micro: int,
    capacity: int,
    steps: np.ndarray,
    skip: np.ndarray,
) -> np.ndarray:
    """Step 4: micro-batch of every slot, [T, D, P], -1 for empty slots and skipped steps."""
    T, D, P = slots.shape
    cpad = np.concatenate([cost, np.full((T, 1), -1, np.int64)], axis=1)
    lpad = np.concatenate([length, np.zeros((T, 1), np.int64)], axis=1)
    col = np.where((slots >= 0) & ~skip[:, None, None], slots, cost.shape[1])
    cm = np.take_along_axis(cpad, col.reshape(T, -1), axis=1).reshape(T, D, P)
    lm = np.take_along_axis(lpad, col.reshape(T, -1), axis=1).reshape(T, D, P)
    order = np.argsort(-cm, axis=2, kind="stable")
    cs = np.take_along_axis(cm, order, axis=2)
    ls = np.take_along_axis(lm, order, axis=2)
    ms = np.full((T, D, P), -1, dtype=np.int64)  # micro-batch per slot, in cost order
    mcost = np.zeros((T, D, micro), dtype=np.int64)
    mtok = np.zeros((T, D, micro), dtype=np.int64)
    failed = np.zeros((T, D), dtype=bool)
    ti, di = np.indices((T, D))
    for p in range(P):
        c, n = cs[:, :, p], ls[:, :, p]
        present = c >= 0
        if not present.any():
            break
        fits = mtok + n[:, :, None] <= capacity
        m = np.argmin(np.where(fits, mcost, INF), axis=2)
        good = present & fits[ti, di, m]
        failed |= present & ~good
        mcost[ti, di, m] += c * good
        mtok[ti, di, m] += n * good
        ms[:, :, p] = np.where(good, m, -1)
    mb = np.empty_like(ms)
    np.put_along_axis(mb, order, ms, axis=2)
    for t, d in zip(*np.nonzero(failed), strict=True):
        mb[t, d] = _first_fit(lm[t, d], slots[t, d] >= 0, micro, capacity, int(t))
    return mb


def _first_fit(
    lengths: np.ndarray, present: np.ndarray, micro: int, capacity: int, step: int
) -> np.ndarray:
    """First-fit decreasing by tokens for one rank; raises if its samples cannot be packed."""
    out = np.full(len(lengths), -1, dtype=np.int64)
    room = np.full(micro, capacity, dtype=np.int64)
    for i in np.lexsort((np.arange(len(lengths)), -lengths)):
        if not present[i]:
            continue
        fits = np.flatnonzero(room >= lengths[i])
        if fits.size == 0:
            raise _Repack(step)
        out[i] = fits[0]
        room[fits[0]] -= lengths[i]
    return out


class _Repack(Exception):  # noqa: N818 - internal control flow, never escapes balance()
    def __init__(self, step: int):
        self.step = step  # row in the chunk


def balance(
    cost: np.ndarray,
    length: np.ndarray,
    valid: np.ndarray,
    steps: np.ndarray,
    dp: int,
    micro: int,
    capacity: int,
) -> Assignment:
    """Rank and micro-batch for every sample slot of T steps ([T, N] arrays; see module doc)."""
    T, N = cost.shape
    if N == 0:  # every step of the chunk is empty (possible with tokens_per_step)
        empty = np.full((T, 0), -1, dtype=np.int64)
        return Assignment(empty, empty.copy(), np.zeros((T, dp), dtype=np.int64))
    cost = np.where(valid, cost, 0)
    length = np.where(valid, length, 0)
    rank, forced = _lpt(cost, length, valid, dp, micro * capacity)
    exact: dict[int, np.ndarray] = {}
    while True:
        for t in np.flatnonzero(forced):
            if t not in exact:
                v = valid[t]
                rank[t, v], exact[int(t)] = _greedy_capacity(
                    cost[t, v], length[t, v], dp, micro, capacity, int(steps[t])
                )
        slots = _slots(rank, cost, dp)
        _refine(slots, cost, length, micro * capacity, forced)
        try:
            mb_slots = _micro(slots, cost, length, micro, capacity, steps, forced)
            break
        except _Repack as exc:
            # A rank's samples fit its total room but not its micro-batches: redo the step
            # with the bin-level greedy, which only places a sample where a bin has room.
            assert not forced[exc.step]
            forced[exc.step] = True
    rank_out = np.full((T, N), -1, dtype=np.int64)
    micro_out = np.full((T, N), -1, dtype=np.int64)
    tt, dd, pp = np.nonzero(slots >= 0)
    idx = slots[tt, dd, pp]
    rank_out[tt, idx] = dd
    micro_out[tt, idx] = mb_slots[tt, dd, pp]
    for t, mb in exact.items():
        micro_out[t, valid[t]] = mb
    load = group_sums(tt * dp + dd, cost[tt, idx], T * dp).reshape(T, dp)
    assert (micro_out[valid] >= 0).all() and (rank_out[valid] >= 0).all()
    return Assignment(rank_out, micro_out, load)
