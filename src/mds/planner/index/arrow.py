"""Scan Arrow IPC files and streams (also a `save_to_disk` directory's shards), memory-mapped.

List lengths come from the offsets buffer only; the token ids are never touched.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from mds.core import storage
from mds.planner.index.discover import DataFile
from mds.planner.index.lengths import (
    check_column_type,
    check_token_ids,
    checked_lengths,
    text_lengths,
)
from mds.planner.index.scan import ScanContext, missing_column, reading

__all__ = ["read_arrow", "scan_arrow"]


def read_arrow(file: DataFile, columns: list[str] | None = None) -> pa.Table:
    """Open an Arrow IPC file or stream without copying it into memory; of an object, read
    it in order (8 MiB requests) keeping only `columns`."""
    with reading(file, "Arrow IPC file"):
        if storage.is_url(file.path):
            return _read_object(str(file.path), columns)
        source = pa.memory_map(str(file.path))
        try:
            return pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_stream(source).read_all()


def _read_object(url: str, columns: list[str] | None) -> pa.Table:
    raw = storage.open_input(url)
    try:
        try:
            reader = pa.ipc.open_file(raw)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            raw.seek(0)
            reader = pa.ipc.open_stream(pa.BufferedInputStream(raw, 8 << 20))
            batches = iter(reader)
        schema = reader.schema
        if any(c not in schema.names for c in columns or ()):  # said by the caller, by name
            return schema.empty_table()
        keep = list(columns or schema.names)
        return pa.Table.from_batches(
            [b.select(keep) for b in batches], schema=pa.schema([schema.field(c) for c in keep])
        )
    finally:
        raw.close()


def scan_arrow(file: DataFile, ctx: ScanContext) -> pl.DataFrame:
    spec = ctx.spec
    table = read_arrow(file, list(spec.columns()))
    for column in spec.columns():
        if column not in table.column_names:
            raise missing_column(file, column, table.column_names)
    kind, column = spec.length.kind, spec.length.column
    assert column is not None
    with reading(file, "Arrow IPC file"):
        frame = pl.from_arrow(table.select(list(spec.columns())), rechunk=False)
    assert isinstance(frame, pl.DataFrame)
    role = "text" if kind in ("tokenizer", "estimate") else kind
    check_column_type(frame.schema[column], role, column, f"{file.rel}: ")
    if kind == "tokens":
        check_token_ids(frame[column], lambda i: f"{file.rel} row {i}")
        raw = pl.from_arrow(pc.list_value_length(table[column])).cast(pl.Int64)
    elif kind == "count":
        raw = frame[column].cast(pl.Int64)
    else:
        raw = text_lengths(
            frame[column], spec.length, ctx.tokenizer, ctx.fraction_of(file), ctx.check_stop
        )
    n_tokens = checked_lengths(raw, lambda i: f"{file.rel} row {i}")
    head = pl.DataFrame(
        {"file_row": pl.int_range(len(n_tokens), dtype=pl.Int64, eager=True), "n_tokens": n_tokens}
    )
    return pl.concat([head, frame.select(list(spec.keep))], how="horizontal")
