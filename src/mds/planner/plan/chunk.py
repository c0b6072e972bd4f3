"""Planning one chunk of steps: the Planner holds everything any chunk needs (pools,
streams, mixer, fetch records) and plans steps [a, b) from the mixing state at a: the
samples the mixer chose, balanced over DP ranks and micro-batches, with per-step stats.
A chunk is a pure function of the config, the index and that state, so chunks are planned
in any process and in any order (plan/build.py runs them and writes the file).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from mds.core.planfile import ChunkBlocks, EncodedChunk
from mds.planner.index.tables import IndexManifest, read_manifest
from mds.planner.plan.balance import balance
from mds.planner.plan.balance_parts import balance_parts, part_bounds
from mds.planner.plan.bounds import group_sums, interleave_ranks, lower_bound, naive_ranks
from mds.planner.plan.config import PlanConfig
from mds.planner.plan.cost_band import band_applies, band_loads
from mds.planner.plan.cp import CP_STAT_COLUMNS, cp_stats
from mds.planner.plan.fetch import FetchTable
from mds.planner.plan.mixing import Mixer, MixState
from mds.planner.plan.pool import SourcePool, load_pools
from mds.planner.plan.stream import SourceStream

__all__ = ["CP_STAT_COLUMNS", "STAT_COLUMNS", "VISION_STAT_COLUMNS", "ChunkResult", "Planner", "stat_columns"]

STAT_COLUMNS = (
    "samples",
    "tokens",
    "cost",
    "max_rank_cost",
    "min_rank_cost",
    "lower_bound",
    "naive_max_rank_cost",
    "max_micro_tokens",
    "max_micro_cost",
    "interleave_max_rank_cost",
)
# Plans with [vision] add, per step: the encoder's part of the cost and the backbone's,
# each with its most-loaded rank, lower bound and naive sharding's most-loaded rank, and
# the patches (all, and the fullest micro-batch's).
VISION_STAT_COLUMNS = (
    "encoder_cost",
    "max_rank_encoder",
    "encoder_lower_bound",
    "naive_max_rank_encoder",
    "max_rank_backbone",
    "backbone_lower_bound",
    "naive_max_rank_backbone",
    "patches",
    "max_micro_patches",
)


def stat_columns(config: PlanConfig) -> tuple[str, ...]:
    """The stats section's columns for a plan of `config`."""
    vision = VISION_STAT_COLUMNS if config.vision is not None else ()
    return STAT_COLUMNS + vision + (CP_STAT_COLUMNS if config.train.cp_size > 1 else ())


@dataclass
class ChunkResult:
    """One planned chunk: per-rank (counts, ids, fetch records) blocks and per-step stats."""

    start: int
    end: int
    blocks: ChunkBlocks | EncodedChunk  # per rank (counts, ids, fetch); encoded in workers
    stats: np.ndarray  # [steps, len(STAT_COLUMNS)] int64
    source_samples: np.ndarray  # [steps, sources] int64
    # Plans with the built-in default cost only: per step, the most-loaded planned and naive
    # rank under each of BAND_FACTORS' quadratic weights (plan/cost_band.py).
    band: np.ndarray | None = None


class Planner:
    """Everything needed to plan any chunk: pools, streams, mixer (see module docstring)."""

    def __init__(
        self,
        config: PlanConfig,
        manifest: IndexManifest | None = None,
        start: MixState | None = None,
        lineage: dict[str, Any] | None = None,
    ):
        """`start`: the mixing state to plan from (a plan derived from another at step K
        starts at K with the parent's cursors; `lineage` records that in the footer)."""
        self.config = config
        self.start = start
        self.lineage = lineage
        self.index_place: str | None = None  # the index's URL when read from object storage
        self.manifest = manifest or read_manifest(config.index)
        self.pools: list[SourcePool] = load_pools(config, self.manifest)
        self.streams = [SourceStream(p, config.train.seed) for p in self.pools]
        left_out = dict(config.excluded)
        for stream in self.streams:
            if stream.pool.name in left_out:
                stream.exclude(left_out[stream.pool.name])
        self.mixer = Mixer(config, self.pools, self.streams)
        self.fetch = FetchTable(self.manifest, self.pools)
        # Global ids this plan leaves out (its own --exclude and its parent's), sorted.
        self.excluded_ids = np.zeros(0, np.int64)
        # --skip-steps: the parent plan and the runs of its steps copied before the planned
        # ones, as (new start, old start, old end) (plan/skip.py)
        self.parent: Any = None
        self.copied: list[tuple[int, int, int]] = []
        self.total_rows = sum(int(s["rows"]) for s in self.manifest.sources)

    @property
    def id_width(self) -> int:
        """Bytes per global sample id in the plan file."""
        return max(1, (max(self.total_rows - 1, 1).bit_length() + 7) // 8)

    @property
    def first_step(self) -> int:
        if self.copied:
            return self.copied[0][0]
        return self.start.step if self.start is not None else 0

    def start_state(self) -> MixState:
        return self.start.copy() if self.start is not None else self.mixer.start()

    def boundaries(self) -> list[tuple[int, int]]:
        steps, size = self.config.train.steps, self.config.chunk_steps
        first = self.start.step if self.start is not None else 0
        return [(a, min(a + size, steps)) for a in range(first, steps, size)]

    def mix_chunks(self) -> Iterator[tuple[MixState, int, np.ndarray, MixState]]:
        """The sequential mixing pass: per chunk (state at its start, end step, counts,
        state at its end)."""
        state = self.start_state()
        for _a, b in self.boundaries():
            counts, after = self.mixer.run(state, b)
            yield state, b, counts, after
            state = after

    def states(self) -> list[MixState]:
        """Mixing state at the start of every chunk, plus the final state."""
        out = [self.start_state()]
        out += [after for _state, _b, _counts, after in self.mix_chunks()]
        return out

    def plan_chunk(
        self, state: MixState, end: int, counts: np.ndarray | None = None
    ) -> ChunkResult:
        """Steps [state.step, end); `counts` are the mixer's counts for them, if known."""
        train = self.config.train
        a = state.step
        T, D, M = end - a, train.dp_size, train.micro_batches
        if counts is None:
            counts, _ = self.mixer.run(state, end)  # [T, S]
        per_step = counts.sum(axis=1)
        width = int(per_step.max(initial=0))
        gid = np.zeros((T, width), dtype=np.int64)
        length = np.zeros((T, width), dtype=np.int64)
        cost = np.zeros((T, width), dtype=np.int64)
        vision = self.config.vision is not None
        enc = np.zeros((T, width), dtype=np.int64) if vision else None
        patches = np.zeros((T, width), dtype=np.int64) if vision else None
        valid = np.arange(width)[None, :] < per_step[:, None]
        offsets = np.cumsum(counts, axis=1) - counts  # where each source starts inside a step
        for s, (pool, stream) in enumerate(zip(self.pools, self.streams, strict=True)):
            total = int(counts[:, s].sum())
            if total == 0:
                continue
            pos = stream.positions(int(state.consumed[s]), total)
            step_of = np.repeat(np.arange(T), counts[:, s])
            first = np.cumsum(counts[:, s]) - counts[:, s]
            slot = offsets[step_of, s] + np.arange(total) - first[step_of]
            gid[step_of, slot] = pool.base + pool.rows[pos]
            length[step_of, slot] = pool.lengths[pos]
            cost[step_of, slot] = pool.costs[pos]
            if vision:
                enc[step_of, slot] = pool.enc_costs[pos]
                patches[step_of, slot] = pool.patches[pos]
        steps = np.arange(a, end)
        capacity = train.max_tokens_per_micro_batch
        if vision:
            assign = balance_parts(
                enc, cost - enc, length, patches, valid, steps, D, M, capacity,
                train.max_patches_per_micro_batch,
            )
        else:
            assign = balance(cost, length, valid, steps, D, M, capacity)
        per_cell, ids, bounds = _blocks(assign, gid, valid, T, D, M)
        columns, files = self.fetch.chunk_records(ids, bounds)
        blocks = ChunkBlocks(per_cell, ids, bounds, columns, files)
        stats = _stats(assign, cost, length, valid, steps, D, M)
        if vision:
            stats = np.concatenate(
                [stats, _vision_stats(assign, enc, cost - enc, patches, valid, steps, D, M)], axis=1
            )
        if train.cp_size > 1:  # CP plans: the step time over DP x CP ranks (plan/cp.py)
            cp = cp_stats(
                assign.rank, assign.micro, length, valid, D, M,
                train.cp_size, train.cp_split_from, train.cp_linear,
            )  # fmt: skip
            stats = np.concatenate([stats, cp], axis=1)
        band = None
        if band_applies(self.config):
            band = band_loads(assign.rank, length, valid, steps, D, self.config.cost)
        return ChunkResult(a, end, blocks, stats, counts, band)


def _blocks(
    assign, gid: np.ndarray, valid: np.ndarray, T: int, D: int, M: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sample counts [D, T, M], the global ids by rank and then in (step, micro-batch,
    slot) order, and where each rank's ids start and end in them ([D + 1])."""
    t, j = np.nonzero(valid)
    r, m = assign.rank[t, j], assign.micro[t, j]
    cell = (r * T + t) * M + m
    order = _stable_order(cell, D * T * M)  # (t, j) come in order: j ascends in a cell
    ids = gid[t, j][order]
    per_cell = np.bincount(cell, minlength=D * T * M).reshape(D, T, M)
    bounds = np.concatenate([[0], np.cumsum(per_cell.reshape(D, -1).sum(axis=1))])
    return per_cell, ids, bounds


def _stable_order(keys: np.ndarray, size: int) -> np.ndarray:
    """np.argsort(keys, kind="stable") for keys in [0, size): numpy radix-sorts 16-bit keys,
    so keys below 2^32 take two such passes (least significant half first)."""
    if size <= 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    if size <= 1 << 32:
        low = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
        return low[np.argsort((keys[low] >> 16).astype(np.uint16), kind="stable")]
    return np.argsort(keys, kind="stable")


def _stats(assign, cost, length, valid, steps, D: int, M: int) -> np.ndarray:
    """Per-step rows of STAT_COLUMNS, costs in integer units."""
    T = cost.shape[0]
    naive = naive_ranks(valid, D, steps)
    rows = np.arange(T)[:, None]
    naive_load = group_sums(rows * (D + 1) + np.where(naive >= 0, naive, D), cost, T * (D + 1))
    naive_load = naive_load.reshape(T, D + 1)
    inter = interleave_ranks(valid, D)
    inter_load = group_sums(rows * (D + 1) + np.where(inter >= 0, inter, D), cost, T * (D + 1))
    inter_load = inter_load.reshape(T, D + 1)
    cell = rows * (D * M + 1) + np.where(valid, assign.rank * M + assign.micro, D * M)
    micro_tok = group_sums(cell, length, T * (D * M + 1)).reshape(T, D * M + 1)
    micro_cost = group_sums(cell, cost, T * (D * M + 1)).reshape(T, D * M + 1)
    out = np.stack(
        [
            valid.sum(axis=1),
            length.sum(axis=1),
            cost.sum(axis=1),
            assign.load.max(axis=1),
            assign.load.min(axis=1),
            lower_bound(cost, D),
            naive_load[:, :D].max(axis=1),
            micro_tok[:, : D * M].max(axis=1),
            micro_cost[:, : D * M].max(axis=1),
            inter_load[:, :D].max(axis=1),
        ],
        axis=1,
    )
    return out.astype(np.int64)


def _vision_stats(assign, enc, bb, patches, valid, steps, D: int, M: int) -> np.ndarray:
    """Per-step rows of VISION_STAT_COLUMNS (the naive ranks are _stats' own)."""
    T = enc.shape[0]
    rows = np.arange(T)[:, None]
    naive = naive_ranks(valid, D, steps)

    def per_rank(ranks, values):
        cell = rows * (D + 1) + np.where(valid & (ranks >= 0), ranks, D)
        return group_sums(cell, values, T * (D + 1)).reshape(T, D + 1)[:, :D]

    cell = rows * (D * M + 1) + np.where(valid, assign.rank * M + assign.micro, D * M)
    micro_patches = group_sums(cell, patches, T * (D * M + 1)).reshape(T, D * M + 1)
    out = np.stack(
        [
            np.where(valid, enc, 0).sum(axis=1),
            per_rank(assign.rank, enc).max(axis=1),
            part_bounds(enc, valid, D),
            per_rank(naive, enc).max(axis=1),
            per_rank(assign.rank, bb).max(axis=1),
            part_bounds(bb, valid, D),
            per_rank(naive, bb).max(axis=1),
            np.where(valid, patches, 0).sum(axis=1),
            micro_patches[:, : D * M].max(axis=1),
        ],
        axis=1,
    )
    return out.astype(np.int64)
