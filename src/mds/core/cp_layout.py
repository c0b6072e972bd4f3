"""How the samples of one micro-batch lie over a context-parallel (CP) group: each sample is
either split head-tail over every CP rank or kept whole on one CP rank. A pure function of
the micro-batch's sample lengths (in plan order) and the plan's CP settings, so the planner
(costs, stats) and every CP rank of the executor (its slice) compute the same layout, and
no rank needs to all-gather lengths during training.

Head-tail ("zigzag") split, as Transformer Engine and Megatron-core do it for packed (THD)
batches: a sample of L tokens is padded to P = ceil(L / 2cp) * 2cp and cut into 2cp chunks
of c = P / 2cp; CP rank i holds chunks i and 2cp-1-i. Under causal attention chunk j costs
c*j*c + c(c+1)/2 query-key pairs, so every rank's pair holds the same work, 2cp*c^2 + c,
where a contiguous split would give the last rank about 2cp-1 times the first's.

Samples of at least `split_from` tokens are split (a long sample is where CP pays); shorter
ones stay whole, which saves their K/V exchange and padding: by greedy LPT on their cost,
largest first (ties by position), each to the CP rank with the least work so far, and the
largest of them split as long as that lowers the busiest rank's work. Work is
counted in integer units, `linear` per token plus 2 per query-key pair (a*L + b*L^2 of a
causal model's cost with linear = round(a / b)), so the layout is the same on every machine.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SPLIT", "chunk_size", "cp_layout", "rank_work", "split_work", "whole_work"]

SPLIT = -1  # a sample split head-tail over every CP rank


def chunk_size(length: int | np.ndarray, cp: int):
    """Tokens per chunk of a split sample (its padded length / 2cp)."""
    return -(-np.asarray(length) // (2 * cp))


def whole_work(length: np.ndarray, linear: int) -> np.ndarray:
    """Work of samples kept whole: `linear` per token plus 2 per causal query-key pair."""
    L = np.asarray(length, dtype=np.int64)
    return linear * L + L * (L + 1)


def split_work(length: np.ndarray, cp: int, linear: int) -> np.ndarray:
    """Work each CP rank does for a split sample: 2c tokens (padding included) and 2cp*c^2 + c
    query-key pairs (see the module docstring)."""
    c = chunk_size(np.asarray(length, dtype=np.int64), cp)
    return linear * 2 * c + 2 * (2 * cp * c * c + c)


def _place_whole(lengths: np.ndarray, split: np.ndarray, cp: int, linear: int) -> np.ndarray:
    """Split samples SPLIT; the others by greedy LPT (largest first, ties by position)."""
    out = np.full(len(lengths), SPLIT, dtype=np.int64)
    whole = np.flatnonzero(~split)
    cost = whole_work(lengths[whole], linear)
    load = np.zeros(cp, dtype=np.int64)
    for k, w in zip(whole[np.lexsort((whole, -cost))].tolist(), np.sort(cost)[::-1].tolist(), strict=True):
        r = int(np.argmin(load))
        out[k] = r
        load[r] += w
    return out


def cp_layout(lengths: np.ndarray, cp: int, split_from: int, linear: int) -> np.ndarray:
    """Per sample (in the micro-batch's order): SPLIT, or the CP rank that holds it whole.

    Samples of `split_from` tokens or more are split, the rest placed whole by LPT; then,
    while the busiest CP rank would be less busy with the largest whole sample (of at least
    2cp tokens) split too, that sample is split. So a short micro-batch keeps its samples
    whole, and a lone medium sample is split rather than left on one rank."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if cp <= 1:
        return np.zeros(len(lengths), dtype=np.int64)
    split = lengths >= split_from
    layout = _place_whole(lengths, split, cp, linear)
    top = int(rank_work(lengths, layout, cp, linear).max(initial=0))
    while True:
        whole = np.flatnonzero(~split & (lengths >= 2 * cp))
        if whole.size == 0:
            return layout
        cost = whole_work(lengths[whole], linear)
        k = int(whole[np.lexsort((whole, -cost))[0]])
        trial = split.copy()
        trial[k] = True
        placed = _place_whole(lengths, trial, cp, linear)
        busiest = int(rank_work(lengths, placed, cp, linear).max(initial=0))
        if busiest >= top:
            return layout
        split, layout, top = trial, placed, busiest


def rank_work(lengths: np.ndarray, layout: np.ndarray, cp: int, linear: int) -> np.ndarray:
    """Each CP rank's work for the micro-batch under `layout`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    split = layout == SPLIT
    out = np.full(cp, int(split_work(lengths[split], cp, linear).sum()), dtype=np.int64)
    whole = ~split
    np.add.at(out, layout[whole], whole_work(lengths[whole], linear))
    return out
