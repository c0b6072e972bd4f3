"""Putting an index's files in place in its directory: each source's table and file list
written under a temporary name and renamed to a name derived from its content (removed
again if the build fails), and, once the new manifest is committed, the
removal of tables only the previous manifest named.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from mds.core import storage
from mds.core.index_manifest import bytes_checksum, file_list_bytes, file_list_table
from mds.errors import IndexFormatError, MdsError
from mds.planner.index.discover import DataFile
from mds.planner.index.reuse import IndexedFile
from mds.planner.index.tables import TABLES, table_checksum, table_intact
from mds.planner.runtime.atomic import cannot_write, fsync_file, is_temp, temp_sibling

__all__ = [
    "TableWriter",
    "cannot_write_index",
    "collect_garbage",
    "file_list",
]


def _content_name(stem: str, checksum: str) -> str:
    """sources/<stem>-<16 hex of the checksum>.parquet: a table's name derived from its bytes."""
    return f"{TABLES}/{stem}-{checksum.removeprefix('blake2b:')[:16]}.parquet"


def cannot_write_index(output: Path, what: str, exc: Exception) -> MdsError:
    """A failed write of `what` in the index `output` as one error naming both."""
    return cannot_write(output, what, exc, IndexFormatError)


class TableWriter:
    """Publishes new tables and remembers them, so a failed build can remove them again."""

    def __init__(self, output: Path, keep: set[str]):
        self.output, self.keep, self.created = output, keep, []

    def write_table(self, name: str, frame: pl.DataFrame) -> tuple[str, str]:
        """Write under a temporary name, then rename to a name derived from the content."""
        tables = self.output / TABLES
        tmp = temp_sibling(tables / f"{name}.parquet")
        try:
            tables.mkdir(parents=True, exist_ok=True)
            frame.write_parquet(tmp, compression="zstd", statistics=True)
            checksum = table_checksum(tmp)
            rel = _content_name(name, checksum)
            self._install(tmp, rel, checksum)
        except (OSError, pl.exceptions.ComputeError) as exc:
            raise cannot_write_index(self.output, f"the table of source '{name}'", exc) from exc
        finally:
            tmp.unlink(missing_ok=True)
        return rel, checksum

    def write_file_list(self, name: str, table: pa.Table) -> tuple[str, str]:
        """Write a source's file list as write_table writes its table: its name
        sources/<name>-files-<16 hex of its checksum>.parquet."""
        data = file_list_bytes(table)
        checksum = bytes_checksum(data)
        rel = _content_name(f"{name}-files", checksum)
        if table_intact(self.output / rel, checksum):  # nothing to write
            return rel, checksum
        tmp = temp_sibling(self.output / rel)
        try:
            tmp.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            self._install(tmp, rel, checksum)
        except OSError as exc:
            raise cannot_write_index(self.output, f"the file list of source '{name}'", exc) from exc
        finally:
            tmp.unlink(missing_ok=True)
        return rel, checksum

    def _install(self, tmp: Path, rel: str, checksum: str) -> None:
        """Rename the written `tmp` to `rel`, unless the file there already has its bytes (a
        damaged one is replaced); what this build puts there is noted for rollback."""
        final = self.output / rel
        if not final.exists() or not table_intact(final, checksum):
            fsync_file(tmp)
            os.replace(tmp, final)
            if rel not in self.keep:
                self.created.append(final)

    def rollback(self) -> None:
        """Remove the tables this writer created (never one the previous index names)."""
        for path in self.created:
            path.unlink(missing_ok=True)


def file_list(
    files: list[IndexedFile],
    first_rows: np.ndarray,
    rows: np.ndarray,
    tokens: np.ndarray,
    root: Path,
    dropped: np.ndarray | None = None,
) -> pa.Table:
    """The source's file list (the table its manifest entry names: docs/index-format.md),
    made from columns; `dropped`: an image-text source's samples left out for a bad image,
    per file."""
    columns: dict[str, Any] = {
        "id": np.arange(len(files), dtype=np.int64),
        "path": [f.data.rel for f in files],
        "size": [f.size for f in files],
        "mtime_ns": [f.mtime_ns for f in files],
        "fingerprint": [f.fingerprint for f in files],
        "first_row": first_rows,
        "rows": rows,
        "tokens": tokens,
        "dropped_bad_images": dropped,
    }
    if files and files[0].data.companion is not None:  # Megatron (a source is of one format)
        columns["index_path"] = [_companion(f.data, root).get("index_path") for f in files]
    return file_list_table(columns)


def _companion(f: DataFile, root: Path) -> dict[str, str]:
    if f.companion is None:
        return {}
    if storage.is_url(f.companion):  # beside the .bin, as discovery paired them
        return {
            "index_path": str(PurePosixPath(f.rel).with_name(PurePosixPath(str(f.companion)).name))
        }
    return {"index_path": f.companion.relative_to(root.resolve()).as_posix()}


def collect_garbage(output: Path, live: set[str], owned: set[str]) -> None:
    """Remove the tables the previous manifest named (`owned`) and the new one does not, and
    temp files of dead writers: nothing else in `sources/`, which mds cannot prove it wrote."""
    tables = output / TABLES
    if not tables.is_dir():
        return
    for path in tables.iterdir():
        rel = f"{TABLES}/{path.name}"
        if rel not in live and (rel in owned or is_temp(path)):
            path.unlink(missing_ok=True)
