"""Scan a Parquet file: lengths from list offsets or a count column, never the payload."""

from __future__ import annotations

import polars as pl

from mds.executor import storage
from mds.planner.index.discover import DataFile
from mds.planner.index.lengths import check_column_type, checked_lengths, text_lengths
from mds.planner.index.parquet_levels import list_lengths
from mds.planner.index.scan import ScanContext, missing_column, reading

__all__ = ["scan_parquet"]


def _object_columns(file: DataFile, spec) -> pl.LazyFrame:
    """The columns the index reads of a Parquet object: its footer, then only their column
    chunks, by byte-range requests (pyarrow coalesces neighbouring ranges)."""
    import pyarrow.parquet as pq

    with storage.open_input(file.path) as f, pq.ParquetFile(f, pre_buffer=True) as parquet:
        names = parquet.schema_arrow.names
        for column in spec.columns():
            if column not in names:
                raise missing_column(file, column, names)
        table = parquet.read(columns=list(spec.columns()), use_threads=False)
    return pl.from_arrow(table).lazy()


def scan_parquet(file: DataFile, ctx: ScanContext) -> pl.DataFrame:
    spec = ctx.spec
    remote = storage.is_url(file.path)
    with reading(file, "Parquet file"):
        lazy = _object_columns(file, spec) if remote else pl.scan_parquet(file.path)
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
        fast = list_lengths(file.path, column) if kind == "tokens" and not remote else None
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
        raw = text_lengths(frame["__text"], spec.length, ctx.tokenizer, ctx.fraction_of(file))
        frame = frame.drop("__text")
    else:
        raw = frame["__n"]
        frame = frame.drop("__n")
    n_tokens = checked_lengths(raw, lambda i: f"{file.rel} row {i}")
    rows = len(n_tokens)
    head = pl.DataFrame(
        {"file_row": pl.int_range(rows, dtype=pl.Int64, eager=True), "n_tokens": n_tokens}
    )
    return pl.concat([head, frame], how="horizontal") if frame.width else head
