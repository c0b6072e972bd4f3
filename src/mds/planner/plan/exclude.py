"""`mds plan --exclude`: a list of documents that must not be trained on from step K on.

Each entry of the list (Parquet, CSV or JSONL, chosen by the file's extension) names one
document by (source, row), by (file, file_row) or (file, byte_offset), `file` relative to
the data root as `mds export` writes it, or by content_hash. The entries become global
sample ids; the planner leaves their eligible positions out of their sources' streams
(plan/stream.py), so their places are filled by the next samples of the same sources.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mds.core.index_manifest import index_sources
from mds.errors import ConfigError, PlanError
from mds.planner.index.tables import IndexManifest, source_table
from mds.planner.plan.pool import RANGE_FORMATS

__all__ = ["ExcludeList", "read_exclude_list", "resolve_entries"]

_READERS = {
    ".parquet": pl.read_parquet,
    ".csv": pl.read_csv,
    ".jsonl": pl.read_ndjson,
    ".ndjson": pl.read_ndjson,
}


@dataclass
class ExcludeList:
    """The entries of an exclude list, by kind; each keeps its row in the list (1-based)."""

    path: Path
    digest: str  # blake2b-128 of the list's bytes: what the plan's lineage records
    entries: int
    rows: list[tuple[int, str, int]] = field(default_factory=list)  # (list row, source, row)
    file_rows: list[tuple[int, str, int]] = field(default_factory=list)  # (list row, file, file_row)
    offsets: list[tuple[int, str, int]] = field(default_factory=list)  # (list row, file, byte_offset)
    hashes: list[tuple[int, str]] = field(default_factory=list)  # (list row, content_hash)


def read_exclude_list(path: Path) -> ExcludeList:
    """Read the list and sort each entry into its kind: the first of (source, row),
    (file, file_row), (file, byte_offset), content_hash whose values are all set."""
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise ConfigError(
            f"--exclude {path}: unknown list format {path.suffix!r}; use .parquet, .csv or .jsonl"
        )
    try:
        data = path.read_bytes()
        frame = reader(path) if data.strip() else pl.DataFrame()
    except OSError as exc:
        raise ConfigError(f"--exclude {path}: cannot read ({exc.strerror or exc})") from None
    except (pl.exceptions.PolarsError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"--exclude {path}: not a readable list ({first})") from None
    out = ExcludeList(path, hashlib.blake2b(data, digest_size=16).hexdigest(), frame.height)
    cols = set(frame.columns)
    if frame.height and not cols & {"source", "file", "content_hash"}:
        raise ConfigError(
            f"--exclude {path}: no column source, file or content_hash; name documents by "
            "(source, row), (file, file_row), (file, byte_offset) or content_hash"
        )

    def column(name: str) -> list[Any]:
        return frame[name].to_list() if name in cols else [None] * frame.height

    source, row, file = column("source"), column("row"), column("file")
    file_row, offset, digest = column("file_row"), column("byte_offset"), column("content_hash")
    for i in range(frame.height):
        at = i + 1
        if source[i] is not None and row[i] is not None:
            out.rows.append((at, str(source[i]), _int(path, at, "row", row[i])))
        elif file[i] is not None and file_row[i] is not None:
            out.file_rows.append((at, str(file[i]), _int(path, at, "file_row", file_row[i])))
        elif file[i] is not None and offset[i] is not None:
            out.offsets.append((at, str(file[i]), _int(path, at, "byte_offset", offset[i])))
        elif digest[i] is not None:
            out.hashes.append((at, str(digest[i])))
        else:
            raise ConfigError(
                f"--exclude {path} row {at}: names no document; set (source, row), "
                "(file, file_row), (file, byte_offset) or content_hash"
            )
    return out


def _int(path: Path, at: int, key: str, value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = -1
    if number < 0 or (isinstance(value, float) and value != number):
        raise ConfigError(f"--exclude {path} row {at}: {key} {value!r} is not a row number >= 0")
    return number


@dataclass
class _Located:
    """An index file: its source, position in the source's file list and rows."""

    source: str
    fid: int
    first_row: int
    end_row: int
    ranges: bool  # a JSONL / WebDataset file: rows are found by the index's file_row / offset


def resolve_entries(
    found: ExcludeList, manifest: IndexManifest, missing: str = "error"
) -> tuple[np.ndarray, dict[str, int], list[tuple[int, int]]]:
    """Global sample ids of the list's (source, row) and (file, ...) entries, sorted and
    unique; the entries given per source; and (list row, id) of each entry that matched.
    An entry naming an unknown source, file or row is a one-line error naming the list's
    row, unless `missing` is "ignore" (then it is left out and not counted as matched)."""
    sources = {s["name"]: s for s in manifest.sources}
    bases = {s["name"]: int(s["base"]) for s in index_sources(manifest)}
    given: dict[str, int] = {}
    ids: list[tuple[int, int]] = []

    def miss(at: int, what: str) -> None:
        if missing != "ignore":
            raise ConfigError(
                f"--exclude {found.path} row {at}: {what} (--exclude-missing=ignore skips "
                "entries the index does not hold)"
            )

    for at, name, row in found.rows:
        entry = sources.get(name)
        if entry is None:
            miss(at, f"no source {name!r} in the index")
            continue
        given[name] = given.get(name, 0) + 1
        if row >= int(entry["rows"]):
            miss(at, f"source {name!r} has {entry['rows']} rows, no row {row}")
            continue
        ids.append((at, bases[name] + row))
    if found.file_rows or found.offsets:
        files = _files(manifest)
        columns: dict[tuple[str, str], np.ndarray] = {}
        for kind, entries in (("file_row", found.file_rows), ("offset", found.offsets)):
            for at, path, value in entries:
                place = files.get(path)
                if place is None:
                    miss(at, f"no file {path!r} in the index (paths relative to the data root)")
                    continue
                given[place.source] = given.get(place.source, 0) + 1
                row = _row_in_file(place, kind, value, columns, manifest)
                if row is None:
                    what = "file_row" if kind == "file_row" else "byte_offset"
                    if kind == "offset" and not place.ranges:
                        raise ConfigError(
                            f"--exclude {found.path} row {at}: {path} is not a JSONL or "
                            "WebDataset file; name its rows by file_row"
                        )
                    miss(at, f"file {path!r} has no row at {what} {value}")
                    continue
                ids.append((at, bases[place.source] + row))
    unique = np.unique(np.array([i for _, i in ids], dtype=np.int64))
    return unique, given, ids


def _files(manifest: IndexManifest) -> dict[str, _Located]:
    out = {}
    for s in manifest.sources:
        ranges = s["format"] in RANGE_FORMATS
        files = s["files"]
        for fid, f in enumerate(files):
            end = int(files[fid + 1]["first_row"]) if fid + 1 < len(files) else int(s["rows"])
            out[f["path"]] = _Located(s["name"], fid, int(f["first_row"]), end, ranges)
    return out


def _row_in_file(
    place: _Located, kind: str, value: int, columns: dict[tuple[str, str], np.ndarray], manifest
) -> int | None:
    """The source row of a file's row or byte offset, or None if the file has none there.
    A JSONL or WebDataset file's rows come in line order, so both columns ascend in it."""
    if not place.ranges:
        if kind != "file_row":
            return None
        row = place.first_row + value
        return row if row < place.end_row else None
    values = columns.get((place.source, kind))
    if values is None:
        table = source_table(manifest, place.source, lambda schema: [c for c in (kind,) if c in schema])
        if kind not in table.columns:
            raise PlanError(f"index source {place.source!r} has no {kind} column; rebuild the index")
        values = columns[(place.source, kind)] = table[kind].to_numpy()
    mine = values[place.first_row : place.end_row]
    at = int(np.searchsorted(mine, value))
    return place.first_row + at if at < len(mine) and mine[at] == value else None


@dataclass
class Exclusion:
    """A resolved exclude list, as the planner takes it: the global ids, the entries given
    per source, and what the lineage records of the list itself."""

    ids: np.ndarray  # int64, sorted, unique
    given: dict[str, int]
    name: str  # the list's file name
    digest: str
    entries: int


def positions_of(pool, ids: np.ndarray) -> tuple[np.ndarray, int]:
    """The eligible positions in `pool` of the global ids `ids` (sorted), and how many of the
    ids that are this source's rows are not eligible (filtered or dropped as overlong)."""
    rows = ids[(ids >= pool.base) & (ids < pool.base + pool.index_rows)] - pool.base
    if not len(rows) or not pool.n:
        return np.zeros(0, np.int64), len(rows)
    eligible = np.asarray(pool.rows[:], dtype=np.int64)
    pos = np.minimum(np.searchsorted(eligible, rows), pool.n - 1)
    hit = eligible[pos] == rows
    return pos[hit].astype(np.int64), int((~hit).sum())
