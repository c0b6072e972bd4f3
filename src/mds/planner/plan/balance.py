"""Assign each step's samples to DP ranks and micro-batches by cost, under token capacity.

Method, vectorized over all steps of a chunk (integer costs, so results are exact and the
same on every machine; every tie is broken by index):
1. Greedy LPT: samples by cost, descending, each to the least-loaded rank that still has
   token room (micro_batches x capacity). Placed in runs (see _lpt): a step takes about
   ten vectorized passes, not one per sample, with exactly LPT's result. Steps where a
   sample found no such rank are redone one by one with a greedy LPT over micro-batch
   bins (exact, slower).
2. Karmarkar-Karp largest differencing (src/mds/planner/plan/kk.py): a step takes its ranks instead
   where they fit every rank's token room and their most-loaded rank is lighter than
   LPT's. So the start is never worse than either on the same step. Skipped above
   KK_MAX_PER_RANK samples per rank, where it costs most and LPT is already close, and
   on steps where LPT meets the lower bound (nothing can be lighter).
3. Refinement by pairwise swaps: each round pairs the k-th most-loaded rank with the
   k-th least-loaded (k < PAIRS), and the most-loaded also with each of the PARTNERS
   least-loaded (every other rank up to EVERY_PARTNER ranks); per pair it finds, by
   binary search over the light rank's costs, the one swap or move that evens the pair
   best while both ranks stay within token room, and applies it (the most-loaded rank's
   best pair first). The most-loaded rank's partners past the FIRST_PARTNERS lightest are
   searched only where one of them could beat its best pair so far (a pair's larger load
   after a swap is at least half their sum). A round costs O(P log P) per pair, not
   O(P^2). Swaps only lower the larger load of a pair, so the step's most-loaded rank
   never gets heavier. A step stops when its most-loaded rank finds no swap or is within
   2^-CLOSE_BITS of the lower bound.
4. Micro-batches: inside each rank, samples by cost, descending, each into the cheapest
   micro-batch that still has token room (first-fit decreasing by tokens as a fallback).
5. MULTIFIT retry, up to EVERY_PARTNER ranks and MULTIFIT_MAX_PER_RANK samples per rank:
   steps still more than 2^-CLOSE_BITS above pigeonhole_bound start again from MULTIFIT
   (first-fit decreasing into D ranks of cost room C, C bisected below the step's result)
   and go through 3 and 4; a start found is lighter than the result, so the step only
   gets lighter. It helps where a rank must hold one more long sample than the others.

The lower bound of a step is max(total cost / D, largest sample cost); `ratio` in the
stats is the most-loaded rank's cost over it. pigeonhole_bound is a stronger valid bound
that reports show next to it. Memory is linear in the chunk's samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from mds.errors import PlanError
from mds.planner.plan.kk import karmarkar_karp
from mds.planner.plan.permutation import splitmix64

__all__ = [
    "Assignment",
    "balance",
    "greedy_lpt",
    "group_sums",
    "interleave_ranks",
    "lower_bound",
    "naive_ranks",
    "pigeonhole_bound",
]

INF = np.iinfo(np.int64).max
PAIRS = 64  # heavy/light rank pairs per step and round
PARTNERS = 128  # light ranks the most-loaded rank tries per round
FIRST_PARTNERS = 8  # of which these first; the rest only where they might do better
# Up to this many ranks the most-loaded rank tries every other rank, not just the light half.
EVERY_PARTNER = 16
# There, steps of up to this many samples per rank still above the pigeonhole bound after
# refinement start again from MULTIFIT, bisected in this many first-fit decreasing passes.
MULTIFIT_MAX_PER_RANK = 16
MULTIFIT_ROUNDS = 12
REFINE_ROUNDS = 96
# Past this many samples per rank, KK's partial partitions per step cost more than the whole
# rest, and LPT's last samples are small against a rank's load: LPT alone starts.
KK_MAX_PER_RANK = 64
# A step within 2^-CLOSE_BITS (about 0.1%) of its lower bound is not refined further: below
# that, rounds cost more than the balance they win.
CLOSE_BITS = 10
SLACK = 2
_KEY_BITS = 41
_KEY_COST = np.int64(1 << _KEY_BITS)


def _rows_take(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """a[t, idx[t, ...]] for each row t of 2-D `a` (np.take_along_axis on the last axis, by
    flat indices: a few times faster)."""
    T, n = a.shape
    return a.reshape(-1)[idx + (n * np.arange(T)).reshape((T,) + (1,) * (idx.ndim - 1))]


def _rows_put(out: np.ndarray, idx: np.ndarray, values: np.ndarray) -> None:
    """out[t, idx[t, j]] = values[t, j] for each row t of a contiguous 2-D `out`."""
    T, n = out.shape
    out.reshape(-1)[idx + (n * np.arange(T)).reshape((T,) + (1,) * (idx.ndim - 1))] = values


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


def _lpt(
    cost: np.ndarray,
    length: np.ndarray,
    valid: np.ndarray,
    dp: int,
    cap_rank: int,
    order: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy LPT over ranks that still have token room; returns ranks and steps where
    some sample found no rank with room (those are redone exactly).

    Placed in runs, not one sample at a time: with the ranks sorted by load (ties: lower
    rank), the next samples (by cost, descending) go to the 1st, 2nd, ... lightest ranks
    for as long as that is what LPT does, that is while every rank of the run, with its
    new sample, stays heavier than the next rank in the order and the rank has token room.
    A run ends at the first sample where that is not certain (equal loads included), so the
    result is LPT's exactly; steps take about ten runs where one sample at a time took N
    passes."""
    T, N = cost.shape
    order = _by_cost(cost, valid) if order is None else order
    cs = _rows_take(cost, order).ravel()
    ls = _rows_take(length, order).ravel()
    count = valid.sum(axis=1)  # valid slots sort first
    load = np.zeros((T, dp), dtype=np.int64)
    tok = np.zeros((T, dp), dtype=np.int64)
    flat_load, flat_tok = load.reshape(-1), tok.reshape(-1)
    chosen = np.full(T * N, -1, dtype=np.int64)  # rank of each sorted slot
    stuck = np.zeros(T, dtype=bool)
    k = np.zeros(T, dtype=np.int64)  # next sorted slot of every step
    lane = np.arange(dp)
    while True:
        t = np.flatnonzero((k < count) & ~stuck)
        if t.size == 0:
            break
        ranks = _by_load(-load[t])  # ascending load, ties: lower rank
        cell = t[:, None] * dp + ranks
        sl = flat_load[cell]
        at = k[t, None] + lane
        src = t[:, None] * N + np.minimum(at, N - 1)
        x, n = cs[src], ls[src]
        ok = flat_tok[cell] + n <= cap_rank
        ok &= at < count[t, None]
        # Sample i of the run goes where LPT puts it iff every earlier rank of the run,
        # with its new sample, stays strictly heavier than rank i's current load.
        reach = np.minimum.accumulate(sl + x, axis=1)
        ok[:, 1:] &= reach[:, :-1] > sl[:, 1:]
        run = np.where(ok.all(axis=1), dp, np.argmin(ok, axis=1))
        take = lane < run[:, None]
        flat_load[cell[take]] += x[take]
        flat_tok[cell[take]] += n[take]
        chosen[src[take]] = ranks[take]
        # A run of 0: the lightest rank has no room for the next sample; LPT gives it to
        # the lightest rank that has room, if any.
        z = np.flatnonzero(run == 0)
        if z.size:
            rows = t[z]
            fits = tok[rows] + n[z, :1] <= cap_rank
            r = np.argmin(np.where(fits, load[rows], INF), axis=1)
            found = fits[np.arange(z.size), r]
            stuck[rows[~found]] = True
            rows, r, s = rows[found], r[found], src[z[found], 0]
            load[rows, r] += cs[s]
            tok[rows, r] += ls[s]
            chosen[s] = r
            run[z[found]] = 1
        k[t] += run
    rank = np.full((T, N), -1, dtype=np.int64)
    _rows_put(rank, order, chosen.reshape(T, N))
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


def _slots(rank: np.ndarray, cost: np.ndarray, dp: int, by_cost: np.ndarray) -> np.ndarray:
    """[T, D, P] sample indices per rank (by cost, descending), -1 for empty slots.
    `by_cost`: every row's slots by cost descending, ties by index (_by_cost)."""
    T, N = rank.shape
    key = np.where(rank >= 0, rank, dp).astype(np.int64)
    if dp < 1 << 15:
        # Stable by rank over the cost order: numpy radix-sorts 16-bit keys.
        order = _rows_take(
            by_cost, np.argsort(_rows_take(key, by_cost).astype(np.int16), axis=1, kind="stable")
        )
    elif cost.max(initial=0) < _KEY_COST:
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
    picked = _rows_take(order, np.minimum(pos, N - 1))
    return np.where(inside, picked, -1)


def _slot_values(slots: np.ndarray, values: np.ndarray) -> np.ndarray:
    """[T, D, P] values of the slots' samples ([T, N] values), 0 for empty slots."""
    T, N = values.shape
    pad = np.concatenate([values, np.zeros((T, 1), values.dtype)], axis=1)
    return _rows_take(pad, np.where(slots >= 0, slots, N))


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


def _by_load(load: np.ndarray) -> np.ndarray:
    """Per row: ranks by load, descending (ties: lower rank). A packed unique key (load
    below the row's maximum, then rank) lets numpy use its fast unstable sort."""
    bits = max(1, (load.shape[1] - 1).bit_length())
    top = load.max(axis=1, keepdims=True)
    if load.size and int((top - load.min(axis=1, keepdims=True)).max()) < 1 << (62 - bits):
        return np.argsort(((top - load) << bits) | np.arange(load.shape[1]), axis=1)
    return np.argsort(-load, axis=1, kind="stable")


class _Lights(NamedTuple):
    """A refinement round's light ranks: their rows in the flat [T * D, W] arrays, and each
    row's costs sorted ascending (`cost`) with their slots (`slot`); `keys` packs (light,
    cost) so that one sorted array serves the binary search of every pair."""

    rows: np.ndarray
    keys: np.ndarray
    cost: np.ndarray
    slot: np.ndarray


def _sorted_lights(rows: np.ndarray, cm_f: np.ndarray) -> _Lights:
    """_Lights of the flat rows `rows` (any shape), each row's costs sorted once."""
    rows = rows.reshape(-1)
    W = cm_f.shape[1]
    slot_bits = max(1, (W - 1).bit_length())  # costs < 2^41, so packed keys stay < 2^63
    # Packed (cost, slot) keys: one plain sort gives both, ties by slot as a stable sort.
    packed = np.sort((cm_f[rows] << slot_bits) | np.arange(W), axis=1)
    slot, cost = packed & ((1 << slot_bits) - 1), packed >> slot_bits
    keys = ((np.arange(len(rows), dtype=np.int64)[:, None] << _KEY_BITS) | cost).ravel()
    return _Lights(rows, keys, cost, slot)


def _best_swaps(
    rh: np.ndarray,
    ru: np.ndarray,
    lights: _Lights,
    flat: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    cap_rank: int,
    longest: int,
) -> np.ndarray:
    """Per pair (heavy row rh, light ru of `lights`), the swap or move that evens it best
    within token room, as [4, pairs]: the pair's larger load after it (INF where none
    lowers it), the heavy and light slots, and the cost moved. It takes from the light rank the sample
    whose cost is nearest to (heavy sample's cost - half the gap), just below or above."""
    load_f, tok_f, cm_f, lm_f = flat
    W = cm_f.shape[1]
    rl = lights.rows[ru]
    lh, ll = load_f[rh], load_f[rl]
    ch = cm_f[rh]  # [p, W]
    want = np.clip(ch - ((lh - ll) // 2)[:, None], 0, _KEY_COST - 1)
    at = ru[:, None]
    pos = np.searchsorted(lights.keys, ((at << _KEY_BITS) | want).ravel()).reshape(-1, W)
    # Candidates just below and just above, as flat positions in the light rank's row.
    first = at * W
    j = np.empty((len(rh), W, 2), dtype=np.int64)
    np.maximum(pos - 1, first, out=j[:, :, 0])
    np.minimum(pos, first + (W - 1), out=j[:, :, 1])
    delta = (ch[:, :, None] - lights.cost.reshape(-1)[j]).reshape(-1, 2 * W)
    j = j.reshape(-1, 2 * W)  # (heavy slot, below/above)
    # max(lh - delta, ll + delta) = ll + max(gap - delta, delta) =: ll + over; a swap helps
    # iff 0 < delta < gap, that is iff over < gap. An empty heavy slot costs 0, so its
    # delta is never positive.
    gap = (lh - ll)[:, None]
    over = np.maximum(gap - delta, delta)
    # Token room can bind only for pairs where a rank is within one sample of it.
    kh, kl = tok_f[rh], tok_f[rl]
    near = np.flatnonzero(np.maximum(kh, kl) + longest > cap_rank)
    if near.size:
        nl_r = _rows_take(lm_f[lights.rows], lights.slot).reshape(-1)
        dtok = (lm_f[rh[near]][:, :, None] - nl_r[j[near]].reshape(-1, W, 2)).reshape(-1, 2 * W)
        full = (kh[near, None] - dtok > cap_rank) | (kl[near, None] + dtok > cap_rank)
        over[near] = np.where(full, INF, over[near])
    best = np.argmin(over, axis=1)
    rows = np.arange(len(rh))
    best_over = over[rows, best]
    score = np.where(best_over < gap[:, 0], ll + best_over, INF)
    return np.stack([score, best // 2, lights.slot.reshape(-1)[j[rows, best]], delta[rows, best]])


def _refine(
    slots: np.ndarray,
    cm: np.ndarray,
    lm: np.ndarray,
    cost: np.ndarray,
    length: np.ndarray,
    cap_rank: int,
    skip: np.ndarray,
) -> None:
    """Step 3 of the module docstring, in place on `slots` and their costs `cm` and token
    counts `lm` ([T, D, W], 0 for empty slots); steps in `skip` stay as they are.
    Costs of 2^41 or more (never in a plan: they are scaled to <= 2^40) or 2^21 slots per
    rank skip it (packed keys would not fit 63 bits)."""
    T, D, W = slots.shape
    if D < 2 or T == 0 or int(cost.max(initial=0)) >= _KEY_COST or W > 1 << 21:
        return
    load, tok = cm.sum(axis=2), lm.sum(axis=2)
    # Flat views: row t * D + d holds rank d of step t.
    slots_f, cm_f, lm_f = slots.reshape(T * D, W), cm.reshape(T * D, W), lm.reshape(T * D, W)
    load_f, tok_f = load.reshape(-1), tok.reshape(-1)
    flat = (load_f, tok_f, cm_f, lm_f)
    K = min(PAIRS, D // 2)  # heavy k with light k, k < K
    # and the heaviest with lights 0..Q-1: the light half, or every other rank at small D
    Q = min(PARTNERS, D - 1 if D <= EVERY_PARTNER else D - K)
    pick_h = np.concatenate([np.arange(K), np.zeros(max(0, Q - 1), np.int64)])
    pick_l = np.concatenate([np.arange(K), np.arange(1, Q)])
    R = len(pick_h)
    heaviest_rows = np.concatenate([[0], np.arange(K, R)])  # its pair with light m, m < Q
    # The heaviest's pairs with lights FIRST_PARTNERS.. are searched only where its best
    # pair so far could be beaten by one of them (see the bound below).
    tiers = [(FIRST_PARTNERS, Q)] if Q > FIRST_PARTNERS else []
    L = max(K, min(Q, FIRST_PARTNERS)) if D <= EVERY_PARTNER else max(K, Q)  # lights sorted
    first_cols = np.arange(K + min(Q, FIRST_PARTNERS) - 1)
    longest = int(length.max(initial=0))
    lb = lower_bound(cost, D)
    done = lb + (lb >> CLOSE_BITS)  # close enough to the bound: stop refining
    active = ~skip
    for _ in range(REFINE_ROUNDS):
        active &= load.max(axis=1) > done
        t = np.flatnonzero(active)
        if t.size == 0:
            break
        n = t.size
        by_load = _by_load(load[t])
        rows = t[:, None] * D  # + rank: the row of (step, rank) in the flat [T * D, W] arrays
        rh_all = rows + by_load[:, pick_h]  # [n, R]
        rl_all = rows + by_load[:, D - 1 - pick_l]
        # Per pair: its larger load after its best swap (INF: none helps), the heavy and
        # light slots of that swap and the cost it moves.
        found = np.zeros((4, n, R), dtype=np.int64)
        found[0] = INF
        every = np.arange(n)
        lights = _sorted_lights(rows + by_load[:, D - 1 - np.arange(L)], cm_f)
        at = (np.repeat(every, len(first_cols)), np.tile(first_cols, n))
        ru = at[0] * L + pick_l[at[1]]
        found[:, at[0], at[1]] = _best_swaps(rh_all[at], ru, lights, flat, cap_rank, longest)
        score = found[0]
        lh0 = load_f[rh_all[:, 0]]
        for a, b in tiers:
            # A pair's larger load after any swap is at least ceil((lh + ll) / 2), and
            # lights a.. are at least as loaded as light a: where the heaviest's best so far
            # is within that, none of them can beat it (ties go to the earlier pair).
            ll_a = load_f[rows[:, 0] + by_load[:, D - 1 - a]]
            rest = np.flatnonzero(score[:, heaviest_rows[:a]].min(axis=1) > (lh0 + ll_a + 1) // 2)
            if rest.size == 0:
                break
            at = (np.repeat(rest, b - a), np.tile(K + np.arange(a, b) - 1, rest.size))
            if b <= L:  # sorted already
                ru = at[0] * L + pick_l[at[1]]
            else:
                lights = _sorted_lights(
                    rows[rest] + by_load[rest][:, D - 1 - np.arange(a, b)], cm_f
                )
                ru = np.arange(rest.size * (b - a))
            found[:, at[0], at[1]] = _best_swaps(rh_all[at], ru, lights, flat, cap_rank, longest)
        gain = score < INF
        if not gain.any():
            break
        # The heaviest rank takes its best pair; the other pairs run unless they use the
        # rank it took, light m (pair k holds the k-th heaviest and the k-th lightest; the
        # pairs never share a rank otherwise).
        m = np.argmin(score[:, heaviest_rows], axis=1)
        took = gain[every, heaviest_rows[m]]
        apply = np.zeros((n, R), dtype=bool)
        apply[every, heaviest_rows[m]] = took
        k = np.arange(1, K)
        uses = (m[:, None] == k) | (m[:, None] == D - 1 - k)
        others = gain[:, 1:K] & ~(took[:, None] & uses)
        apply[:, 1:K] = others
        g = np.flatnonzero(apply.reshape(-1))
        i, jg, d = found[1].reshape(-1)[g], found[2].reshape(-1)[g], found[3].reshape(-1)[g]
        fh, fl = rh_all.reshape(-1)[g], rl_all.reshape(-1)[g]
        dn = lm_f[fh, i] - lm_f[fl, jg]
        for arr in (slots_f, cm_f, lm_f):
            x, y = arr[fh, i].copy(), arr[fl, jg].copy()
            arr[fh, i], arr[fl, jg] = y, x
        load_f[fh] -= d
        load_f[fl] += d
        tok_f[fh] -= dn
        tok_f[fl] += dn
        # A step is done when its most-loaded rank found no swap: the other pairs cannot
        # lower the step's maximum.
        active[t[~took]] = False


def _micro(
    slots: np.ndarray,
    cm: np.ndarray,
    lm: np.ndarray,
    cost: np.ndarray,
    micro: int,
    capacity: int,
    skip: np.ndarray,
) -> np.ndarray:
    """Step 4: micro-batch of every slot, [T, D, P], -1 for empty slots and skipped steps.
    `cm`, `lm`: the slots' costs and token counts."""
    T, D, P = slots.shape
    present = (slots >= 0) & ~skip[:, None, None]
    bits = max(1, (P - 1).bit_length())
    if int(cost.max(initial=0)) < _KEY_COST and _KEY_BITS + 1 + bits <= 63:
        # Cost descending, ties by slot, empty slots last: unique packed keys, fast sort.
        key = np.where(present, _KEY_COST - 1 - cm, _KEY_COST)
        order = np.argsort((key << bits) | np.arange(P), axis=2).reshape(T * D, P)
    else:
        order = np.argsort(np.where(present, -cm, 1), axis=2, kind="stable").reshape(T * D, P)
    cs = _rows_take(np.where(present, cm, -1).reshape(T * D, P), order)
    ls = _rows_take(lm.reshape(T * D, P), order)
    ms = np.full((T * D, P), -1, dtype=np.int64)  # micro-batch per slot, in cost order
    mcost = np.zeros((T * D, micro), dtype=np.int64)
    mtok = np.zeros((T * D, micro), dtype=np.int64)
    failed = np.zeros(T * D, dtype=bool)
    # Flat cell of (step, rank, micro-batch): one gather and scatter per slot, not three.
    base = np.arange(T * D) * micro
    mcost_f, mtok_f = mcost.reshape(-1), mtok.reshape(-1)
    for p in range(P):
        c, n = cs[:, p], ls[:, p]
        present = c >= 0
        if not present.any():
            break
        # Capacity rarely binds: take the cheapest micro-batch, and only where it has no
        # room, the cheapest that has (the same choice: ties go to the lower index).
        m = np.argmin(mcost, axis=1)
        good = mtok_f[base + m] + n <= capacity
        if not good.all():
            rows = np.flatnonzero(~good)
            fits = mtok[rows] + n[rows, None] <= capacity
            m[rows] = np.argmin(np.where(fits, mcost[rows], INF), axis=1)
            good[rows] = fits[np.arange(rows.size), m[rows]]
        good &= present
        failed |= present & ~good
        cell = base + m
        mcost_f[cell] += c * good
        mtok_f[cell] += n * good
        ms[:, p] = np.where(good, m, -1)
    mb = np.empty_like(ms)
    _rows_put(mb, order, ms)
    mb = mb.reshape(T, D, P)
    for t, d in zip(*np.nonzero(failed.reshape(T, D)), strict=True):
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


def _rank_sums(rank: np.ndarray, weights: np.ndarray, dp: int) -> np.ndarray:
    """[T, D] sums of `weights` per (step, rank); slots with rank -1 count nowhere."""
    T = rank.shape[0]
    cell = np.arange(T)[:, None] * (dp + 1) + np.where(rank >= 0, rank, dp)
    return group_sums(cell, weights, T * (dp + 1)).reshape(T, dp + 1)[:, :dp]


def _prefer_kk(
    rank: np.ndarray,
    forced: np.ndarray,
    cost: np.ndarray,
    length: np.ndarray,
    valid: np.ndarray,
    dp: int,
    cap_rank: int,
) -> None:
    """Step 2 of the module docstring, in place: a step takes Karmarkar-Karp's ranks where
    they fit every rank's token room and their most-loaded rank is lighter than LPT's
    (or LPT found no room for some sample)."""
    if dp < 2 or not valid.any() or cost.shape[1] > KK_MAX_PER_RANK * dp:
        return
    lpt_max = _rank_sums(np.where(forced[:, None], -1, rank), cost, dp).max(axis=1)
    # Where LPT meets the lower bound, nothing is lighter: KK runs on the other steps only.
    rows = np.flatnonzero(forced | (lpt_max > lower_bound(cost, dp)))
    if rows.size == 0:
        return
    kk = karmarkar_karp(cost[rows], valid[rows], dp)
    fits = _rank_sums(kk, length[rows], dp).max(axis=1) <= cap_rank
    kk_max = _rank_sums(kk, cost[rows], dp).max(axis=1)
    take = fits & (forced[rows] | (kk_max < lpt_max[rows]))
    rank[rows[take]] = kk[take]
    forced[rows[take]] = False


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
    chunk = _Chunk(cost, length, valid, steps, dp, micro, capacity, _by_cost(cost, valid))
    rank, forced = _lpt(cost, length, valid, dp, micro * capacity, chunk.by_cost)
    _prefer_kk(rank, forced, cost, length, valid, dp, micro * capacity)
    out = _finish(rank, forced, chunk)
    if dp <= EVERY_PARTNER and N <= MULTIFIT_MAX_PER_RANK * dp:
        _retry_multifit(out, chunk)
    return out


class _Chunk(NamedTuple):
    """What steps 3 to 5 work on: the steps' [T, N] arrays, the geometry, and every row's
    slots by cost descending (`_by_cost`)."""

    cost: np.ndarray
    length: np.ndarray
    valid: np.ndarray
    steps: np.ndarray
    dp: int
    micro: int
    capacity: int
    by_cost: np.ndarray

    def rows(self, rows: np.ndarray) -> _Chunk:
        """The same for steps `rows` alone."""
        return self._replace(
            cost=self.cost[rows],
            length=self.length[rows],
            valid=self.valid[rows],
            steps=self.steps[rows],
            by_cost=self.by_cost[rows],
        )


def _finish(rank: np.ndarray, forced: np.ndarray, chunk: _Chunk, exact: bool = True) -> Assignment:
    """Steps 3 and 4 from the start `rank`: refinement, then micro-batches. Steps in
    `forced` (and those whose micro-batches cannot be packed) take the bin-level greedy
    when `exact`; otherwise they are left in `forced` with micro-batch -1."""
    cost, length, valid, steps, dp, micro, capacity, by_cost = chunk
    T, N = cost.shape
    greedy: dict[int, np.ndarray] = {}
    while True:
        for t in np.flatnonzero(forced) if exact else ():
            if t not in greedy:
                v = valid[t]
                rank[t, v], greedy[int(t)] = _greedy_capacity(
                    cost[t, v], length[t, v], dp, micro, capacity, int(steps[t])
                )
        slots = _slots(rank, cost, dp, by_cost)
        cm, lm = _slot_values(slots, cost), _slot_values(slots, length)
        _refine(slots, cm, lm, cost, length, micro * capacity, forced)
        try:
            mb_slots = _micro(slots, cm, lm, cost, micro, capacity, forced)
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
    for t, mb in greedy.items():
        micro_out[t, valid[t]] = mb
    load = cm.sum(axis=2)
    done = valid & ~forced[:, None] if not exact else valid
    assert (micro_out[done] >= 0).all() and (rank_out[valid] >= 0).all()
    return Assignment(rank_out, micro_out, load)


def _retry_multifit(out: Assignment, chunk: _Chunk) -> None:
    """In place on `out`: steps still above the pigeonhole bound (by more than refinement
    aims for) start again from MULTIFIT (Coffman, Garey and Johnson): first-fit decreasing
    into D ranks of cost room C and token room, C bisected between the pigeonhole bound
    (nothing fits below it) and the step's result so far, so any start found is lighter
    than that result. Refined and packed into micro-batches, it replaces the step's result.
    MULTIFIT puts the cheapest of the costly samples together, which LPT and KK do not:
    with a few more long samples than a multiple of D, that is what the bound asks for."""
    cost, dp = chunk.cost, chunk.dp
    top = out.load.max(axis=1)
    bound = pigeonhole_bound(cost, dp)
    rows = np.flatnonzero(top > bound + (bound >> CLOSE_BITS))
    if rows.size == 0:
        return
    order = chunk.by_cost[rows]
    cs, ls = _rows_take(cost[rows], order), _rows_take(chunk.length[rows], order)
    count = chunk.valid[rows].sum(axis=1)
    lo, hi = bound[rows] - 1, top[rows]  # lo never fits; only below hi counts
    best = np.full(cs.shape, -1, dtype=np.int64)
    found = np.zeros(rows.size, dtype=bool)
    for _ in range(MULTIFIT_ROUNDS):
        room = (lo + hi) // 2
        placed, ok = _first_fit_decreasing(cs, ls, count, dp, room, chunk.micro * chunk.capacity)
        best[ok], found = placed[ok], found | ok
        hi, lo = np.where(ok, room, hi), np.where(ok, lo, room)
    rows, best, order = rows[found], best[found], order[found]
    if rows.size == 0:
        return
    start = np.full(best.shape, -1, dtype=np.int64)
    _rows_put(start, order, best)
    failed = np.zeros(rows.size, dtype=bool)
    alt = _finish(start, failed, chunk.rows(rows), exact=False)
    keep = ~failed & (alt.load.max(axis=1) < top[rows])
    out.rank[rows[keep]] = alt.rank[keep]
    out.micro[rows[keep]] = alt.micro[keep]
    out.load[rows[keep]] = alt.load[keep]


def _first_fit_decreasing(
    cs: np.ndarray, ls: np.ndarray, count: np.ndarray, dp: int, room: np.ndarray, cap_rank: int
) -> tuple[np.ndarray, np.ndarray]:
    """Samples by cost descending ([T, N], the first count[t] valid), each into the first
    rank with cost room left under `room` [T] and token room; their ranks, and the steps
    where every sample found one."""
    T, N = cs.shape
    load = np.zeros((T, dp), dtype=np.int64)
    tok = np.zeros((T, dp), dtype=np.int64)
    placed = np.full((T, N), -1, dtype=np.int64)
    ok = np.ones(T, dtype=bool)
    rows = np.arange(T)
    for k in range(int(count.max(initial=0))):
        fits = (load + cs[:, k, None] <= room[:, None]) & (tok + ls[:, k, None] <= cap_rank)
        r = np.argmax(fits, axis=1)
        live = (k < count) & fits[rows, r]
        ok &= live | (k >= count)
        load[rows[live], r[live]] += cs[live, k]
        tok[rows[live], r[live]] += ls[live, k]
        placed[live, k] = r[live]
    return placed, ok
