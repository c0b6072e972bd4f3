"""The index manifest, as the planner reads it: the executor's parser plus Polars scans."""

from __future__ import annotations

import polars as pl

from mds.executor.errors import IndexFormatError
from mds.executor.manifest import (
    FORMAT,
    MANIFEST,
    VERSION,
    IndexManifest,
    index_fingerprint,
    read_manifest,
    table_checksum,
)

__all__ = [
    "FORMAT",
    "MANIFEST",
    "VERSION",
    "IndexManifest",
    "index_fingerprint",
    "read_manifest",
    "source_frame",
    "table_checksum",
]


def source_frame(manifest: IndexManifest, name: str) -> pl.LazyFrame:
    """Lazy scan of one source's index table."""
    entry = manifest.source(name)
    table = manifest.path / entry["table"]
    if not table.is_file():
        raise IndexFormatError(f"{table}: index table of source {name!r} is missing")
    return pl.scan_parquet(table)
