"""Putting an index's files in place in its directory: each source's table written under a
temporary name and renamed to a name derived from its content (removed again if the build
fails), the manifest's entry of every file, and, once the new manifest is committed, the
removal of tables only the previous manifest named.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from json.encoder import encode_basestring_ascii
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import polars as pl

from mds.core import storage
from mds.errors import IndexFormatError, MdsError
from mds.planner.index.discover import DataFile
from mds.planner.index.reuse import IndexedFile
from mds.planner.index.tables import TABLES, entry_template, table_checksum, table_intact
from mds.planner.runtime.atomic import cannot_write, fsync_file, is_temp, temp_sibling

__all__ = [
    "TableWriter",
    "cannot_write_index",
    "collect_garbage",
    "file_entries",
    "file_entry_texts",
]


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
            rel = f"{TABLES}/{name}-{checksum.removeprefix('blake2b:')[:16]}.parquet"
            final = self.output / rel
            if not final.exists() or not table_intact(final, checksum):  # a damaged one is replaced
                fsync_file(tmp)
                os.replace(tmp, final)
                if rel not in self.keep:
                    self.created.append(final)
        except (OSError, pl.exceptions.ComputeError) as exc:
            raise cannot_write_index(self.output, f"the table of source '{name}'", exc) from exc
        finally:
            tmp.unlink(missing_ok=True)
        return rel, checksum

    def rollback(self) -> None:
        """Remove the tables this writer created (never one the previous index names)."""
        for path in self.created:
            path.unlink(missing_ok=True)


def file_entries(
    files: list[IndexedFile],
    first_rows: np.ndarray,
    rows: np.ndarray,
    tokens: np.ndarray,
    root: Path,
    dropped: np.ndarray | None = None,
    id_base: int = 0,
) -> Iterator[dict[str, Any]]:
    """The manifest's entry of each file, made as it is written; `dropped`: an image-text
    source's samples left out for a bad image, per file; `id_base`: the first file's id."""
    for fi, (f, first_row, n_rows, n_tok) in enumerate(
        zip(files, first_rows.tolist(), rows.tolist(), tokens.tolist(), strict=True), id_base
    ):
        extra = {} if dropped is None else {"dropped_bad_images": int(dropped[fi - id_base])}
        yield {
            "id": fi,
            "path": f.data.rel,
            **_companion(f.data, root),
            "size": f.size,
            "mtime_ns": f.mtime_ns,
            "fingerprint": f.fingerprint,
            "first_row": first_row,
            "rows": n_rows,
            "tokens": n_tok,
            **extra,
        }


# The keys of a file's entry as file_entries makes it (no companion, no dropped count).
_PLAIN = ("id", "path", "size", "mtime_ns", "fingerprint", "first_row", "rows", "tokens")


def file_entry_texts(
    files: list[IndexedFile],
    first_rows: np.ndarray,
    rows: np.ndarray,
    tokens: np.ndarray,
    root: Path,
    dropped: np.ndarray | None = None,
) -> Iterator[dict[str, Any] | str]:
    """file_entries, with the entry of a file without a companion given as its manifest
    text (tables.entry_template): no dict per file, the same bytes written."""
    if dropped is not None:
        yield from file_entries(files, first_rows, rows, tokens, root, dropped)
        return
    keys, text = entry_template(_PLAIN)
    assert keys == tuple(sorted(_PLAIN)), keys  # the values below are in this order
    for fi, (f, first_row, n_rows, n_tok) in enumerate(
        zip(files, first_rows.tolist(), rows.tolist(), tokens.tolist(), strict=True)
    ):
        data = f.data
        if data.companion is not None:
            yield next(file_entries([f], np.array([first_row]), np.array([n_rows]),
                                    np.array([n_tok]), root, id_base=fi))  # fmt: skip
            continue
        yield text % (
            encode_basestring_ascii(f.fingerprint),
            first_row,
            fi,
            int.__repr__(f.mtime_ns),
            encode_basestring_ascii(data.rel),
            n_rows,
            int.__repr__(f.size),
            n_tok,
        )


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
