"""The index manifest, as the planner reads it: the executor's parser plus Polars scans."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import polars as pl

from mds.executor.errors import IndexFormatError
from mds.executor.manifest import (
    FORMAT,
    MANIFEST,
    VERSION,
    IndexManifest,
    index_fingerprint,
    read_manifest,
    read_table_bytes,
    table_checksum,
    table_damage,
)

__all__ = [
    "FORMAT",
    "MANIFEST",
    "VERSION",
    "IndexManifest",
    "index_fingerprint",
    "read_manifest",
    "read_table",
    "source_frame",
    "source_table",
    "table_checksum",
    "table_damage",
]


def source_frame(manifest: IndexManifest, name: str) -> pl.LazyFrame:
    """One source's index table, checked against the manifest's checksum and parsed from the
    same bytes (a damaged table is refused before any of its values is used)."""
    return source_table(manifest, name).lazy()


def source_table(
    manifest: IndexManifest,
    name: str,
    columns: Callable[[pl.Schema], list[str] | None] | None = None,
) -> pl.DataFrame:
    """As `source_frame`, eager; `columns` picks from the table's schema the columns to
    decode (None: all), so a caller that needs two columns does not pay for the rest."""
    entry = manifest.source(name)
    table = manifest.path / entry["table"]
    # read_manifest refused `..` and absolute names; a symlink may still lead out.
    try:
        inside = table.resolve().is_relative_to(manifest.path.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        inside = False
    if not inside:
        raise IndexFormatError(
            f"{manifest.path}: the table of source {name!r} ({entry['table']!r}) leaves the "
            "index directory; refused, not read"
        )
    if not table.is_file():
        raise IndexFormatError(f"{table}: index table of source {name!r} is missing")
    return read_table(table, entry["table_checksum"], columns)


def read_table(
    table: Path,
    checksum: str,
    columns: Callable[[pl.Schema], list[str] | None] | None = None,
) -> pl.DataFrame:
    """An index table verified against `checksum`, parsed from the bytes that were checked;
    `columns` as in `source_table`."""
    data = read_table_bytes(table, checksum)
    try:
        names = None if columns is None else columns(pl.read_parquet_schema(io.BytesIO(data)))
        return pl.read_parquet(io.BytesIO(data), columns=names)
    except (OSError, pl.exceptions.PolarsError) as exc:  # intact bytes, yet not a table
        raise IndexFormatError(f"{table}: cannot read index table ({exc})") from None
