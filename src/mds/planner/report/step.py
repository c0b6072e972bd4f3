"""One step of a plan, sample by sample, for the ranks asked: where each sample lives in the
source files, its tokens and cost, and per-rank and per-micro-batch totals.

Only the asked ranks' blocks of the step's chunk are read from the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from mds.core.planfile_reader import PlanReader
from mds.errors import ConfigError
from mds.planner.index.tables import IndexManifest
from mds.planner.report.common import SCHEMA, index_place, plan_index
from mds.planner.report.export import block_frame, locate
from mds.planner.report.plan import step_stats

__all__ = ["step_report", "step_slots"]

_SCHEMA = {
    "rank": pl.Int64,
    "micro_batch": pl.Int64,
    "source": pl.String,
    "row": pl.Int64,
    "file": pl.String,
    "file_row": pl.Int64,
    "offset": pl.Int64,
    "length": pl.Int64,
    "n_tokens": pl.Int64,
    "cost": pl.Float64,
    "cost_units": pl.Int64,
}


def _check(reader: PlanReader, step: int, ranks: Sequence[int]) -> None:
    if not reader.first_step <= step < reader.steps:
        first, last = reader.first_step, reader.steps - 1
        span = f"steps {first} to {last}" if first else f"{reader.steps} steps (0 to {last})"
        raise ConfigError(f"--step {step} is outside the plan's {span}")
    for rank in ranks:
        if not 0 <= rank < reader.dp:
            raise ConfigError(
                f"--rank {rank} is outside the plan's dp_size {reader.dp} (0 to {reader.dp - 1})"
            )


def step_slots(reader: PlanReader, step: int, ranks: Sequence[int]) -> pl.DataFrame:
    """(rank, micro_batch, gid) of every sample of `step` on `ranks`, in plan order."""
    chunk = reader.chunk_of(step)
    parts = [
        block_frame(reader.rank_chunk(chunk, rank), rank).filter(pl.col("step") == step)
        for rank in ranks
    ]
    return pl.concat(parts).drop("step").with_row_index("order")


def _locate(slots: pl.DataFrame, manifest: IndexManifest, footer: dict[str, Any]) -> pl.DataFrame:
    """Each slot's source, row, file path, location, n_tokens and cost (see export.locate)."""
    if slots.height == 0:
        return pl.DataFrame(schema=_SCHEMA)
    frame = locate(slots, manifest, footer)
    for column in ("offset", "length"):
        if column not in frame.columns:
            frame = frame.with_columns(pl.lit(None, dtype=pl.Int64).alias(column))
    return frame.select(pl.col(name).cast(dtype) for name, dtype in _SCHEMA.items())


def _totals(frame: pl.DataFrame, ranks: Sequence[int], micro: int) -> list[dict[str, Any]]:
    sums = frame.group_by("rank", "micro_batch").agg(
        pl.len().alias("samples"),
        pl.col("n_tokens").sum().alias("tokens"),
        pl.col("cost").sum().alias("cost"),
        pl.col("cost_units").sum().alias("cost_units"),
    )
    cell = {(r, m): (n, t, c, u) for r, m, n, t, c, u in sums.iter_rows()}
    out = []
    for rank in ranks:
        micro_batches = []
        for m in range(micro):
            n, t, c, u = cell.get((rank, m), (0, 0, 0.0, 0))
            micro_batches.append(
                {"micro_batch": m, "samples": n, "tokens": t, "cost": c, "cost_units": u}
            )
        out.append(
            {
                "rank": rank,
                **{
                    key: sum(mb[key] for mb in micro_batches)
                    for key in ("samples", "tokens", "cost", "cost_units")
                },
                "micro_batches": micro_batches,
            }
        )
    return out


def step_report(
    reader: PlanReader,
    step: int,
    ranks: Sequence[int] | None = None,
    index: str | Path | None = None,
) -> dict[str, Any]:
    """The `mds inspect PLAN --step K [--rank R]` report (docs/inspect.md, kind "step")."""
    ranks = sorted(set(ranks)) if ranks else list(range(reader.dp))
    _check(reader, step, ranks)
    footer = reader.footer
    manifest = plan_index(reader.path, footer, index)
    frame = _locate(step_slots(reader, step, ranks), manifest, footer)
    stats = {
        name: int(values[step - reader.first_step]) for name, values in step_stats(reader).items()
    }
    return {
        "schema": SCHEMA,
        "kind": "step",
        "path": str(reader.path),
        "plan_id": reader.plan_id,
        "index": index_place(manifest),
        "index_root": manifest.data.get("root"),
        "step": step,
        "dp_size": reader.dp,
        "micro_batches": reader.micro,
        "ranks": ranks,
        "stats": stats,
        "samples": frame.to_dicts(),
        "rank_totals": _totals(frame, ranks, reader.micro),
    }
