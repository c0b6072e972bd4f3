"""Context parallelism (CP) in the plan's stats: per step, how long the step takes when each
DP rank's micro-batches are laid over `cp` CP ranks, for three layouts of the same samples
(docs/context-parallel.md):

- mds: src/mds/core/cp_layout.py, long samples split head-tail, short ones whole on one CP
  rank (the layout the executor computes from the plan, with the same arguments);
- head-tail everywhere: every sample split head-tail over every CP rank;
- contiguous: every sample cut into cp contiguous pieces, CP rank i holding tokens
  [floor(i*L/cp), floor((i+1)*L/cp)) (no padding), whose causal work grows with i.

Work is counted in cp_layout's integer units: `linear` per token plus 2 per causal
query-key pair. A micro-batch takes as long as its busiest CP rank, a DP rank as long as
the sum over its micro-batches, a step as long as its slowest DP rank.

The lower bound of a step, valid for every layout and every assignment of the samples to
DP ranks and micro-batches: max(ceil(W / (D*cp)), max over samples of ceil(w / cp)), where
w = linear*L + L*(L+1) is a sample's work kept whole and W the step's sum of w. A split
never does less work than whole (head-tail pads: cp x its per-rank work is w of the padded
length; contiguous pieces add up to w exactly), so the D*cp ranks together do at least W,
and a DP rank's time, a sum of busiest CP ranks, is at least its work / cp; and no CP rank
can hold less than 1/cp of a sample's work however the sample is cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mds.core.cp_layout import SPLIT, cp_layout, rank_work, split_work, whole_work
from mds.planner.plan.bounds import group_sums

__all__ = [
    "CP_LAYOUTS",
    "CP_STAT_COLUMNS",
    "CellWork",
    "cell_work",
    "contiguous_rank_work",
    "cp_lower_bound",
    "cp_stats",
    "plan_cells",
]

# Per step: the step time (max over DP ranks of the sum of busiest CP ranks) for mds's layout,
# its lower bound, the same for head-tail everywhere and contiguous; the mean over the
# step's non-empty micro-batches of busiest / mean CP-rank work, in millionths, for the
# three; samples mds splits, and the padding tokens of its split samples.
CP_STAT_COLUMNS = (
    "cp_max_rank_work",
    "cp_lower_bound",
    "cp_headtail_max_rank_work",
    "cp_contiguous_max_rank_work",
    "cp_imbalance_ppm",
    "cp_headtail_imbalance_ppm",
    "cp_contiguous_imbalance_ppm",
    "cp_split_samples",
    "cp_padding",
)
CP_LAYOUTS = ("mds", "headtail", "contiguous")
PPM = 1_000_000


def contiguous_rank_work(length: np.ndarray, cp: int, linear: int) -> np.ndarray:
    """[n, cp]: each CP rank's work for samples cut into cp contiguous pieces, rank i
    holding tokens [floor(i*L/cp), floor((i+1)*L/cp)): the queries at positions s+1..e
    (1-based) each see that many keys, (e(e+1) - s(s+1)) / 2 pairs."""
    L = np.asarray(length, dtype=np.int64)[:, None]
    i = np.arange(cp + 1, dtype=np.int64)[None, :]
    edge = i * L // cp
    s, e = edge[:, :-1], edge[:, 1:]
    return linear * (e - s) + e * (e + 1) - s * (s + 1)


def cp_lower_bound(
    length: np.ndarray, valid: np.ndarray, D: int, cp: int, linear: int
) -> np.ndarray:
    """Per step [T]: max(ceil(W / (D*cp)), max ceil(w / cp)) (see the module docstring)."""
    w = np.where(valid, whole_work(length, linear), 0)
    total = -(-w.sum(axis=1) // (D * cp))
    top = -(-w.max(axis=1, initial=0) // cp)
    return np.maximum(total, top)


@dataclass
class CellWork:
    """Per micro-batch (cell): for each layout its busiest CP rank's work and the sum over
    its CP ranks; for mds's layout the samples split and their padding tokens."""

    busiest: dict[str, np.ndarray]  # layout -> [cells] int64
    total: dict[str, np.ndarray]  # layout -> [cells] int64
    split: np.ndarray  # [cells] int64
    padding: np.ndarray  # [cells] int64


def plan_cells(rank, micro, valid, D: int, M: int) -> tuple[np.ndarray, np.ndarray]:
    """The samples of a chunk as the plan stores them: (t, j) of every valid slot in
    (step, rank, micro-batch, slot) order, and the cell (t*D + rank)*M + micro of each."""
    t, j = np.nonzero(valid)
    cell = (t * D + rank[t, j]) * M + micro[t, j]
    order = np.argsort(cell, kind="stable")  # j ascends inside a cell, as in the plan
    return np.stack([t[order], j[order]]), cell[order]


def cell_work(
    lengths: np.ndarray, cell: np.ndarray, cells: int, cp: int, split_from: int, linear: int
) -> CellWork:
    """CP work of each micro-batch: `lengths` of the samples in plan order, `cell` (sorted)
    the micro-batch of each, in [0, cells)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    busiest, total = {}, {}
    # Head-tail everywhere: every CP rank does the same, the sum of split_work.
    ht = group_sums(cell, split_work(lengths, cp, linear), cells)
    busiest["headtail"], total["headtail"] = ht, ht * cp
    # Contiguous: per CP rank, then the busiest.
    per_rank = np.zeros((cells, cp), dtype=np.int64)
    for lo in range(0, len(lengths), 1 << 20):  # bounded memory: [block, cp] at a time
        part = contiguous_rank_work(lengths[lo : lo + (1 << 20)], cp, linear)
        ids = cell[lo : lo + (1 << 20)]
        for i in range(cp):
            per_rank[:, i] += group_sums(ids, part[:, i], cells)
    busiest["contiguous"], total["contiguous"] = per_rank.max(axis=1), per_rank.sum(axis=1)
    # mds: cp_layout per micro-batch.
    top = np.zeros(cells, dtype=np.int64)
    tot = np.zeros(cells, dtype=np.int64)
    split = np.zeros(cells, dtype=np.int64)
    padding = np.zeros(cells, dtype=np.int64)
    bounds = np.searchsorted(cell, np.arange(cells + 1)).tolist()
    as_list = lengths.tolist()
    for c in np.flatnonzero(np.diff(bounds)).tolist():
        ls = as_list[bounds[c] : bounds[c + 1]]
        layout = cp_layout(ls, cp, split_from, linear)
        work = rank_work(ls, layout, cp, linear)
        top[c], tot[c] = max(work), sum(work)
        cut = [n for n, r in zip(ls, layout, strict=True) if r == SPLIT]
        split[c] = len(cut)
        padding[c] = sum(-(-n // (2 * cp)) * 2 * cp - n for n in cut)
    busiest["mds"], total["mds"] = top, tot
    return CellWork(busiest, total, split, padding)


def _imbalance_ppm(busiest: np.ndarray, total: np.ndarray, cp: int, T: int) -> np.ndarray:
    """Per step: mean over its non-empty micro-batches of busiest / (total / cp), in
    millionths (1e6 for a step without work)."""
    busy = busiest.reshape(T, -1).astype(np.float64)
    tot = total.reshape(T, -1).astype(np.float64)
    used = tot > 0
    r = np.where(used, busy * cp / np.where(used, tot, 1.0), 0.0)
    n = used.sum(axis=1)
    mean = np.where(n > 0, r.sum(axis=1) / np.maximum(n, 1), 1.0)
    return np.rint(mean * PPM).astype(np.int64)


def cp_stats(
    rank, micro, length, valid, D: int, M: int, cp: int, split_from: int, linear: int
) -> np.ndarray:
    """Per-step rows of CP_STAT_COLUMNS for a chunk: `rank`, `micro` the balancer's
    assignment [T, N], `length` the planned lengths the balancer packed."""
    T = length.shape[0]
    (t, j), cell = plan_cells(rank, micro, valid, D, M)
    cells = T * D * M
    work = cell_work(length[t, j], cell, cells, cp, split_from, linear)

    def step_time(busiest):  # [cells] -> [T]: max over DP ranks of the sum over micro-batches
        return busiest.reshape(T, D, M).sum(axis=2).max(axis=1)

    per_step = lambda x: x.reshape(T, -1).sum(axis=1)  # noqa: E731
    out = np.stack(
        [
            step_time(work.busiest["mds"]),
            cp_lower_bound(length, valid, D, cp, linear),
            step_time(work.busiest["headtail"]),
            step_time(work.busiest["contiguous"]),
            *(_imbalance_ppm(work.busiest[k], work.total[k], cp, T) for k in CP_LAYOUTS),
            per_step(work.split),
            per_step(work.padding),
        ],
        axis=1,
    )
    return out.astype(np.int64)
