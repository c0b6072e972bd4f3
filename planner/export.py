"""Flatten a plan into one row per planned sample, joined with its index location.

For DuckDB or Polars: (step, rank, micro_batch, source, row, location, n_tokens, cost).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from mds.executor.manifest import plan_manifest
from mds.executor.planfile import PlanReader, RankChunk
from mds.planner.atomic import atomic_path, cannot_write
from mds.planner.index.manifest import IndexManifest, source_frame
from mds.planner.sqlexpr import signed_ints, sql_expr

__all__ = ["block_frame", "export_plan", "locate", "plan_frame", "sample_cost"]


_SLOT_SCHEMA = {"step": pl.Int64, "rank": pl.Int64, "micro_batch": pl.Int64, "gid": pl.Int64}


def block_frame(block: RankChunk, rank: int) -> pl.DataFrame:
    """One rank's block as rows of (step, rank, micro_batch, gid), in plan order."""
    T, M = block.counts.shape
    flat = block.counts.ravel()
    return pl.DataFrame(
        {
            "step": np.repeat(block.step_start + np.arange(T).repeat(M), flat),
            "rank": np.full(len(block.ids), rank, dtype=np.int64),
            "micro_batch": np.repeat(np.tile(np.arange(M), T), flat),
            "gid": block.ids.astype(np.int64),
        },
        schema=_SLOT_SCHEMA,
    )


def _slots(reader: PlanReader) -> pl.DataFrame:
    parts = [
        block_frame(reader.rank_chunk(chunk, rank), rank)
        for chunk in range(len(reader.chunks))
        for rank in range(reader.dp)
    ]
    return pl.concat(parts) if parts else pl.DataFrame(schema=_SLOT_SCHEMA)


def sample_cost(frame: pl.DataFrame, cost: dict, capacity: int, truncate: bool) -> pl.Series:
    """Each row's cost in configured units, from the canonical `cost` of a plan's config."""
    n = pl.col("n_tokens").cast(pl.Int64)
    if truncate:
        n = pl.min_horizontal(n, pl.lit(capacity))
    if "expr" in cost:
        # with_columns broadcasts a constant expression, as the planner's pools do
        expr = sql_expr(str(cost["expr"]), "the plan's [cost] expr")
        return signed_ints(frame).with_columns(expr.cast(pl.Float64).alias("cost"))["cost"]
    L = n.cast(pl.Float64)
    return frame.select((cost["a"] * L + cost["b"] * L * L).alias("cost"))["cost"]


def locate(slots: pl.DataFrame, manifest: IndexManifest, footer: dict) -> pl.DataFrame:
    """Join planned slots (columns `gid`, `order`, ...) to their index rows: source, row,
    file path, file_row (offset, length), n_tokens, kept metadata, cost and cost units
    (the integers the balancer used). Rows come back in `order`."""
    index_sources = footer["index"]["sources"]
    bases = np.array([s["base"] for s in index_sources], dtype=np.int64)
    sid = np.searchsorted(bases, slots["gid"].to_numpy(), side="right") - 1
    slots = slots.with_columns(
        pl.Series("source_id", sid), (pl.col("gid") - pl.Series(bases[sid])).alias("row")
    )
    train = footer["config"]["train"]
    out = []
    for (s,), part in slots.group_by("source_id", maintain_order=True):
        name = index_sources[int(s)]["name"]
        files = manifest.source(name)["files"]
        paths = pl.DataFrame(
            {"file_id": [f["id"] for f in files], "file": [f["path"] for f in files]},
            schema={"file_id": pl.UInt32, "file": pl.String},
        )
        table = (
            source_frame(manifest, name)
            .with_row_index("row")
            .with_columns(pl.col("row").cast(pl.Int64))
            .filter(pl.col("row").is_in(part["row"].unique().implode()))
            .collect()
        )
        joined = part.join(table, on="row", how="left").join(paths, on="file_id", how="left")
        joined = joined.with_columns(
            pl.lit(name).alias("source"),
            sample_cost(
                joined,
                footer["config"]["cost"],
                train["max_tokens_per_micro_batch"],
                train["overlong"] == "truncate",
            ),
        )
        out.append(joined)
    frame = pl.concat(out, how="diagonal_relaxed").sort("order")
    scale = float(footer["cost_scale"])
    units = (pl.col("cost") * scale).round(0, mode="half_to_even").cast(pl.Int64)
    return frame.with_columns(pl.max_horizontal(units, pl.lit(1)).alias("cost_units"))


def plan_frame(plan: str | Path, index: str | Path | None = None) -> pl.DataFrame:
    """The plan as a DataFrame, one row per planned sample, in (step, rank, micro_batch) order."""
    plan = Path(plan)
    with PlanReader(plan) as reader:
        reader.verify_sections()
        footer = reader.footer
        slots = _slots(reader).with_row_index("order")
    manifest = plan_manifest(plan, footer, index)
    # File order is (chunk, rank, step, ...); the documented order is (step, rank, micro_batch),
    # with a micro-batch's samples in their order in the plan.
    frame = locate(slots, manifest, footer).sort("step", "rank", "micro_batch", "order")
    first = ["step", "rank", "micro_batch", "source", "row", "file", "file_id", "file_row"]
    loc = [c for c in ("offset", "length") if c in frame.columns]
    rest = [
        c
        for c in frame.columns
        if c not in (*first, *loc, "n_tokens", "cost", "cost_units", "order", "gid", "source_id")
    ]
    # Int64 throughout, so that sums over a large plan (n_tokens) do not wrap at 2^32.
    return signed_ints(frame.select(*first, *loc, "n_tokens", "cost", "cost_units", *rest))


def export_plan(plan: str | Path, output: str | Path, index: str | Path | None = None) -> int:
    """Write `plan_frame` to Parquet atomically; returns the number of rows."""
    from mds.planner.outputs import check_output, index_inputs

    output = Path(output)
    check_output("-o", output, [("plan file", Path(plan)), *index_inputs(index and Path(index))])
    frame = plan_frame(plan, index)
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(output) as tmp:
            frame.write_parquet(tmp)
    except (OSError, pl.exceptions.ComputeError) as exc:
        raise cannot_write(output, "the export", exc) from exc
    return frame.height
