"""Scan a Parquet file: lengths from list offsets or a count column, never the payload."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from mds.core import storage
from mds.formats.parquet import levels
from mds.formats.parquet.levels import find_column
from mds.planner.index.discover import DataFile
from mds.planner.index.lengths import (
    check_column_type,
    check_token_ids,
    checked_lengths,
    text_lengths,
)
from mds.planner.index.scan import ScanContext, missing_column, reading

__all__ = ["group_offsets", "scan_parquet"]


def _object_columns(file: DataFile, spec) -> tuple[pl.LazyFrame, list[int]]:
    """The columns the index reads of a Parquet object: its footer, then only their column
    chunks, by byte-range requests (pyarrow coalesces neighbouring ranges); and the rows of
    each row group."""
    with storage.open_input(file.path) as f, pq.ParquetFile(f, pre_buffer=True) as parquet:
        names = parquet.schema_arrow.names
        for column in spec.columns():
            if column not in names:
                raise missing_column(file, column, names)
        table = parquet.read(columns=list(spec.columns()), use_threads=False)
        groups = _group_rows(parquet.metadata)
    return pl.from_arrow(table).lazy(), groups


def _group_rows(meta: pq.FileMetaData) -> list[int]:
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def _ids_clean_by_statistics(
    meta: pq.FileMetaData | None, column: str, n_tokens: np.ndarray, groups: list[int]
) -> bool:
    """Whether the footer's statistics show every token id of the list column `column` is
    present and fits int64: each row group's non-null values are its list lengths' sum, and
    an unsigned 64-bit column's max is below 2^63. False where they cannot tell."""
    if meta is None or not groups or sum(groups) != len(n_tokens):
        return False
    col = find_column(meta, column)
    if col is None:
        return False
    physical = meta.schema.column(col.index)
    unsigned64 = physical.physical_type == "INT64" and "isSigned=false" in str(
        physical.logical_type
    )
    ends = np.cumsum(np.asarray(n_tokens, dtype=np.int64))
    bounds = np.cumsum(groups)
    for g, rows in enumerate(groups):
        if not rows:
            continue
        stats = meta.row_group(g).column(col.index).statistics
        if stats is None or not stats.has_null_count:
            return False
        first = int(ends[bounds[g] - rows - 1]) if bounds[g] > rows else 0
        if stats.num_values != int(ends[bounds[g] - 1]) - first:
            return False  # a null id somewhere in the group
        if unsigned64 and stats.num_values and (not stats.has_min_max or stats.max >= 2**63):
            return False
    return True


def group_offsets(n_tokens: np.ndarray, group_rows: list[int]) -> np.ndarray:
    """Where each row's values start in its row group's leaf column (uint32, 4 bytes a row in
    the planner): what the executor reads a row's pages with (`parquet_pages`), so it need
    not decode the group."""
    n = np.asarray(n_tokens, dtype=np.int64)
    if sum(group_rows) != len(n):
        raise ValueError(f"its row groups hold {sum(group_rows)} rows, the column {len(n)}")
    before = np.cumsum(n) - n
    firsts = np.cumsum(group_rows) - np.asarray(group_rows, dtype=np.int64)
    group_base = before[np.minimum(firsts, max(len(n) - 1, 0))] if len(n) else firsts
    offsets = before - np.repeat(group_base, group_rows)
    if len(offsets) and int(offsets.max()) >= 1 << 32:
        raise ValueError("a row group holds more than 2^32 token ids")
    return offsets.astype(np.uint32)


def _check_ids(file: DataFile, lazy: pl.LazyFrame, column: str) -> None:
    """Refuse a null token id, or one outside int64, naming the file's first such row: the
    rows are found by a query that keeps one flag a row, not the ids."""
    ids = pl.col(column)
    bad = pl.element().is_null()
    if lazy.collect_schema()[column].inner == pl.UInt64:  # type: ignore[union-attr]
        bad = bad | (pl.element() >= 2**63)
    with reading(file, "Parquet file"):
        flagged = lazy.select(ids.list.eval(bad).list.any().fill_null(False).arg_true().first())
        first = flagged.collect().item()
        if first is None:
            return
        row = lazy.select(ids.slice(first, 1)).collect()[column]
    check_token_ids(row, lambda _i: f"{file.rel} row {first}")
    raise AssertionError("a flagged row passed the token id check")  # pragma: no cover


def scan_parquet(file: DataFile, ctx: ScanContext) -> pl.DataFrame:
    spec = ctx.spec
    remote = storage.is_url(file.path)
    with reading(file, "Parquet file"):
        meta = None
        if remote:
            lazy, groups = _object_columns(file, spec)
        else:
            lazy, groups = pl.scan_parquet(file.path, glob=False), []  # a name, not a pattern
            if spec.length.kind == "tokens":
                # row-group sizes for `offset`; the same parse serves `levels.lengths`
                meta = pq.read_metadata(file.path)
                groups = _group_rows(meta)
        schema = lazy.collect_schema()
    for column in spec.columns():
        if column not in schema:
            raise missing_column(file, column, list(schema.names()))
    kind, column = spec.length.kind, spec.length.column
    assert column is not None
    check_column_type(
        schema[column],
        "text" if kind in ("tokenizer", "estimate") else kind,
        column,
        f"{file.rel}: ",
    )
    if spec.text and spec.text != column:
        check_column_type(schema[spec.text], "text", spec.text, f"{file.rel}: ")

    with reading(file, "Parquet file"):
        fast = None
        if kind == "tokens" and not remote:  # from page levels, or pyarrow (MDS_PAGE_READS)
            fast = levels.lengths(file.path, column, meta, file.rel)
        exprs = [pl.col(c) for c in spec.keep]
        if kind == "tokens" and fast is None:
            exprs.append(pl.col(column).list.len().cast(pl.Int64).alias("__n"))
        elif kind == "count":
            exprs.append(pl.col(column).cast(pl.Int64).alias("__n"))
        elif kind in ("tokenizer", "estimate"):
            exprs.append(pl.col(column).alias("__text"))
        frame = lazy.select(exprs).collect() if exprs else pl.DataFrame()
    if fast is not None:
        # The fast path reports a null list as -1; the check below must see it as null.
        raw = pl.Series("__n", fast).cast(pl.Int64)
        raw = raw.set(raw < 0, None)
    elif kind in ("tokenizer", "estimate"):
        raw = text_lengths(
            frame["__text"], spec.length, ctx.tokenizer, ctx.fraction_of(file), ctx.check_stop
        )
        frame = frame.drop("__text")
    else:
        raw = frame["__n"]
        frame = frame.drop("__n")
    n_tokens = checked_lengths(raw, lambda i: f"{file.rel} row {i}")
    rows = len(n_tokens)
    head = pl.DataFrame(
        {"file_row": pl.int_range(rows, dtype=pl.Int64, eager=True), "n_tokens": n_tokens}
    )
    if kind == "tokens":
        if not _ids_clean_by_statistics(meta, column, n_tokens.to_numpy(), groups):
            _check_ids(file, lazy, column)
        with reading(file, "Parquet file"):
            offsets = group_offsets(n_tokens.to_numpy(), groups)
        head = head.with_columns(pl.Series("offset", offsets, dtype=pl.UInt32))
    return pl.concat([head, frame], how="horizontal") if frame.width else head
