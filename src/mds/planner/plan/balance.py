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
3. Refinement by pairwise swaps (src/mds/planner/plan/refine.py): each round pairs heavy
   ranks with light ones and applies, per pair, the one swap or move that evens it best
   within token room. Swaps only lower the larger load of a pair, so the step's
   most-loaded rank never gets heavier. A step stops when its most-loaded rank finds no
   swap or is within 2^-CLOSE_BITS of the lower bound.
4. Micro-batches: inside each rank, samples by cost, descending, each into the cheapest
   micro-batch that still has token room (first-fit decreasing by tokens as a fallback).
5. MULTIFIT retry, up to EVERY_PARTNER ranks and MULTIFIT_MAX_PER_RANK samples per rank:
   steps still more than 2^-CLOSE_BITS above pigeonhole_bound start again from MULTIFIT
   (first-fit decreasing into D ranks of cost room C, C bisected below the step's result)
   and go through 3 and 4; a start found is lighter than the result, so the step only
   gets lighter. It helps where a rank must hold one more long sample than the others.

The lower bound of a step is max(total cost / D, largest sample cost); `ratio` in the
stats is the most-loaded rank's cost over it. pigeonhole_bound is a stronger valid bound
that reports show next to it (both in src/mds/planner/plan/bounds.py, with the naive and
interleaved baselines). Memory is linear in the chunk's samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from mds.errors import PlanError
from mds.planner.plan.bounds import group_sums, lower_bound, pigeonhole_bound
from mds.planner.plan.kk import karmarkar_karp
from mds.planner.plan.refine import CLOSE_BITS, EVERY_PARTNER, refine
from mds.planner.plan.row_ops import (
    INF,
    KEY_BITS,
    KEY_COST,
    ranks_by_load,
    rows_put,
    rows_take,
    slots_by_cost,
)

__all__ = ["Assignment", "balance"]

# With EVERY_PARTNER ranks or fewer, steps of up to this many samples per rank still above
# the pigeonhole bound after refinement start again from MULTIFIT, bisected in this many first-fit decreasing passes.
MULTIFIT_MAX_PER_RANK = 16
MULTIFIT_ROUNDS = 12
# Past this many samples per rank, KK's partial partitions per step cost more than the whole
# rest, and LPT's last samples are small against a rank's load: LPT alone starts.
KK_MAX_PER_RANK = 64
SLACK = 2


@dataclass
class Assignment:
    """rank and micro-batch of every sample slot [T, N]; -1 for padding slots."""

    rank: np.ndarray
    micro: np.ndarray
    load: np.ndarray  # [T, D] rank costs


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
    order = slots_by_cost(cost, valid) if order is None else order
    cs = rows_take(cost, order).ravel()
    ls = rows_take(length, order).ravel()
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
        ranks = ranks_by_load(-load[t])  # ascending load, ties: lower rank
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
    rows_put(rank, order, chosen.reshape(T, N))
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
    `by_cost`: every row's slots by cost descending, ties by index (slots_by_cost)."""
    T, N = rank.shape
    key = np.where(rank >= 0, rank, dp).astype(np.int64)
    if dp < 1 << 15:
        # Stable by rank over the cost order: numpy radix-sorts 16-bit keys.
        order = rows_take(
            by_cost, np.argsort(rows_take(key, by_cost).astype(np.int16), axis=1, kind="stable")
        )
    elif cost.max(initial=0) < KEY_COST:
        # One packed key (rank, then cost descending); a stable sort keeps index order on ties.
        order = np.argsort((key << KEY_BITS) | (KEY_COST - 1 - cost), axis=1, kind="stable")
    else:
        order = np.lexsort((np.broadcast_to(np.arange(N), (T, N)), -cost, key))
    flat = (key + (dp + 1) * np.arange(T)[:, None]).ravel()
    counts = np.bincount(flat, minlength=T * (dp + 1)).reshape(T, dp + 1)[:, :dp]
    width = int(counts.max(initial=0)) + SLACK
    starts = np.concatenate([np.zeros((T, 1), np.int64), np.cumsum(counts, axis=1)[:, :-1]], axis=1)
    pos = starts[:, :, None] + np.arange(width)[None, None, :]
    inside = np.arange(width)[None, None, :] < counts[:, :, None]
    picked = rows_take(order, np.minimum(pos, N - 1))
    return np.where(inside, picked, -1)


def _slot_values(slots: np.ndarray, values: np.ndarray) -> np.ndarray:
    """[T, D, P] values of the slots' samples ([T, N] values), 0 for empty slots."""
    T, N = values.shape
    pad = np.concatenate([values, np.zeros((T, 1), values.dtype)], axis=1)
    return rows_take(pad, np.where(slots >= 0, slots, N))


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
    if int(cost.max(initial=0)) < KEY_COST and KEY_BITS + 1 + bits <= 63:
        # Cost descending, ties by slot, empty slots last: unique packed keys, fast sort.
        key = np.where(present, KEY_COST - 1 - cm, KEY_COST)
        order = np.argsort((key << bits) | np.arange(P), axis=2).reshape(T * D, P)
    else:
        order = np.argsort(np.where(present, -cm, 1), axis=2, kind="stable").reshape(T * D, P)
    cs = rows_take(np.where(present, cm, -1).reshape(T * D, P), order)
    ls = rows_take(lm.reshape(T * D, P), order)
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
    rows_put(mb, order, ms)
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
    chunk = _Chunk(cost, length, valid, steps, dp, micro, capacity, slots_by_cost(cost, valid))
    rank, forced = _lpt(cost, length, valid, dp, micro * capacity, chunk.by_cost)
    _prefer_kk(rank, forced, cost, length, valid, dp, micro * capacity)
    out = _finish(rank, forced, chunk)
    if dp <= EVERY_PARTNER and N <= MULTIFIT_MAX_PER_RANK * dp:
        _retry_multifit(out, chunk)
    return out


class _Chunk(NamedTuple):
    """What steps 3 to 5 work on: the steps' [T, N] arrays, the geometry, and every row's
    slots by cost descending (`slots_by_cost`)."""

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
        refine(slots, cm, lm, cost, length, micro * capacity, forced)
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
    cs, ls = rows_take(cost[rows], order), rows_take(chunk.length[rows], order)
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
    rows_put(start, order, best)
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
