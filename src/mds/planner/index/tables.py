"""The index manifest, as the planner reads it: the executor's parser plus Polars scans."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from mds.core.index_manifest import (
    FORMAT,
    MANIFEST,
    VERSION,
    IndexManifest,
    bytes_checksum,
    history_name,
    index_fingerprint,
    read_manifest,
    read_manifest_of,
    read_table_bytes,
    table_checksum,
    table_damage,
)
from mds.errors import IndexFormatError
from mds.planner.runtime.atomic import atomic_path

__all__ = [
    "FORMAT",
    "TABLES",
    "download_index",
    "index_tables",
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
    "table_intact",
    "write_manifest",
]

TABLES = "sources"  # the folder of an index's tables


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


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest (json.dumps(indent=2, sort_keys=True) and a newline: small, its
    file lists are tables) to a temporary file, then replace `path`."""
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    with atomic_path(path) as tmp, open(tmp, "wb") as out:
        out.write(text.encode("ascii"))


def index_tables(manifest: IndexManifest) -> dict[str, str]:
    """{table: checksum} of every table a manifest names: each source's table and, since
    VERSION 2, its file list."""
    out: dict[str, str] = {}
    for entry in manifest.sources:
        out[str(entry["table"])] = str(entry["table_checksum"])
        if "files_table" in entry:
            out[str(entry["files_table"])] = str(entry["files_checksum"])
    return out


def download_index(url: str, local: Path, fingerprint: str | None = None) -> Path:
    """Copy the index under the prefix `url` to the directory `local`: the manifest first
    (the commit point: it names the tables of one complete index), then the tables it
    names, each checked against its checksum as it arrives, so a damaged one is named by
    its URL rather than by the temporary copy. `fingerprint`: the index a plan was made
    from; when a re-index replaced it, its manifest kept under history/ and its tables
    are copied instead (read_manifest_of then finds it)."""
    from mds.core import storage

    local.mkdir(parents=True)
    url = url.rstrip("/")
    manifest_url = f"{url}/{MANIFEST}"
    if not storage.exists(manifest_url):
        raise IndexFormatError(f"{url}: no index there ({MANIFEST} missing); run `mds index`")
    (local / MANIFEST).write_bytes(storage.get_bytes(manifest_url))
    try:
        manifest = read_manifest(local)
    except IndexFormatError as exc:
        raise IndexFormatError(str(exc).replace(str(local / MANIFEST), manifest_url)) from None
    kept = history_name(fingerprint) if fingerprint else ""
    if kept and manifest.fingerprint != fingerprint and storage.exists(f"{url}/{kept}"):
        (local / kept).parent.mkdir()
        (local / kept).write_bytes(storage.get_bytes(f"{url}/{kept}"))
        manifest = read_manifest_of(local, fingerprint)
    for rel, checksum in index_tables(manifest).items():
        data = storage.get_bytes(f"{url}/{rel}")
        got = bytes_checksum(data)
        if got != checksum:
            raise table_damage(f"{url}/{rel}", got, checksum)
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(data)
    return local


def table_intact(table: Path, checksum: str) -> bool:
    """Whether an index table still has the bytes its manifest records."""
    try:
        return table_checksum(table) == checksum
    except OSError:
        return False
