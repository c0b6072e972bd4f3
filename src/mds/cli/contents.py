"""Planned samples' contents for the commands: the planner says where samples are (a trace's
blocks, or an index's rows), the executor's catalog reads them as training would
(executor/catalog/contents.py). Only the files of those samples are read.

`content_hashes(plan, source, rows)` is the entry for lists given by content hash: it
hashes rows of a source on demand, with a progress bar for long runs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mds.core.content_hash import content_hash
from mds.core.planfile_reader import PlanReader
from mds.core.storage import as_place
from mds.errors import ConfigError
from mds.planner.report.common import plan_index

__all__ = ["content_hashes", "trace_payloads", "with_hashes"]

_BATCH = 4096  # rows read and hashed at a time by content_hashes


def trace_payloads(trace: Any, data_root: str | os.PathLike | None = None) -> list[Any]:
    """The payload of every sample of a `Trace` (planner/report/trace.py), in its rows'
    order: token ids, text, or an `ImageText`."""
    from mds.executor.catalog.contents import SampleContents, subset

    frame = trace.frame
    out: list[Any] = [None] * frame.height
    if not frame.height:
        return out
    at = np.arange(frame.height)
    chunks, ranks, pos = (frame[c].to_numpy() for c in ("chunk", "rank", "pos"))
    with SampleContents(trace.footer, trace.plan, data_root) as contents:
        for chunk, rank in dict.fromkeys(zip(chunks.tolist(), ranks.tolist(), strict=True)):
            mine = at[(chunks == chunk) & (ranks == rank)]
            block = subset(trace.blocks[(chunk, rank)], pos[mine])
            for k, payload in zip(mine.tolist(), contents.payloads(block), strict=True):
                out[k] = payload
    return out


def content_hashes(
    plan_or_index: str | Path,
    source: str,
    rows: Sequence[int] | np.ndarray,
    index: str | Path | None = None,
    data_root: str | os.PathLike | None = None,
    progress: bool = True,
) -> list[str]:
    """The content hash (core/content_hash.py) of each of `rows` of `source` (rows of its
    index table), in order, read from the data; `plan_or_index` is a plan file (its index:
    `index`, else the one it names) or an index directory. `index` and `data_root` as
    `mds export` / `mds verify` take them. Only the files holding those rows are read."""
    from mds.cli.progress import RowProgress
    from mds.core.index_manifest import MANIFEST, read_manifest
    from mds.executor.catalog.contents import SampleContents
    from mds.planner.report.trace import index_footer, location_table, rows_block

    place = as_place(plan_or_index)
    if isinstance(place, Path) and (place / MANIFEST).is_file():
        manifest = read_manifest(place)
        footer, plan = index_footer(manifest), place / MANIFEST
        names = [s["name"] for s in footer["index"]["sources"]]
        if source not in names:
            raise ConfigError(
                f"source {source!r} is not in the index {place} (its sources: {', '.join(names)})"
            )
    else:
        plan = place
        with PlanReader(plan) as reader:
            footer = reader.footer
        if source not in footer["fetch"]["sources"] or not any(
            s["name"] == source and int(s.get("samples", 0)) > 0 for s in footer.get("sources", [])
        ):
            raise ConfigError(
                f"source {source!r} is not drawn from by the plan {plan}; give a source it plans"
            )
        manifest = plan_index(plan, footer, index)
    rows = np.asarray(rows, dtype=np.int64)
    table = location_table(manifest, source) if len(rows) else None
    out: list[str] = []
    with SampleContents(footer, plan, data_root) as contents, RowProgress(
        f"hashing {source}", enabled=progress and len(rows) > _BATCH
    ) as bar:
        bar.start(len(rows))
        for lo in range(0, len(rows), _BATCH):
            block = rows_block(manifest, footer, source, rows[lo : lo + _BATCH], table)
            out += [content_hash(p) for p in contents.payloads(block)]
            bar.advance(len(block.ids))
    return out


def with_hashes(plan: str | Path, frame: Any, data_root: str | os.PathLike | None = None) -> Any:
    """An export frame (rows in (step, rank, micro_batch) order, plan order inside, as
    `plan_frame` gives them) with a `content_hash` column: the blocks of its steps and
    ranks are read again and their samples' contents hashed."""
    import polars as pl

    from mds.planner.report.export import block_frame
    from mds.planner.report.trace import Trace

    plan = as_place(plan)
    key = ("step", "rank", "micro_batch")
    if not frame.height:
        return frame.with_columns(pl.lit(None, pl.String).alias("content_hash"))
    a, b = int(frame["step"].min()), int(frame["step"].max()) + 1
    ranks = sorted(frame["rank"].unique().to_list())
    blocks, parts = {}, []
    with PlanReader(plan) as reader:
        footer = reader.footer
        for chunk in range(reader.chunk_of(a), reader.chunk_of(b - 1) + 1):
            for rank in ranks:
                block = blocks[(chunk, rank)] = reader.rank_chunk(chunk, rank)
                part = block_frame(block, rank)
                parts.append(
                    part.with_columns(
                        pl.lit(chunk, pl.Int64).alias("chunk"),
                        pl.int_range(part.height, dtype=pl.Int64).alias("pos"),
                    ).filter(pl.col("step").is_between(a, b, closed="left"))
                )
    slots = pl.concat(parts).sort(*key, maintain_order=True)
    hashes = [content_hash(p) for p in trace_payloads(Trace(slots, blocks, footer, plan), data_root)]
    slots = slots.with_columns(pl.Series("content_hash", hashes, pl.String))
    # a micro-batch's samples in plan order on both sides: the k-th of each joins
    nth = pl.int_range(pl.len()).over(*key).alias("nth")
    joined = frame.with_row_index("_at").with_columns(nth).join(
        slots.select(*key, "content_hash").with_columns(nth), on=[*key, "nth"], how="left"
    )
    return joined.sort("_at").drop("_at", "nth")
