"""A source's table: its new files scanned in pool tasks (runs of small files together
where a batch scanner takes them, every other file alone), the rows reused from the
previous table renumbered to the new file ids, all assembled in file order with one type
per kept column, and the per-file counts and length statistics the manifest records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from mds.errors import SourceDataError
from mds.planner.index.arrow import scan_arrow
from mds.planner.index.config import SourceSpec
from mds.planner.index.image_jsonl import scan_jsonl_images
from mds.planner.index.image_parquet import scan_parquet_images
from mds.planner.index.images import IMAGE_COLUMNS
from mds.planner.index.jsonl import scan_jsonl
from mds.planner.index.jsonl_batch import scan_jsonl_batch
from mds.planner.index.megatron import scan_megatron
from mds.planner.index.parquet import scan_parquet
from mds.planner.index.reuse import IndexedFile, Recorded, row_group_located
from mds.planner.index.scan import MAX_NESTING, ScanContext, check_nesting, nesting
from mds.planner.index.tables import IndexManifest, read_table
from mds.planner.index.webdataset import scan_webdataset

__all__ = [
    "BATCH_SCANNERS",
    "IMAGE_SCANNERS",
    "SCANNERS",
    "Part",
    "assemble",
    "length_stats",
    "merge_parts",
    "nearest_ranks",
    "per_file_counts",
    "reused_rows",
    "scan_task",
    "scan_tasks",
]

SCANNERS = {
    "parquet": scan_parquet,
    "jsonl": scan_jsonl,
    "jsonl.zst": scan_jsonl,
    "arrow": scan_arrow,
    "megatron": scan_megatron,
}
# Scanners of many small files at once: (rows of all files, rows per file), or None when the
# files must be scanned one by one (see scan_jsonl_batch).
BATCH_SCANNERS = {"jsonl": scan_jsonl_batch, "jsonl.zst": scan_jsonl_batch}
# Scanners of image-text sources (docs/vision.md), one file at a time: (rows, dropped).
IMAGE_SCANNERS = {
    "webdataset": scan_webdataset,
    "parquet": scan_parquet_images,
    "jsonl": scan_jsonl_images,
    "jsonl.zst": scan_jsonl_images,
}
SMALL_FILE = 1 << 20  # files up to this size are scanned in batches ...
BATCH_BYTES = 8 << 20  # ... of up to this many bytes
BATCH_FILES = 4096  # ... and files
PERCENTILES = (50, 90, 99)


@dataclass
class Part:
    """Rows of the consecutive files first, first+1, ... of a source, in file order.

    `rows` holds each file's row count. `alone` means each file was scanned alone (or, for
    rows reused from the previous table, carries that table's types) and its column types
    are every file's own: files scanned alone share a part only with one schema (see
    merge_parts). A batch part's non-null column types hold for every file with a value."""

    first: int
    rows: np.ndarray
    frame: pl.DataFrame
    alone: bool = True
    dropped: np.ndarray | None = None  # image-text sources: samples left out, per file


def _type_events(part: Part, spec: SourceSpec):
    """(file index, column position, column, type) of the first file of the part that types
    each kept column (the files before it have only nulls there)."""
    for pos, col in enumerate(spec.keep):
        dtype = part.frame.schema[col]
        if dtype == pl.Null:
            continue
        if part.alone:
            yield part.first, pos, col, dtype
            continue
        present = part.frame[col].is_not_null()
        if not present.any():
            continue
        row = int(present.arg_true()[0])
        ends = np.cumsum(part.rows)
        yield part.first + int(np.searchsorted(ends, row, side="right")), pos, col, dtype


def _check_schema(
    parts: list[Part], files: list[IndexedFile], spec: SourceSpec
) -> dict[str, pl.DataType]:
    """Kept columns must have one type across a source's files (all-null files adapt)."""
    types: dict[str, tuple[pl.DataType, str]] = {}
    events = sorted(
        (e for part in parts for e in _type_events(part, spec)), key=lambda e: (e[0], e[1])
    )
    for fi, _, col, dtype in events:
        f = files[fi]
        seen = types.setdefault(col, (dtype, f.data.rel))
        if seen[0] != dtype:
            raise SourceDataError(
                f"{f.data.rel}: column `{col}` has type {dtype} but {seen[0]} in {seen[1]} "
                f"(schema drift inside source '{spec.name}')"
            )
    return {col: types.get(col, (pl.String, ""))[0] for col in spec.keep}


def length_stats(n: pl.Series) -> dict[str, Any]:
    if n.len() == 0:
        return {}
    stats: dict[str, Any] = {
        "min": int(n.min()),
        "max": int(n.max()),
        "mean": round(float(n.mean()), 3),
    }
    stats.update(zip((f"p{p}" for p in PERCENTILES), nearest_ranks(n), strict=True))
    return stats


def nearest_ranks(n: pl.Series) -> list[int]:
    """Polars' nearest-rank percentiles (`quantile(p / 100, interpolation="nearest")`: the
    value at sorted position round((len - 1) * p / 100), halves away from zero), found by
    one introselect (np.partition) instead of a sort per percentile."""
    values = n.to_numpy()
    ranks = [int(np.floor((len(values) - 1) * (p / 100) + 0.5)) for p in PERCENTILES]
    chosen = np.partition(values, ranks)
    return [int(chosen[r]) for r in ranks]


def assemble(
    spec: SourceSpec, fmt: str, files: list[IndexedFile], parts: list[Part]
) -> pl.DataFrame:
    """One table from parts in file order: file_id by file, kept columns cast to one type."""
    parts = sorted(parts, key=lambda p: p.first)
    types = _check_schema(parts, files, spec)
    located = fmt.startswith("jsonl") or fmt == "webdataset"
    cols = ["file_id", "file_row"] + (["offset", "length"] if located else [])
    cols += ["offset"] if row_group_located(spec, fmt) else []
    cols += ["n_tokens", *(IMAGE_COLUMNS if spec.images is not None else ()), *spec.keep]
    # Parts whose frames have one schema are put together first, and their file ids, casts
    # and columns done once: a re-index of a few files among many has a part per run of
    # files (thousands), where a polars call per part would cost more than the rows.
    by_schema: dict[tuple, list[Part]] = {}
    for part in parts:
        by_schema.setdefault(tuple(part.frame.schema.items()), []).append(part)
    frames = []
    for group in by_schema.values():
        ids = np.concatenate(
            [np.repeat(np.arange(p.first, p.first + len(p.rows), dtype=np.uint32), p.rows)
             for p in group]
        )  # fmt: skip
        frame = group[0].frame if len(group) == 1 else pl.concat([p.frame for p in group])
        frames.append(
            frame.with_columns(
                pl.Series("file_id", ids, dtype=pl.UInt32),
                *[pl.col(c).cast(types[c]) for c in spec.keep],
            ).select(cols)
        )
    table = pl.concat(frames, how="vertical")
    if len(frames) > 1:  # file ids do not overlap between parts: back in file order
        table = table.sort("file_id", maintain_order=True)
    return table


def reused_rows(
    previous: IndexManifest | None,
    old: dict | None,
    recorded: Recorded | None,
    files: list[IndexedFile],
) -> list[Part]:
    """The reused files' rows of the previous table, renumbered to the new file ids, as parts
    of consecutive files (a scanned file between two reused ones splits them). Both file
    lists are sorted by path, so the reused files keep their order."""
    reuse = [(f.reuse, fi) for fi, f in enumerate(files) if f.reuse is not None]
    if not reuse or previous is None or old is None or recorded is None:
        return []
    table = read_table(previous.path / old["table"], old["table_checksum"])
    new_id = np.full(max(max(o for o, _ in reuse), recorded.n) + 1, -1, dtype=np.int64)
    for o, fi in reuse:
        new_id[o] = fi
    ids = new_id[table["file_id"].to_numpy()]
    keep = ids >= 0
    table = table.filter(pl.Series(keep)).drop("file_id")
    ids = ids[keep]
    if np.any(np.diff(ids) < 0):  # not written in path order: put the rows in file order
        order = np.argsort(ids, kind="stable")
        table, ids = table[order], ids[order]
    cuts = np.flatnonzero(np.diff(ids) > 1) + 1
    # Every reused file carries the previous table's types, even one without rows: an empty
    # part at the first reused file stands for them all in the type check.
    parts = [Part(reuse[0][1], np.zeros(0, dtype=np.int64), table.clear())]
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(ids)], strict=True):
        if a == b:
            continue
        first = int(ids[a])
        rows = np.bincount(ids[a:b] - first).astype(np.int64)
        parts.append(Part(first, rows, table.slice(int(a), int(b - a))))
    return parts


def scan_tasks(
    si: int, files: list[IndexedFile], batch: bool = True
) -> list[tuple[int, int, list[IndexedFile]]]:
    """(source, first file index, files) per pool task: runs of consecutive small files of a
    format with a batch scanner go together (unless `batch` is False), every other file
    alone."""
    tasks: list[tuple[int, int, list[IndexedFile]]] = []
    run: list[IndexedFile] = []
    first = size = 0
    for fi, f in enumerate(files):
        if f.reuse is not None:
            continue
        batchable = batch and f.data.format in BATCH_SCANNERS and f.nbytes <= SMALL_FILE
        if run and (
            not batchable
            or fi != first + len(run)
            or size >= BATCH_BYTES
            or len(run) >= BATCH_FILES
        ):
            tasks.append((si, first, run))
            run = []
        if not batchable:
            tasks.append((si, fi, [f]))
            continue
        if not run:
            first, size = fi, 0
        run.append(f)
        size += f.nbytes
    if run:
        tasks.append((si, first, run))
    return tasks


def scan_task(first: int, files: list[IndexedFile], ctx: ScanContext) -> list[Part]:
    """Scan files first, first+1, ...: together when there are several and the batch scanner
    takes them, else each alone."""
    fmt = files[0].data.format
    if ctx.spec.images is not None:
        parts = []
        for i, f in enumerate(files):
            got = IMAGE_SCANNERS[fmt](f.data, ctx)
            check_nesting(got.frame, ctx.spec.keep, f.data)
            rows = np.array([got.frame.height], dtype=np.int64)
            dropped = np.array([got.dropped], dtype=np.int64)
            parts.append(Part(first + i, rows, got.frame, dropped=dropped))
        return parts
    if len(files) > 1:
        got = BATCH_SCANNERS[fmt]([f.data for f in files], ctx)
        if got is not None and not any(
            nesting(got[0].schema[c]) > MAX_NESTING for c in ctx.spec.keep
        ):
            frame, rows = got
            return [Part(first, rows, frame, alone=False)]
    parts = []
    for i, f in enumerate(files):
        frame = SCANNERS[fmt](f.data, ctx)
        check_nesting(frame, ctx.spec.keep, f.data)
        parts.append(Part(first + i, np.array([frame.height], dtype=np.int64), frame))
    return parts


def merge_parts(
    units: list[tuple[int, list[IndexedFile], ScanContext]], results: list[list[Part]]
) -> list[list[Part]]:
    """The parts of a task of several scan units (engine.Merge), runs of them folded into
    one: consecutive files of one source, each scanned alone with the same schema, become one
    part of one frame, handed back with the run's first unit (the others' lists left empty).
    The task then sends one frame per run instead of one per file, and the driver assembles
    a few large parts. The table is the same, and so is the type check's verdict: a run's
    first file stands for the others, which have its types."""
    merged: list[list[Part]] = [[] for _ in results]
    run: list[Part] = []
    at = source = None  # the run's unit and source

    def close() -> None:
        if len(run) == 1:
            merged[at].append(run[0])
        elif run:
            dropped = [p.dropped for p in run]
            merged[at].append(
                Part(
                    run[0].first,
                    np.concatenate([p.rows for p in run]),
                    pl.concat([p.frame for p in run], how="vertical"),
                    dropped=None if dropped[0] is None else np.concatenate(dropped),
                )
            )
        run.clear()

    for u, ((_, _, ctx), parts) in enumerate(zip(units, results, strict=True)):
        for part in parts:
            if not (
                run
                and part.alone
                and source == ctx.spec.name
                and part.first == run[-1].first + len(run[-1].rows)
                and part.frame.schema == run[0].frame.schema
                and (part.dropped is None) == (run[0].dropped is None)
            ):
                close()
                at, source = u, ctx.spec.name
            if not part.alone:
                merged[u].append(part)  # a batch part: large already, its own type rules
                continue
            run.append(part)
    close()
    return merged


def per_file_counts(table: pl.DataFrame, files: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows and tokens of each file, from a table ordered by file_id."""
    ids = table["file_id"].to_numpy()
    rows = np.bincount(ids, minlength=files).astype(np.int64)
    tokens = np.zeros(files, dtype=np.int64)
    has = rows > 0
    if has.any():
        starts = np.zeros(files, dtype=np.int64)
        np.cumsum(rows[:-1], out=starts[1:])
        n = table["n_tokens"].to_numpy().astype(np.int64)
        tokens[has] = np.add.reduceat(n, starts[has])
    return rows, tokens
