"""What an index build can reuse: every file's fingerprint (in pool tasks, batched), the
settings of a source that change its table besides its files (spec_key), the previous
index in the output directory, and which files keep their rows from it: a file whose
fingerprint covers every byte by content whatever its mtime, any other only with its mtime.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mds.core import storage
from mds.core.fingerprint import fingerprint, hashes_every_byte, stat_signature
from mds.core.index_manifest import HISTORY
from mds.errors import ConfigError, IndexFormatError, SourceDataError
from mds.planner.index.config import SourceSpec
from mds.planner.index.discover import DataFile, is_index_dir
from mds.planner.index.tables import MANIFEST, TABLES, IndexManifest, read_manifest, table_intact
from mds.planner.runtime.atomic import is_temp

__all__ = [
    "FINGERPRINT_BATCH",
    "Hint",
    "IndexedFile",
    "fingerprint_batch",
    "fingerprint_file",
    "known_fingerprints",
    "recorded_fingerprint",
    "not_an_index",
    "previous_index",
    "resolve_tokenizer",
    "reused_files",
    "row_group_located",
    "source_payload",
    "Recorded",
    "recorded_files",
    "spec_key",
    "unchanged_source",
]

FINGERPRINT_BATCH = 256  # files fingerprinted per pool task


@dataclass(slots=True)
class IndexedFile:
    """A discovered file, what a stat and its fingerprint say of it, and whether its rows
    are reused from the previous table."""

    data: DataFile
    size: int
    mtime_ns: int
    fingerprint: str
    nbytes: int  # bytes a scan reads: the file plus a Megatron .idx
    reuse: int | None = None  # file id in the previous table whose rows stay valid


# What a build already knows of a file before it fingerprints it: (size, mtime_ns) from the
# object listing (None: stat it), and (size, mtime_ns, fingerprint) from the previous
# manifest (None: not indexed before under this path and fingerprint mode).
Hint = tuple[tuple[int, int] | None, tuple[int, int, str] | None]


def fingerprint_file(
    f: DataFile, mode: str, hint: Hint = (None, None)
) -> tuple[int, int, str, int]:
    """(size, mtime_ns, fingerprint, bytes to scan), stat-ing each file once (or not at all
    when the listing gave its size and mtime). A file whose size and mtime are the ones the
    previous index recorded keeps that fingerprint unread: a re-index of an unchanged file
    costs a stat (a local root) or nothing beyond the listing (an object store)."""
    listed, before = hint
    size, mtime = listed if listed is not None else stat_signature(f.path)
    known = recorded_fingerprint(f, mode, (size, mtime), before)
    if known is not None:
        return known
    fp = fingerprint(f.path, mode)
    nbytes = size
    if f.companion is not None:
        fp = f"{fp}+{fingerprint(f.companion, mode).split(':', 1)[1]}"
        nbytes += stat_signature(f.companion)[0]
    return size, mtime, fp, nbytes


def recorded_fingerprint(
    f: DataFile, mode: str, listed: tuple[int, int] | None, before: tuple[int, int, str] | None
) -> tuple[int, int, str, int] | None:
    """fingerprint_file's answer for a file whose size and mtime (`listed`: from a listing
    or discovery's stat) are the ones the previous index recorded (`before`), without
    reading it; None when the file must be fingerprinted."""
    if (
        listed is not None
        and before is not None
        and f.companion is None
        and listed[1] != 0  # a store that gives no modification time proves nothing
        and before[:2] == listed
        and before[2].startswith(f"{mode}:")
    ):
        return listed[0], listed[1], before[2], listed[0]
    return None


def known_fingerprints(
    files: list[DataFile], old: Recorded | None, mode: str, listed: dict | None = None
) -> tuple[list[tuple[int, int, str, int] | None], list[Hint]]:
    """Per file, in order: recorded_fingerprint's answer for it against `old` (the source's
    previous file list; a local file's size and mtime from discovery's stat, an object's
    from `listed`, the listing by key), else None; and for each of the None ones, its Hint.
    Compared as columns: a re-index of many unchanged files makes no object per file here."""
    if listed:
        sigs = [listed.get(f.rel, f.signature) for f in files]
    else:
        sigs = [f.signature for f in files]
    if old is None or not files or not old.n:
        return [None] * len(files), [(sig, None) for sig in sigs]
    sizes = [-1 if sig is None else sig[0] for sig in sigs]
    mtimes = [0 if sig is None else sig[1] for sig in sigs]
    rows = old.rows_of(files)
    old_sizes, old_mtimes, _, _ = old.arrays()
    recorded = old.of_mode(mode)[rows]  # recorded under this path, in this mode
    mt = np.array(mtimes, dtype=np.int64)
    same = recorded & (old_sizes[rows] == np.array(sizes)) & (old_mtimes[rows] == mt) & (mt != 0)
    if files[0].companion is not None:  # Megatron pairs (a source is of one format)
        same[:] = False  # always hashed
    rows_list = rows.tolist()
    fps: list = list(
        zip(sizes, mtimes, map(old.fingerprints.__getitem__, rows_list), sizes, strict=True)
    )
    hints: list[Hint] = []
    for i in np.flatnonzero(~same).tolist():
        fps[i] = None
        j = rows_list[i]
        before = (old.sizes[j], old.mtimes[j], old.fingerprints[j]) if recorded[i] else None
        hints.append((sigs[i], before))
    return fps, hints


def fingerprint_batch(
    files: list[DataFile],
    mode: str,
    driver: str | None = None,
    hints: list[Hint] | None = None,
) -> list[tuple[int, int, str, int]]:
    """One engine task: the fingerprints of a batch of files. `driver`: the host that listed
    them; on another host a listed file that is missing is a path this node does not share.
    `hints`: what the listing and the previous index say of each file (fingerprint_file)."""
    host = socket.gethostname()
    if driver is not None and driver != host:
        for f in files:
            if not storage.is_url(f.path) and not os.path.exists(f.path):
                raise SourceDataError(
                    f"{f.rel}: not visible on Ray node {host} ({f.path} is missing there); "
                    "mount the data root at the same path on every node, or use an s3:// root"
                )
    hints = hints or [(None, None)] * len(files)
    return [fingerprint_file(f, mode, h) for f, h in zip(files, hints, strict=True)]


def row_group_located(spec: SourceSpec, fmt: str) -> bool:
    """Whether the table has each row's first value in its row group (`offset`): a Parquet
    token list, whose rows the executor then reads from pages (src/mds/formats/parquet/pages.py)."""
    return fmt == "parquet" and spec.length.kind == "tokens"


def source_payload(spec: SourceSpec, fmt: str) -> dict[str, str] | None:
    """Where the executor finds a sample's content (`SourceSpec.payload`), and for a Parquet
    token list that the plan locates its rows by their values' place in the row group."""
    payload = spec.payload
    if payload is not None and row_group_located(spec, fmt):
        payload = {**payload, "offsets": "row_group"}
    return payload


def spec_key(spec: SourceSpec, fmt: str, tokenizer: Path | None) -> str:
    """Everything about a source that changes its table besides the files themselves."""
    key: dict[str, Any] = {
        "format": fmt,
        "length": spec.length.describe(),
        "text": spec.text,
        "keep": list(spec.keep),
    }
    if row_group_located(spec, fmt):
        key["offsets"] = "row_group"
    if spec.images is not None:  # which images, the marker that places them, bad ones
        key["images"] = spec.images.describe()
    if tokenizer is not None:
        key["tokenizer_fingerprint"] = fingerprint(tokenizer, "full")
    return json.dumps(key, sort_keys=True)


def previous_index(output: Path) -> IndexManifest | None:
    """The index already in the directory `output`, whose rows a build may reuse (see
    recorded_files); None for a missing or empty directory, or an unreadable manifest of
    ours (rebuilt from scratch). ConfigError for anything that is not an mds index."""
    if not output.exists():
        return None
    if not output.is_dir():
        raise ConfigError(f"{output}: output exists and is not a directory")
    if (output / MANIFEST).exists():
        if not is_index_dir(output):  # someone else's manifest.json: not ours to replace
            raise not_an_index(output)
        try:
            return read_manifest(output)
        except IndexFormatError as exc:
            if "newer" in str(exc):
                raise
            return None  # unreadable old index: rebuild from scratch, still atomically
    if any(p for p in output.iterdir() if not is_temp(p) and p.name not in (TABLES, HISTORY)):
        raise not_an_index(output)
    return None


class Recorded:
    """A source's file list in the previous index, as columns: what a re-index compares the
    files it finds with, and the counts of the ones it keeps."""

    def __init__(self, spec_key: str | None, table: pa.Table):
        self.spec_key, self.table, self.n = spec_key, table, table.num_rows
        self.paths: list[str] = table.column("path").to_pylist()
        self.sizes: list[int] = table.column("size").to_pylist()
        self.mtimes: list[int] = table.column("mtime_ns").to_pylist()
        self.fingerprints: list[str] = table.column("fingerprint").to_pylist()
        self.ids: list[int] = table.column("id").to_pylist()
        # row of each path (the last, where a path is recorded twice)
        self.by_path = dict(zip(self.paths, range(self.n), strict=True))
        self.unique = len(self.by_path) == self.n
        self._arrays: tuple[np.ndarray, ...] | None = None
        self._rows: tuple[list[DataFile], np.ndarray] | None = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(sizes, mtimes, fingerprints as objects, ids), each with one more row at the end
        that matches nothing: row -1, where rows_of puts a path not recorded."""
        if self._arrays is None:
            ints = [
                np.append(self.table.column(k).to_numpy().astype(np.int64, copy=False), -1)
                for k in ("size", "mtime_ns", "id")
            ]
            prints = np.empty(self.n + 1, dtype=object)
            prints[: self.n] = self.fingerprints
            self._arrays = (ints[0], ints[1], prints, ints[2])
        return self._arrays  # type: ignore[return-value]

    def rows_of(self, files: list[DataFile]) -> np.ndarray:
        """The row recording each file's path (the last, where one is recorded twice), -1 if
        none; kept for the last list asked about (a build asks twice of each source's)."""
        if self._rows is not None and self._rows[0] is files:
            return self._rows[1]
        rels = [f.rel for f in files]
        rows = np.fromiter(map(self.by_path.get, rels, repeat(-1)), np.int64, len(rels))
        self._rows = (files, rows)
        return rows

    def of_mode(self, mode: str) -> np.ndarray:
        """Per row (and the extra row -1: False), whether its fingerprint is of `mode`."""
        of = pc.starts_with(self.table.column("fingerprint"), f"{mode}:")
        return np.append(of.to_numpy(zero_copy_only=False).astype(bool, copy=False), False)

    def counts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(first rows, rows, tokens) of each file."""
        return tuple(  # type: ignore[return-value]
            self.table.column(k).to_numpy().astype(np.int64, copy=False)
            for k in ("first_row", "rows", "tokens")
        )

    def dropped(self) -> dict[int, int]:
        """An image-text source's samples left out for a bad image, by file id."""
        if "dropped_bad_images" not in self.table.column_names:
            return {}
        values = self.table.column("dropped_bad_images").to_pylist()
        return {i: v or 0 for i, v in zip(self.ids, values, strict=True)}


def recorded_files(previous: IndexManifest | None) -> dict[str, Recorded]:
    """Each source of the previous index whose table and file list are intact, by name: a
    damaged or missing one's files are all rescanned (and its table replaced)."""
    out: dict[str, Recorded] = {}
    for entry in previous.sources if previous is not None else ():
        if not table_intact(previous.path / entry["table"], entry["table_checksum"]):
            continue
        try:
            table = entry.file_table()
        except IndexFormatError:
            continue  # a damaged file list: the source is rescanned
        out[entry["name"]] = Recorded(entry.get("spec_key"), table)
    return out


def not_an_index(output: Path | str) -> ConfigError:
    """The error for an output (directory or prefix) that holds something else."""
    return ConfigError(
        f"{output}: exists, is not empty and is not an mds index; pick another --output"
    )


def resolve_tokenizer(spec: SourceSpec, root: Path) -> Path | None:
    """The source's tokenizer.json, or None without one: the config records it absolute, or
    relative to a local data root that holds it (index/config.py)."""
    if spec.length.tokenizer is None:
        return None
    path = Path(spec.length.tokenizer)
    path = path if path.is_absolute() else root / path
    if not path.is_file():
        raise ConfigError(f"source '{spec.name}': `tokenizer` {path} not found")
    return path.resolve()


def reused_files(
    spec: SourceSpec,
    files: list[DataFile],
    fps: list[tuple[int, int, str, int]],
    spec_key: str,
    old: Recorded | None,
) -> list[IndexedFile]:
    """The source's files with their fingerprints (`fps`), each marked with the id of its
    rows in the previous index's file list `old` where they stay valid."""
    # A file's identity is its content: when its fingerprint covers every byte (a full one,
    # or a sampled one of a small file) its rows are reused whatever its mtime, so data copied
    # or synced without mtimes is not rescanned; otherwise the mtime must match too.
    assert len(files) == len(fps), (len(files), len(fps))
    if old is None or old.spec_key != spec_key:
        return [IndexedFile(f, *fp) for f, fp in zip(files, fps, strict=True)]
    if not old.unique:  # a path recorded twice: the last matching entry
        return _reused_by_keys(files, fps, old)
    # With one entry per path, the only entry a file can keep is the one of its path:
    # compared as columns, and a file's content checked (hashes_every_byte) only where its
    # mtime is not the one recorded.
    rows = old.rows_of(files)
    old_sizes, old_mtimes, old_prints, old_ids = old.arrays()
    size, mtime, fp, nbytes = (list(c) for c in zip(*fps, strict=True)) if fps else ([], [], [], [])
    prints = np.empty(len(fps), dtype=object)
    prints[:] = fp
    same = (old_sizes[rows] == np.array(size, dtype=np.int64)) & (old_prints[rows] == prints)
    stale = same & (old_mtimes[rows] != np.array(mtime, dtype=np.int64))
    for i in np.flatnonzero(stale).tolist():
        same[i] = hashes_every_byte(fp[i], size[i], nbytes[i] - size[i])
    reuse: list = old_ids[rows].tolist()
    for i in np.flatnonzero(~same).tolist():
        reuse[i] = None
    return list(map(IndexedFile, files, size, mtime, fp, nbytes, reuse))


def _reused_by_keys(
    files: list[DataFile], fps: list[tuple[int, int, str, int]], old: Recorded
) -> list[IndexedFile]:
    """reused_files for a file list that records a path more than once."""
    by_content: dict[tuple, int] = {}
    by_stat: dict[tuple, int] = {}
    for j in range(old.n):
        key = (old.paths[j], old.sizes[j], old.fingerprints[j])
        by_content[key] = by_stat[(*key, old.mtimes[j])] = old.ids[j]
    planned = []
    for f, (size, mtime, fp, nbytes) in zip(files, fps, strict=True):
        key = (f.rel, size, fp)
        if hashes_every_byte(fp, size, nbytes - size):
            reuse = by_content.get(key)
        else:
            reuse = by_stat.get((*key, mtime))
        planned.append(IndexedFile(f, size, mtime, fp, nbytes, reuse))
    return planned


def unchanged_source(
    spec: SourceSpec,
    fmt: str,
    key: str,
    files: list[DataFile],
    fps: list[tuple[int, int, str, int]],
    old: dict | None,
    recorded: Recorded | None,
) -> bool:
    """Whether a source's table and file list would come out as the previous index has
    them: the same settings, and the same files in the same order, each with the path,
    size, mtime and fingerprint (`fps`) recorded (so each reuses its own rows whole). Its
    table is then kept as it is, and no IndexedFile is made for its files. (Image-text
    sources, whose file lists carry counts of dropped samples, are rebuilt.)"""
    if old is None or recorded is None or spec.images is not None or old.get("spec_key") != key:
        return False
    if not all(k in old for k in ("keep", "tokens", "length_stats")):
        return False  # an entry this mds would not have written: rebuilt
    n = len(files)
    if old.get("format") != fmt or recorded.n != n or recorded.spec_key != key or not n:
        return False
    # compared as lists: a source of a million unchanged files is a few C loops
    if recorded.ids != list(range(n)) or [f.rel for f in files] != recorded.paths:
        return False
    size, mtime, fp, _ = zip(*fps, strict=True)
    return (
        list(size) == recorded.sizes
        and list(mtime) == recorded.mtimes
        and list(fp) == recorded.fingerprints
    )
