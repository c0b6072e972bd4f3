"""The samples a plan trains at given steps: `mds export`'s rows of those steps, read from
the plan's blocks of those steps only, so tracing a step of a billion-sample plan costs
what tracing one of a small plan does.

Where each sample lies (file, row, byte range, n_tokens) comes from the fetch records of
its rank's block, which the plan checksums: no index table is read. Its epoch needs the
stream positions of the steps before it in its chunk, so every rank's block of the traced
chunks is read (and the `cursor_consumed` row of the chunk), not the earlier chunks. The
index is read only where the plan alone cannot tell: a cost `expr` over index columns, a
`[vision]` plan's image parts, or an epoch that began before the traced chunk and whose
samples cross into the next one (export's rule, `sample_epochs`; null if the plan's index
is not where it records it and no `index` is given).

`rows_block` makes the same kind of block for rows of a source named by the index, so the
tools read any sample's content the way they read a traced one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mds.core.index_manifest import index_sources
from mds.core.planfile import Fetch, RankChunk
from mds.core.planfile_reader import PlanReader
from mds.core.storage import as_place
from mds.errors import ConfigError, MdsError
from mds.planner.index.tables import IndexManifest, source_table
from mds.planner.plan.fetch import FILE_KEYS, source_facts
from mds.planner.plan.pool import RANGE_FORMATS
from mds.planner.plan.sqlexpr import signed_ints
from mds.planner.report.common import plan_index
from mds.planner.report.export import (
    EXPORT_COLUMNS,
    block_frame,
    check_selection,
    chunk_restarts,
    locate,
    planned_tokens,
    sample_cost,
    sample_epochs,
    with_cost_units,
)

__all__ = ["Trace", "index_footer", "location_table", "rows_block", "trace_plan"]


@dataclass
class Trace:
    """A trace: `frame` holds export's columns (EXPORT_COLUMNS, no kept metadata) per
    sample in (step, rank, micro_batch) order, plan order inside a micro-batch, plus `chunk`
    and `pos`, the sample's place in `blocks[(chunk, rank)]` (the blocks of the traced
    ranks, for reading contents)."""

    frame: pl.DataFrame
    blocks: dict[tuple[int, int], RankChunk]
    footer: dict[str, Any]
    plan: Any


def trace_plan(
    plan: str | Path,
    steps: tuple[int | None, int | None],
    ranks: list[int] | None = None,
    micro_batch: int | None = None,
    index: str | Path | None = None,
    given: str | None = None,
) -> Trace:
    """The samples of steps [a, b) (None: the plan's first or last step), of the given DP
    ranks (None: all) and micro-batch (None: all); ConfigError for a selection outside the
    plan, naming the steps as `given` (default: `--steps A:B`)."""
    plan = as_place(plan)
    with PlanReader(plan) as reader:
        footer = reader.footer
        a, b = check_selection(reader, steps, ranks, given)  # type: ignore[misc]
        if micro_batch is not None and not 0 <= micro_batch < reader.micro:
            raise ConfigError(
                f"--micro-batch {micro_batch} is not a micro-batch of the plan "
                f"(0 to {reader.micro - 1})"
            )
        c0, c1 = reader.chunk_of(a), reader.chunk_of(b - 1)
        first = reader.chunks[c0][0]
        blocks, parts = {}, []
        for chunk in range(c0, c1 + 1):
            for rank in range(reader.dp):
                block = reader.rank_chunk(chunk, rank)
                if not ranks or rank in ranks:
                    blocks[(chunk, rank)] = block
                frame = block_frame(block, rank)
                parts.append(
                    frame.with_columns(
                        pl.lit(chunk, pl.Int64).alias("chunk"),
                        pl.int_range(frame.height, dtype=pl.Int64).alias("pos"),
                    )
                )
        cursors = np.asarray(reader.section("cursor_consumed"), dtype=np.int64)
        start, restarts = cursors[c0], chunk_restarts(reader, cursors, c0)
    slots = pl.concat(parts).filter(pl.col("step") < b).with_row_index("order")
    slots = slots.sort("step", "rank", "micro_batch", "order")
    # the plan from the traced chunk's first step on, as sample_epochs reads a plan
    view = {**footer, "first_step": first}
    counts = _source_counts(slots, footer, first, b)
    epochs = sample_epochs(slots, view, counts, start, restarts=restarts)
    keep = pl.col("step") >= a
    if ranks:
        keep &= pl.col("rank").is_in(ranks)
    if micro_batch is not None:
        keep &= pl.col("micro_batch") == micro_batch
    chosen = slots.with_columns(epochs).filter(keep)
    manifest = None
    if chosen["epoch"].null_count():
        try:
            manifest = plan_index(plan, footer, index)
        except MdsError:
            if index is not None:  # the index asked for is refused: say why
                raise
        if manifest is not None:  # else those epochs stay null, as export's do
            epochs = sample_epochs(slots, view, counts, start, manifest, restarts)
            chosen = slots.with_columns(epochs).filter(keep)
    config = footer["config"]
    if "expr" in config["cost"] or config.get("vision") is not None:
        manifest = manifest or plan_index(plan, footer, index)
        frame = locate(chosen, manifest, footer).rename(
            {"offset": "byte_offset", "length": "byte_length"}, strict=False
        )
    else:
        frame = _fetch_columns(chosen, blocks, footer)
    frame = frame.sort("step", "rank", "micro_batch", "order").with_columns(
        pl.col("gid").alias("sample_id"),
        planned_tokens(config["train"]).alias("planned_tokens"),
    )
    for column in ("byte_offset", "byte_length"):
        if column not in frame.columns:
            frame = frame.with_columns(pl.lit(None, pl.Int64).alias(column))
    lead = [c for c in EXPORT_COLUMNS if c in frame.columns]
    return Trace(signed_ints(frame.select(*lead, "chunk", "pos")), blocks, footer, plan)


def _source_counts(slots: pl.DataFrame, footer: dict, first: int, end: int) -> np.ndarray:
    """Samples of each planned source per step of [first, end), as the `source_samples`
    section holds them, counted in every rank's slots of those steps."""
    bases = np.array([s["base"] for s in footer["index"]["sources"]], dtype=np.int64)
    planned = {s["name"]: i for i, s in enumerate(footer["sources"])}
    to_planned = np.array([planned.get(s["name"], -1) for s in footer["index"]["sources"]])
    src = to_planned[np.searchsorted(bases, slots["gid"].to_numpy(), side="right") - 1]
    counts = np.zeros((end - first, len(planned)), dtype=np.int64)
    np.add.at(counts, (slots["step"].to_numpy() - first, src), 1)
    return counts


def _fetch_columns(chosen: pl.DataFrame, blocks: dict, footer: dict) -> pl.DataFrame:
    """Export's location columns, n_tokens, cost and cost_units from the blocks' fetch
    records (the index's values, copied into the plan), without reading the index."""
    index_sources = footer["index"]["sources"]
    formats = {name: f.get("format") for name, f in footer["fetch"]["sources"].items()}
    out = []
    for (chunk, rank), part in chosen.group_by("chunk", "rank", maintain_order=True):
        rec = blocks[(int(chunk), int(rank))].fetch
        pos = part["pos"].to_numpy()
        which = rec.file[pos].astype(np.int64)
        used = np.unique(which)
        names = {int(f): index_sources[rec.files[int(f)][0]]["name"] for f in used}
        paths = {int(f): str(rec.files[int(f)][2]["path"]) for f in used}
        fids = {int(f): int(rec.files[int(f)][1]) for f in used}
        ranged = np.array([formats.get(names[int(f)]) in RANGE_FORMATS for f in which], bool)
        offset = rec.offset[pos].astype(np.int64)
        length = rec.length[pos].astype(np.int64)
        out.append(
            part.with_columns(
                pl.Series("source", [names[int(f)] for f in which], pl.String),
                pl.Series("row", part["gid"].to_numpy() - _bases(footer, part["gid"])),
                pl.Series("file", [paths[int(f)] for f in which], pl.String),
                pl.Series("file_id", [fids[int(f)] for f in which], pl.Int64),
                pl.Series("file_row", rec.row[pos].astype(np.int64)),
                pl.Series("byte_offset", offset),
                pl.Series("byte_length", length),
                pl.Series("n_tokens", rec.tokens[pos].astype(np.int64)),
                pl.Series("ranged", ranged),
            )
        )
    if not out:  # nothing traced (e.g. an empty micro-batch)
        ints = ("row", "file_id", "file_row", "byte_offset", "byte_length", "n_tokens")
        out = [
            chosen.with_columns(
                *(pl.lit(None, pl.String).alias(c) for c in ("source", "file")),
                *(pl.lit(None, pl.Int64).alias(c) for c in ints),
                pl.lit(None, pl.Boolean).alias("ranged"),
            )
        ]
    # JSONL and WebDataset samples only: other formats' fetch offsets are not bytes
    bytes_only = {c: pl.when(pl.col("ranged")).then(pl.col(c)) for c in ("byte_offset", "byte_length")}
    frame = pl.concat(out).with_columns(**bytes_only).drop("ranged")
    train, cost = footer["config"]["train"], footer["config"]["cost"]
    frame = frame.with_columns(
        sample_cost(
            frame,
            cost,
            train["max_tokens_per_micro_batch"],
            train["overlong"] == "truncate",
        )
    )
    return with_cost_units(frame, float(footer["cost_scale"]))


def _bases(footer: dict, gids: pl.Series) -> np.ndarray:
    bases = np.array([s["base"] for s in footer["index"]["sources"]], dtype=np.int64)
    return bases[np.searchsorted(bases, gids.to_numpy(), side="right") - 1]


def location_table(manifest: IndexManifest, source: str) -> pl.DataFrame:
    """The columns of `source`'s index table that locate its rows (file_id, file_row,
    n_tokens, and offset and length where it has them): what `rows_block` reads."""

    def wanted(schema: pl.Schema) -> list[str]:
        return [c for c in ("file_id", "file_row", "n_tokens", "offset", "length") if c in schema]

    return source_table(manifest, source, wanted)


def rows_block(
    manifest: IndexManifest,
    footer: dict[str, Any],
    source: str,
    rows: np.ndarray,
    table: pl.DataFrame | None = None,
) -> RankChunk:
    """Rows of `source` (its index table's rows, in the given order) as a block with the
    fetch records a plan would give them, for reading their contents as a plan's samples
    are read; `table`: its `location_table`, if read already (a caller that asks for rows
    in batches reads it once). ConfigError for an unknown source or a row outside it."""
    index_sources = footer["index"]["sources"]
    sid = next((i for i, s in enumerate(index_sources) if s["name"] == source), None)
    if sid is None:
        names = ", ".join(s["name"] for s in index_sources)
        raise ConfigError(f"source {source!r} is not in the plan's index (its sources: {names})")
    rows = np.asarray(rows, dtype=np.int64)
    size = int(index_sources[sid]["rows"])
    if len(rows) and (rows.min() < 0 or rows.max() >= size):
        bad = int(rows[(rows < 0) | (rows >= size)][0])
        raise ConfigError(f"source {source!r}: row {bad} is outside its {size} rows")
    entry = manifest.source(source)
    if table is None:
        table = location_table(manifest, source)
    picked = {c: table[c].to_numpy()[rows].astype(np.int64) for c in table.columns}
    zeros = np.zeros(len(rows), dtype=np.int64)
    fids, which = np.unique(picked["file_id"], return_inverse=True)
    files = entry["files"]
    records = [
        (sid, int(f), {k: files[int(f)][k] for k in FILE_KEYS if k in files[int(f)]})
        for f in fids
    ]
    fetch = Fetch(
        which.astype(np.int64),
        picked["file_row"],
        picked["n_tokens"],
        picked.get("offset", zeros),
        picked.get("length", zeros),
        files=records,
    )
    ids = (int(index_sources[sid]["base"]) + rows).astype(np.uint64)
    return RankChunk(0, np.array([[len(rows)]], dtype=np.int64), ids, fetch)


def index_footer(manifest: IndexManifest) -> dict[str, Any]:
    """What a plan's footer says of its index and data, as a plan of every source of
    `manifest` would record it (the root as the index records it): enough to read rows of
    the index with `rows_block` and the executor's catalog when there is no plan."""
    sources = index_sources(manifest)
    return {
        "index": {"fingerprint": manifest.fingerprint, "sources": sources},
        "sources": [{"name": s["name"], "samples": int(s["rows"])} for s in sources],
        "fetch": {
            "root": str(manifest.data["root"]),
            "sources": {s["name"]: source_facts(manifest.source(s["name"])) for s in sources},
        },
        "config": {"train": {"overlong": "error", "max_tokens_per_micro_batch": 0}},
    }
