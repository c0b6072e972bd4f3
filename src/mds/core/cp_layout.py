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

Work is counted in integer units, `linear` per token plus 2 per causal query-key pair (a*L +
b*L^2 of a causal model's cost with linear = round(a / b)), so the layout is the same on
every machine. The decision, per micro-batch:

1. samples of at least `split_from` tokens are split (a long sample is where CP pays);
2. the others stay whole, which saves their K/V exchange and padding, placed by greedy
   LPT (largest work first, ties by position) on the least-busy CP rank; but a sample whose
   whole work is more than 2^-s of a CP rank's share (the micro-batch's whole-sample work /
   cp) is split too, for s = 3, 5, 7 in turn, until the busiest CP rank does at most
   2^-SLACK_BITS more than under head-tail everywhere;
3. where no s gets there, every sample is split (head-tail everywhere).

So a micro-batch of many short samples keeps them whole, and the layout is never more than
2^-SLACK_BITS busier than splitting everything (in this compute model, which does not count
the K/V exchange that keeping samples whole saves).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "SLACK_BITS",
    "SPLIT",
    "chunk_size",
    "cp_layout",
    "rank_work",
    "split_work",
    "whole_work",
]

SPLIT = -1  # a sample split head-tail over every CP rank
SLACK_BITS = 7  # how much busier than head-tail everywhere a layout may be: 2^-7 (0.8%)
SHARE_SHIFTS = (3, 5, 7)  # step 2: samples above 2^-s of a CP rank's share are split


def chunk_size(length, cp: int):
    """Tokens per chunk of a split sample (its padded length / 2cp); ints or arrays."""
    return -(-length // (2 * cp))


def whole_work(length, linear: int):
    """Work of a sample kept whole: `linear` per token plus 2 per causal query-key pair."""
    return linear * length + length * (length + 1)


def split_work(length, cp: int, linear: int):
    """Work each CP rank does for a split sample: 2c tokens (padding included) and
    2cp*c^2 + c query-key pairs (see the module docstring)."""
    c = chunk_size(length, cp)
    return linear * 2 * c + 2 * (2 * cp * c * c + c)


def _place(
    lengths: list[int], split: list[bool], cp: int, linear: int
) -> tuple[list[int], int]:
    """(layout, busiest CP rank's work): split samples SPLIT, the others by greedy LPT."""
    out = [SPLIT] * len(lengths)
    cut = sum(split_work(n, cp, linear) for n, s in zip(lengths, split, strict=True) if s)
    whole = sorted((-whole_work(n, linear), k) for k, n in enumerate(lengths) if not split[k])
    load = [0] * cp
    for neg, k in whole:
        r = load.index(min(load))
        out[k] = r
        load[r] -= neg
    return out, cut + max(load)


def cp_layout(lengths: Sequence[int], cp: int, split_from: int, linear: int) -> list[int]:
    """Per sample (in the micro-batch's order): SPLIT, or the CP rank that holds it whole
    (the module docstring's rule)."""
    ls = [int(n) for n in lengths]
    if cp <= 1:
        return [0] * len(ls)
    everywhere = sum(split_work(n, cp, linear) for n in ls)
    limit = everywhere + (everywhere >> SLACK_BITS)
    forced = [n >= split_from for n in ls]
    work = [whole_work(n, linear) for n in ls]
    total = sum(w for w, f in zip(work, forced, strict=True) if not f)
    for shift in SHARE_SHIFTS:
        split = [
            f or (n >= 2 * cp and (w * cp << shift) > total)
            for n, w, f in zip(ls, work, forced, strict=True)
        ]
        layout, busiest = _place(ls, split, cp, linear)
        if busiest <= limit:
            return layout
    return [SPLIT] * len(ls)


def rank_work(lengths: Sequence[int], layout: Sequence[int], cp: int, linear: int) -> list[int]:
    """Each CP rank's work for the micro-batch under `layout`."""
    ls = [int(n) for n in lengths]
    cut = sum(split_work(n, cp, linear) for n, r in zip(ls, layout, strict=True) if r == SPLIT)
    out = [cut] * cp
    for n, r in zip(ls, layout, strict=True):
        if r != SPLIT:
            out[r] += whole_work(n, linear)
    return out
