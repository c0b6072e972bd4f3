"""Step 3 of the balancer (plan/balance.py): refinement by pairwise swaps.

Each round pairs the k-th most-loaded rank with the k-th least-loaded (k < PAIRS), and the
most-loaded also with each of the PARTNERS least-loaded (every other rank up to
EVERY_PARTNER ranks); per pair it finds, by binary search over the light rank's costs, the
one swap or move that evens the pair best while both ranks stay within token room, and
applies it (the most-loaded rank's best pair first). The most-loaded rank's partners past
the FIRST_PARTNERS lightest are searched only where one of them could beat its best pair so
far (a pair's larger load after a swap is at least half their sum). A round costs
O(P log P) per pair, not O(P^2). Swaps only lower the larger load of a pair, so the step's
most-loaded rank never gets heavier. A step stops when its most-loaded rank finds no swap
or is within 2^-CLOSE_BITS of the lower bound.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mds.planner.plan.bounds import lower_bound
from mds.planner.plan.row_ops import INF, KEY_BITS, KEY_COST, ranks_by_load, rows_take

__all__ = ["CLOSE_BITS", "EVERY_PARTNER", "refine"]

PAIRS = 64  # heavy/light rank pairs per step and round
PARTNERS = 128  # light ranks the most-loaded rank tries per round
FIRST_PARTNERS = 8  # of which these first; the rest only where they might do better
# Up to this many ranks the most-loaded rank tries every other rank, not just the light half.
EVERY_PARTNER = 16
REFINE_ROUNDS = 96
# A step within 2^-CLOSE_BITS (about 0.1%) of its lower bound is not refined further: below
# that, rounds cost more than the balance they win.
CLOSE_BITS = 10


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
    keys = ((np.arange(len(rows), dtype=np.int64)[:, None] << KEY_BITS) | cost).ravel()
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
    want = np.clip(ch - ((lh - ll) // 2)[:, None], 0, KEY_COST - 1)
    at = ru[:, None]
    pos = np.searchsorted(lights.keys, ((at << KEY_BITS) | want).ravel()).reshape(-1, W)
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
        nl_r = rows_take(lm_f[lights.rows], lights.slot).reshape(-1)
        dtok = (lm_f[rh[near]][:, :, None] - nl_r[j[near]].reshape(-1, W, 2)).reshape(-1, 2 * W)
        full = (kh[near, None] - dtok > cap_rank) | (kl[near, None] + dtok > cap_rank)
        over[near] = np.where(full, INF, over[near])
    best = np.argmin(over, axis=1)
    rows = np.arange(len(rh))
    best_over = over[rows, best]
    score = np.where(best_over < gap[:, 0], ll + best_over, INF)
    return np.stack([score, best // 2, lights.slot.reshape(-1)[j[rows, best]], delta[rows, best]])


def refine(
    slots: np.ndarray,
    cm: np.ndarray,
    lm: np.ndarray,
    cost: np.ndarray,
    length: np.ndarray,
    cap_rank: int,
    skip: np.ndarray,
) -> None:
    """Step 3 of the balancer (see the module docstring), in place on `slots` and their costs `cm` and token
    counts `lm` ([T, D, W], 0 for empty slots); steps in `skip` stay as they are.
    Costs of 2^41 or more (never in a plan: they are scaled to <= 2^40) or 2^21 slots per
    rank skip it (packed keys would not fit 63 bits)."""
    T, D, W = slots.shape
    if D < 2 or T == 0 or int(cost.max(initial=0)) >= KEY_COST or W > 1 << 21:
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
        by_load = ranks_by_load(load[t])
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
