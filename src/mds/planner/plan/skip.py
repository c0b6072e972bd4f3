"""`mds plan --from OLD --at-step K --skip-steps A:B`: the old plan from K without steps
A..B-1, so no other sample moves.

New steps K..A-1 are the old ones exactly (same ranks, micro-batches, order, fetch records
and stats); the old steps from B on follow, renumbered; the steps missing at the end (as
many as were skipped, to keep the run's [train] steps) are planned anew from the old plan's
end cursors, as a re-plan from its last step would. Several ranges may be skipped at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from mds.core.planfile import ChunkBlocks
from mds.core.planfile_reader import PlanReader
from mds.errors import ConfigError
from mds.planner.plan.chunk import ChunkResult, Planner, stat_columns
from mds.planner.plan.derive import cursor_state
from mds.planner.plan.mixing import MixState

__all__ = ["copied_chunks", "kept_segments", "check_skips"]


def kept_segments(at_step: int, end: int, skipped: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """The old plan's steps [at_step, end) without the skipped ranges, as (new start, old
    start, old end) runs: the new plan's step new start holds the old step old start."""
    out, new, old = [], at_step, at_step
    for a, b in [*skipped, (end, end)]:
        if a > old:
            out.append((new, old, a))
            new += a - old
        old = max(old, b)
    return out


def check_skips(reader: PlanReader, planner: Planner, at_step: int, skipped) -> None:
    """The new plan copies the old one's blocks: its geometry and sources must be the old
    plan's, and every skipped range inside the old plan's steps from K."""
    old = reader.footer
    train = planner.config.train
    if (reader.dp, reader.micro) != (train.dp_size, train.micro_batches):
        raise ConfigError(
            f"--skip-steps keeps {reader.path}'s steps as they are: keep its dp_size "
            f"{reader.dp} and micro_batches {reader.micro} (got {train.dp_size} and "
            f"{train.micro_batches}); re-plan without --skip-steps to change them"
        )
    names = [s["name"] for s in old["sources"]]
    if names != [p.name for p in planner.pools]:
        raise ConfigError(
            f"--skip-steps keeps {reader.path}'s steps as they are: keep its sources "
            f"{', '.join(names)} in the same order (weights may change)"
        )
    if list(old["stats_columns"]) != list(stat_columns(planner.config)):
        raise ConfigError(f"--skip-steps: {reader.path} was planned with other statistics")
    for a, b in skipped:
        if not at_step <= a < b <= reader.steps:
            raise ConfigError(
                f"--skip-steps {a}:{b}: must lie within --at-step {at_step} and the end of "
                f"{reader.path} ({reader.steps} steps)"
            )


def copied_chunks(
    planner: Planner, parent: Path | str, segments: list[tuple[int, int, int]], states: list[MixState]
) -> Iterator[ChunkResult]:
    """The kept old steps as chunks of the new plan (one per old chunk they overlap), in
    order; appends each chunk's start state to `states`."""
    train = planner.config.train
    D = train.dp_size
    with PlanReader(parent) as reader:
        stats = np.asarray(reader.section("stats"), dtype=np.int64)
        mixed = np.asarray(reader.section("source_samples"), dtype=np.int64)
        first = reader.first_step
        for new, lo, hi in segments:
            step = lo
            while step < hi:
                c = reader.chunk_of(step)
                a, b = reader.chunks[c][0], reader.chunks[c][1]
                end = min(b, hi)
                states.append(cursor_state(planner, reader, step, new + step - lo))
                per_cell, ids, bounds = [], [], [0]
                for rank in range(D):
                    block = reader.rank_chunk(c, rank)
                    before = block.counts[: step - a].sum()
                    counts = block.counts[step - a : end - a]
                    per_cell.append(counts)
                    ids.append(block.ids[before : before + counts.sum()].astype(np.int64))
                    bounds.append(bounds[-1] + int(counts.sum()))
                all_ids = np.concatenate(ids)
                edges = np.array(bounds, dtype=np.int64)
                columns, files = planner.fetch.chunk_records(all_ids, edges)
                blocks = ChunkBlocks(np.stack(per_cell), all_ids, edges, columns, files)
                yield ChunkResult(
                    new + step - lo,
                    new + end - lo,
                    blocks,
                    stats[step - first : end - first],
                    mixed[step - first : end - first],
                )
                step = end
