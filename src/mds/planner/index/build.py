"""Build or refresh an index directory from an IndexConfig.

Steps: discover every source's files; fingerprint them; reuse the rows of files whose
fingerprint and source settings are unchanged; scan the rest in parallel; write each
source's table under a temporary name, rename it to a content-addressed name; finally
replace manifest.json, the commit point. On any failure the previous index is untouched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import polars as pl

from mds.core import commit, storage
from mds.core.fingerprint import fingerprint, hashes_every_byte, stat_signature
from mds.errors import (
    ConfigError,
    IndexFormatError,
    Interrupted,
    MdsError,
    SourceDataError,
)
from mds.planner.index.arrow import scan_arrow
from mds.planner.index.config import IndexConfig, SourceSpec, resolve_format
from mds.planner.index.discover import (
    MANIFEST_HEAD,
    DataFile,
    discover,
    is_index_dir,
    is_index_manifest,
)
from mds.planner.index.jsonl import scan_jsonl
from mds.planner.index.jsonl_batch import scan_jsonl_batch
from mds.planner.index.megatron import scan_megatron
from mds.planner.index.objects import discover_objects, head, listing, relative_key
from mds.planner.index.parquet import scan_parquet
from mds.planner.index.scan import MAX_NESTING, ScanContext, check_nesting, nesting
from mds.planner.index.tables import (
    FORMAT,
    MANIFEST,
    VERSION,
    IndexManifest,
    index_fingerprint,
    read_manifest,
    read_table,
    table_checksum,
    write_manifest,
)
from mds.planner.runtime import upload
from mds.planner.runtime.atomic import (
    cannot_write,
    clean_stale_temps,
    fsync_file,
    is_temp,
    temp_sibling,
)
from mds.planner.runtime.engine import EngineSpec, open_engine
from mds.planner.runtime.lock import output_lock
from mds.planner.runtime.outputs import check_output

__all__ = ["IndexSummary", "Progress", "SourceSummary", "build_index"]

SCANNERS = {
    "parquet": scan_parquet,
    "jsonl": scan_jsonl,
    "jsonl.zst": scan_jsonl,
    "arrow": scan_arrow,
    "megatron": scan_megatron,
}
# Scanners of many small files at once: (rows of all files, rows per file), or None when the
# files must be scanned one by one (see scan_jsonl_batch).
BATCH_SCANNERS = {"jsonl": scan_jsonl_batch, "jsonl.zst": scan_jsonl_batch}
SMALL_FILE = 1 << 20  # files up to this size are scanned in batches ...
BATCH_BYTES = 8 << 20  # ... of up to this many bytes
BATCH_FILES = 4096  # ... and files
FINGERPRINT_BATCH = 256  # files fingerprinted per pool task
TABLES = "sources"
PERCENTILES = (50, 90, 99)


class Progress:
    """Callbacks for long work; the CLI draws a bar, the library default does nothing.
    `advance` is called from the scanning threads too (per chunk of a large file)."""

    def start(self, total_bytes: int, total_files: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...


class _Meter:
    """One scan task's bytes reported so far, passed on to the run's Progress."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.reported = 0

    def __call__(self, nbytes: int) -> None:
        self.reported += nbytes
        self.progress.advance(nbytes)


@dataclass
class SourceSummary:
    name: str
    format: str
    files: int
    files_scanned: int
    rows: int
    tokens: int
    exact: bool
    bytes_scanned: int


@dataclass
class IndexSummary:
    path: str
    fingerprint: str
    sources: list[SourceSummary] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def bytes_scanned(self) -> int:
        return sum(s.bytes_scanned for s in self.sources)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.path,
            "fingerprint": self.fingerprint,
            "rows": sum(s.rows for s in self.sources),
            "tokens": sum(s.tokens for s in self.sources),
            "files": sum(s.files for s in self.sources),
            "files_scanned": sum(s.files_scanned for s in self.sources),
            "bytes_scanned": self.bytes_scanned,
            "seconds": round(self.seconds, 3),
            "sources": [asdict(s) for s in self.sources],
        }


@dataclass(slots=True)
class _File:
    data: DataFile
    size: int
    mtime_ns: int
    fingerprint: str
    nbytes: int  # bytes a scan reads: the file plus a Megatron .idx
    reuse: int | None = None  # file id in the previous table whose rows stay valid


def _fingerprint(f: DataFile, mode: str) -> tuple[int, int, str, int]:
    """(size, mtime_ns, fingerprint, bytes to scan), stat-ing each file once."""
    size, mtime = stat_signature(f.path)
    fp = fingerprint(f.path, mode)
    nbytes = size
    if f.companion is not None:
        fp = f"{fp}+{fingerprint(f.companion, mode).split(':', 1)[1]}"
        nbytes += stat_signature(f.companion)[0]
    return size, mtime, fp, nbytes


def _fingerprint_batch(
    files: list[DataFile], mode: str, driver: str | None = None
) -> list[tuple[int, int, str, int]]:
    """One engine task: the fingerprints of a batch of files. `driver`: the host that listed
    them; on another host a listed file that is missing is a path this node does not share."""
    host = socket.gethostname()
    if driver is not None and driver != host:
        for f in files:
            if not storage.is_url(f.path) and not os.path.exists(f.path):
                raise SourceDataError(
                    f"{f.rel}: not visible on Ray node {host} ({f.path} is missing there); "
                    "mount the data root at the same path on every node, or use an s3:// root"
                )
    return [_fingerprint(f, mode) for f in files]


def _row_group_located(spec: SourceSpec, fmt: str) -> bool:
    """Whether the table has each row's first value in its row group (`offset`): a Parquet
    token list, whose rows the executor then reads from pages (src/mds/formats/parquet/pages.py)."""
    return fmt == "parquet" and spec.length.kind == "tokens"


def _payload(spec: SourceSpec, fmt: str) -> dict[str, str] | None:
    """Where the executor finds a sample's content (`SourceSpec.payload`), and for a Parquet
    token list that the plan locates its rows by their values' place in the row group."""
    payload = spec.payload
    if payload is not None and _row_group_located(spec, fmt):
        payload = {**payload, "offsets": "row_group"}
    return payload


def _spec_key(spec: SourceSpec, fmt: str, tokenizer: Path | None) -> str:
    """Everything about a source that changes its table besides the files themselves."""
    key: dict[str, Any] = {
        "format": fmt,
        "length": spec.length.describe(),
        "text": spec.text,
        "keep": list(spec.keep),
    }
    if _row_group_located(spec, fmt):
        key["offsets"] = "row_group"
    if tokenizer is not None:
        key["tokenizer_fingerprint"] = fingerprint(tokenizer, "full")
    return json.dumps(key, sort_keys=True)


def _previous(output: Path) -> IndexManifest | None:
    if not output.exists():
        return None
    if not output.is_dir():
        raise ConfigError(f"{output}: output exists and is not a directory")
    if (output / MANIFEST).exists():
        if not is_index_dir(output):  # someone else's manifest.json: not ours to replace
            raise _not_an_index(output)
        try:
            previous = read_manifest(output)
        except IndexFormatError as exc:
            if "newer" in str(exc):
                raise
            return None  # unreadable old index: rebuild from scratch, still atomically
        for entry in previous.sources:
            if not _intact(previous.path / entry["table"], entry["table_checksum"]):
                entry["files"] = []  # damaged table: none of its rows is reused, all rescanned
        return previous
    if any(p for p in output.iterdir() if not is_temp(p) and p.name != TABLES):
        raise _not_an_index(output)
    return None


def _not_an_index(output: Path | str) -> ConfigError:
    return ConfigError(
        f"{output}: exists, is not empty and is not an mds index; pick another --output"
    )


# The name of a table mds writes: sources/<source>-<16 hex digits of its checksum>.parquet.
_TABLE_NAME = re.compile(rf"{TABLES}/[^/]+-[0-9a-f]{{16}}\.parquet")


@dataclass
class _Prefix:
    """What an index prefix held before a build wrote anything (one listing)."""

    named: set[str]  # tables its manifest names: the only objects a re-index may remove
    present: set[str]  # table objects there, named or not (temporaries aside)
    had_index: bool  # a manifest.json of ours was there


def _previous_objects(url: str) -> _Prefix:
    """What the prefix `url` holds, read before anything is written. The rule of `_previous`
    for a directory: a prefix holding anything but an mds index (or tables without a
    manifest, left by a failed run) is refused; a damaged mds manifest is rebuilt from
    scratch, removing nothing."""
    import tempfile

    from mds.planner.runtime.object_lock import lock_url

    own_lock = relative_key(lock_url(url), url)  # inside the prefix for a whole bucket
    keys = [key for key, _size in storage.list_objects(url) if key != own_lock]
    present = {k for k in keys if k.startswith(f"{TABLES}/") and not commit.is_temp_name(k)}
    manifest_url = f"{url}/{MANIFEST}"
    if MANIFEST not in keys:
        if any(k.split("/", 1)[0] != TABLES and not commit.is_temp_name(k) for k in keys):
            raise _not_an_index(url)
        return _Prefix(set(), present, False)
    if not is_index_manifest(head(manifest_url, MANIFEST_HEAD)):
        raise _not_an_index(url)
    with tempfile.TemporaryDirectory(prefix="mds-index-") as tmp:
        (Path(tmp) / MANIFEST).write_bytes(storage.get_bytes(manifest_url))
        try:
            previous = read_manifest(tmp)
        except IndexFormatError as exc:
            if "newer" in str(exc):
                raise IndexFormatError(
                    str(exc).replace(str(Path(tmp) / MANIFEST), manifest_url)
                ) from None
            return _Prefix(set(), present, True)
    named = {str(e["table"]) for e in previous.sources if _TABLE_NAME.fullmatch(str(e["table"]))}
    return _Prefix(named, present, True)


def _check_object_output(config: IndexConfig, url: str) -> None:
    """Refuse an index prefix that is, or holds, the data root (as check_output refuses such
    a directory): its cleanup and its tables would share the prefix with the sources."""
    root = str(config.root)
    if not storage.is_url(root):
        return
    where = relative_key(root, url)
    if where == "":
        raise ConfigError(f"-o {url} is the data root {root}; choose another output")
    if where is not None:
        raise ConfigError(f"-o {url} holds the data root {root}; choose another output")


def _resolve_tokenizer(spec: SourceSpec, root: Path) -> Path | None:
    if spec.length.tokenizer is None:
        return None
    path = Path(spec.length.tokenizer)
    if storage.is_url(root) and not path.is_absolute():
        raise ConfigError(
            f"source '{spec.name}': `tokenizer` {spec.length.tokenizer!r} is relative to a data "
            f"root in object storage ({root}); give a local path to the tokenizer.json"
        )
    path = path if path.is_absolute() else root / path
    if not path.is_file():
        raise ConfigError(f"source '{spec.name}': `tokenizer` {path} not found")
    return path.resolve()


def _plan_files(
    spec: SourceSpec,
    files: list[DataFile],
    fps: list[tuple[int, int, str, int]],
    spec_key: str,
    old: dict | None,
) -> list[_File]:
    # A file's identity is its content: when its fingerprint covers every byte (a full one,
    # or a sampled one of a small file) its rows are reused whatever its mtime, so data copied
    # or synced without mtimes is not rescanned; otherwise the mtime must match too.
    by_content: dict[tuple, int] = {}
    by_stat: dict[tuple, int] = {}
    if old is not None and old.get("spec_key") == spec_key:
        for entry in old["files"]:
            key = (entry["path"], entry["size"], entry["fingerprint"])
            by_content[key] = by_stat[(*key, entry["mtime_ns"])] = entry["id"]
    planned = []
    for f, (size, mtime, fp, nbytes) in zip(files, fps, strict=True):
        key = (f.rel, size, fp)
        if hashes_every_byte(fp, size, nbytes - size):
            reuse = by_content.get(key)
        else:
            reuse = by_stat.get((*key, mtime))
        planned.append(_File(f, size, mtime, fp, nbytes, reuse))
    return planned


@dataclass
class _Part:
    """Rows of the consecutive files first, first+1, ... of a source, in file order.

    `rows` holds each file's row count. `alone` means each file was scanned alone (or, for
    rows reused from the previous table, carries that table's types): its column types are
    the file's own. A batch part's non-null column types hold for every file with a value."""

    first: int
    rows: np.ndarray
    frame: pl.DataFrame
    alone: bool = True


def _type_events(part: _Part, spec: SourceSpec):
    """(file index, column position, column, type) of the first file of the part that types
    each kept column (the files before it have only nulls there)."""
    for pos, col in enumerate(spec.keep):
        dtype = part.frame.schema[col]
        if dtype == pl.Null:
            continue
        if part.alone:
            yield part.first, pos, col, dtype
            continue
        present = part.frame[col].is_not_null()
        if not present.any():
            continue
        row = int(present.arg_true()[0])
        ends = np.cumsum(part.rows)
        yield part.first + int(np.searchsorted(ends, row, side="right")), pos, col, dtype


def _check_schema(
    parts: list[_Part], files: list[_File], spec: SourceSpec
) -> dict[str, pl.DataType]:
    """Kept columns must have one type across a source's files (all-null files adapt)."""
    types: dict[str, tuple[pl.DataType, str]] = {}
    events = sorted(
        (e for part in parts for e in _type_events(part, spec)), key=lambda e: (e[0], e[1])
    )
    for fi, _, col, dtype in events:
        f = files[fi]
        seen = types.setdefault(col, (dtype, f.data.rel))
        if seen[0] != dtype:
            raise SourceDataError(
                f"{f.data.rel}: column `{col}` has type {dtype} but {seen[0]} in {seen[1]} "
                f"(schema drift inside source '{spec.name}')"
            )
    return {col: types.get(col, (pl.String, ""))[0] for col in spec.keep}


def _length_stats(n: pl.Series) -> dict[str, Any]:
    if n.len() == 0:
        return {}
    stats: dict[str, Any] = {
        "min": int(n.min()),
        "max": int(n.max()),
        "mean": round(float(n.mean()), 3),
    }
    stats.update(zip((f"p{p}" for p in PERCENTILES), _nearest_ranks(n), strict=True))
    return stats


def _nearest_ranks(n: pl.Series) -> list[int]:
    """Polars' nearest-rank percentiles (`quantile(p / 100, interpolation="nearest")`: the
    value at sorted position round((len - 1) * p / 100), halves away from zero), found by
    one introselect (np.partition) instead of a sort per percentile."""
    values = n.to_numpy()
    ranks = [int(np.floor((len(values) - 1) * (p / 100) + 0.5)) for p in PERCENTILES]
    chosen = np.partition(values, ranks)
    return [int(chosen[r]) for r in ranks]


def _cannot_write(output: Path, what: str, exc: Exception) -> MdsError:
    return cannot_write(output, what, exc, IndexFormatError)


class _Writer:
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
            if not final.exists() or not _intact(final, checksum):  # a damaged one is replaced
                fsync_file(tmp)
                os.replace(tmp, final)
                if rel not in self.keep:
                    self.created.append(final)
        except (OSError, pl.exceptions.ComputeError) as exc:
            raise _cannot_write(self.output, f"the table of source '{name}'", exc) from exc
        finally:
            tmp.unlink(missing_ok=True)
        return rel, checksum

    def rollback(self) -> None:
        for path in self.created:
            path.unlink(missing_ok=True)


def _assemble(spec: SourceSpec, fmt: str, files: list[_File], parts: list[_Part]) -> pl.DataFrame:
    """One table from parts in file order: file_id by file, kept columns cast to one type."""
    parts = sorted(parts, key=lambda p: p.first)
    types = _check_schema(parts, files, spec)
    cols = ["file_id", "file_row"] + (["offset", "length"] if fmt.startswith("jsonl") else [])
    cols += ["offset"] if _row_group_located(spec, fmt) else []
    cols += ["n_tokens", *spec.keep]
    frames = []
    for part in parts:
        ids = np.repeat(
            np.arange(part.first, part.first + len(part.rows), dtype=np.uint32), part.rows
        )
        frames.append(
            part.frame.with_columns(
                pl.Series("file_id", ids, dtype=pl.UInt32),
                *[pl.col(c).cast(types[c]) for c in spec.keep],
            ).select(cols)
        )
    return pl.concat(frames, how="vertical")


def _intact(table: Path, checksum: str) -> bool:
    """Whether a previous index table still has the bytes its manifest records."""
    try:
        return table_checksum(table) == checksum
    except OSError:
        return False


def _old_rows(previous: IndexManifest | None, old: dict | None, files: list[_File]) -> list[_Part]:
    """The reused files' rows of the previous table, renumbered to the new file ids, as parts
    of consecutive files (a scanned file between two reused ones splits them). Both file
    lists are sorted by path, so the reused files keep their order."""
    reuse = [(f.reuse, fi) for fi, f in enumerate(files) if f.reuse is not None]
    if not reuse or previous is None or old is None:
        return []
    table = read_table(previous.path / old["table"], old["table_checksum"])
    new_id = np.full(max(max(o for o, _ in reuse), len(old["files"])) + 1, -1, dtype=np.int64)
    for o, fi in reuse:
        new_id[o] = fi
    ids = new_id[table["file_id"].to_numpy()]
    keep = ids >= 0
    table = table.filter(pl.Series(keep)).drop("file_id")
    ids = ids[keep]
    if np.any(np.diff(ids) < 0):  # not written in path order: put the rows in file order
        order = np.argsort(ids, kind="stable")
        table, ids = table[order], ids[order]
    cuts = np.flatnonzero(np.diff(ids) > 1) + 1
    # Every reused file carries the previous table's types, even one without rows: an empty
    # part at the first reused file stands for them all in the type check.
    parts = [_Part(reuse[0][1], np.zeros(0, dtype=np.int64), table.clear())]
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(ids)], strict=True):
        if a == b:
            continue
        first = int(ids[a])
        rows = np.bincount(ids[a:b] - first).astype(np.int64)
        parts.append(_Part(first, rows, table.slice(int(a), int(b - a))))
    return parts


def build_index(
    config: IndexConfig,
    output: Path | None = None,
    *,
    workers: int | None = None,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.perf_counter,
    engine: EngineSpec | None = None,
) -> IndexSummary:
    """Index every source of `config` into `output` (see the module docstring). `engine`:
    where the scans run (default: the config's [index] engine, else the local pool)."""
    output = output or config.output
    if output is not None and storage.is_url(output):
        with output_lock(str(output)) as held:
            return _build_to_objects(config, str(output), workers, progress, clock, engine, held)
    return _build_dir(config, output, workers, progress, clock, engine, None)


def _build_dir(config, output, workers, progress, clock, engine, place) -> IndexSummary:
    """build_index into a local directory; `place`: the prefix the index will be uploaded
    to, if any (never a source, as the directory is not)."""
    started = clock()
    remote = storage.is_url(config.root)  # objects: listed once, read with range requests
    if remote and output is None and config.output is None:
        raise ConfigError(
            f"the data root {config.root} is in object storage: give the index a local "
            "directory with -o/--output or [index] `output`"
        )
    output = (output or (config.root / "index")).resolve()
    engine = engine or EngineSpec(config.engine, config.address)
    workers = workers or config.workers
    if engine.kind == "local":  # on Ray, None: as many tasks in flight as the cluster has CPUs
        workers = workers or max(1, min(8, os.cpu_count() or 1))
    progress = progress or Progress()

    check_output(
        "-o",
        output,
        [("config file", config.path), ("data root", None if remote else config.root)],
        directory=True,
    )
    # Discover everything first: a bad glob fails before any work is done.
    keys = listing(str(config.root), exclude=[place] if place else []) if remote else ()
    discovered = []
    for spec in config.sources:
        if remote:
            files = discover_objects(spec, str(config.root), keys)
        else:
            files = discover(spec, config.root, exclude=(output,))
        discovered.append((resolve_format(spec, files[0].format), files))
    tokenizers = {spec.name: _resolve_tokenizer(spec, config.root) for spec, _ in discovered}
    check_output(
        "-o",
        output,
        [
            *(("tokenizer", t) for t in tokenizers.values()),
            *(("source file", None if remote else f.path) for _, fs in discovered for f in fs),
        ],
        directory=True,
    )
    with output_lock(output):
        return _build_locked(
            config, output, discovered, tokenizers, workers, progress, clock, started, engine
        )


def _build_to_objects(config, url, workers, progress, clock, engine, held) -> IndexSummary:
    """Index into a local temporary directory, then upload it under the prefix `url`: the
    tables first (named by their content, so a table of the index in place is never
    changed), the manifest last, each one object (upload.put_file: never a partial one).
    Readers see the old manifest or the new one, and a failed or interrupted run leaves
    the old index valid; an interrupt says what it left (Interrupted). Then the tables the
    old manifest named and the new one does not are removed: nothing else under the prefix,
    which mds did not write. The index in place is not reused: every file is scanned.
    `held`: the prefix's lock object, checked before the manifest is written and before
    tables are removed."""
    import tempfile

    url = url.rstrip("/")
    started = clock()
    _check_object_output(config, url)
    previous = _previous_objects(url)
    with tempfile.TemporaryDirectory(prefix="mds-index-") as tmp:
        local = Path(tmp) / "index"
        summary = _build_dir(config, local, workers, progress, clock, engine, url)
        manifest = read_manifest(local)
        live = {str(e["table"]) for e in manifest.sources}
        mark = len(commit.written())  # what this build puts in place is noted after it
        stale = sorted(previous.named - live)
        try:
            for rel in sorted(live):
                upload.put_file(local / rel, f"{url}/{rel}")
            held.check()
            upload.put_file(local / MANIFEST, f"{url}/{MANIFEST}")
            held.check()
            while stale:
                storage.delete(f"{url}/{stale[0]}")
                stale.pop(0)
        except KeyboardInterrupt:
            done = set(commit.written()[mark:])
            if f"{url}/{MANIFEST}" in done:
                raise Interrupted(_index_left(url, len(stale))) from None
            new = {rel for rel in live if f"{url}/{rel}" in done} - previous.present
            raise Interrupted(_tables_left(url, previous.had_index, new)) from None
    summary.path = url
    summary.seconds = clock() - started
    return summary


def _tables_left(url: str, had_index: bool, new: set[str]) -> str:
    """What an interrupt before the new manifest's commit left at `url`."""
    state = (
        f"the previous index at {url} is intact"
        if had_index
        else f"no index was written at {url} (no {MANIFEST})"
    )
    if not new:
        return state
    named = " it does not name" if had_index else ""
    return f"{state}; {_were_left(len(new), 'new table object', named)} under {url}/{TABLES}/"


def _index_left(url: str, stale: int) -> str:
    """What an interrupt after the new manifest's commit left at `url`."""
    state = f"the new index was written whole at {url}"
    if not stale:
        return state
    left = _were_left(stale, "table object", " it no longer names")
    return f"{state}; {left} under {url}/{TABLES}/"


def _were_left(n: int, what: str, which: str = "") -> str:
    return f"{n} {what}{'s' * (n != 1)}{which} {'was' if n == 1 else 'were'} left"


def _build_locked(
    config, output, discovered, tokenizers, workers, progress, clock, started, engine
):
    """The part of build_index that writes, under the output's lock."""
    previous = _previous(output)
    created_dir = not output.exists()
    old_by_name = {s["name"]: s for s in previous.sources} if previous else {}

    writer = _Writer(output, {s["table"] for s in old_by_name.values()})
    entries: list[dict[str, Any]] = []  # sources, without their "files" lists ...
    counts: list[tuple] = []  # ... which are written from these, one entry at a time
    summary = IndexSummary(path=str(output), fingerprint="")
    mark = len(commit.written())
    try:
        output.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(output, every=True)
        clean_stale_temps(output / TABLES, every=True)
        with open_engine(engine, workers) as pool:
            all_files = [f for _, files in discovered for f in files]
            # Few files are still shared among the workers: each hashes a few MiB.
            per = max(1, min(FINGERPRINT_BATCH, -(-len(all_files) // max(pool.workers, 1))))
            batches = [
                (all_files[i : i + per], config.fingerprint, socket.gethostname())
                for i in range(0, len(all_files), per)
            ]
            fps = [fp for chunk in pool.map(_fingerprint_batch, batches) for fp in chunk]
            plans: list[tuple[SourceSpec, str, list[_File]]] = []
            pos = 0
            for spec, files in discovered:
                fmt = files[0].format
                key = _spec_key(spec, fmt, tokenizers[spec.name])
                chunk = fps[pos : pos + len(files)]
                pos += len(files)
                plans.append(
                    (spec, key, _plan_files(spec, files, chunk, key, old_by_name.get(spec.name)))
                )
            tasks = [t for si, plan in enumerate(plans) for t in _tasks(si, plan[2])]
            progress.start(
                sum(f.nbytes for _, _, fs in tasks for f in fs),
                sum(len(fs) for _, _, fs in tasks),
            )
            new_parts: dict[int, list[_Part]] = {si: [] for si in range(len(plans))}
            stop = threading.Event()
            meters: list[_Meter | None] = []

            def units() -> Iterator[tuple[int, list[_File], ScanContext]]:
                for si, first, fs in tasks:
                    spec = plans[si][0]
                    # A scan in this process reports chunk by chunk and stops on `stop`; a
                    # remote one reports when done and is stopped with the engine.
                    meter = _Meter(progress) if pool.in_process else None
                    hooks = {"stop": stop, "progress": meter} if pool.in_process else {}
                    meters.append(meter)
                    yield first, fs, ScanContext(spec, tokenizers[spec.name], **hooks)

            try:
                # As they complete: parts are put in file order when a table is assembled.
                for i, parts in pool.map_unordered(_scan_task, units()):
                    si, _, fs = tasks[i]
                    new_parts[si].extend(parts)
                    # what the scanner did not report chunk by chunk
                    meter = meters[i]
                    rest = sum(f.nbytes for f in fs) - (meter.reported if meter else 0)
                    progress.advance(max(rest, 0))
            except BaseException:
                # Ctrl-C, SIGTERM or a failed file: queued scans never start and running
                # ones stop at their next chunk (on Ray, when the engine closes).
                stop.set()
                raise

        for si, (spec, key, files) in enumerate(plans):
            old = old_by_name.get(spec.name)
            parts = new_parts.pop(si) + _old_rows(previous, old, files)
            fmt = files[0].data.format
            table = _assemble(spec, fmt, files, parts)
            del parts
            if table.height == 0:
                more = ", ..." if len(files) > 3 else ""
                shown = ", ".join(f.data.rel for f in files[:3]) + more
                raise SourceDataError(
                    f"source '{spec.name}': no samples in its {len(files)} file(s): {shown}"
                )
            rel, checksum = writer.write_table(spec.name, table)
            n = table["n_tokens"]
            rows, tokens = _per_file_counts(table, len(files))
            first_rows = np.zeros(len(files), dtype=np.int64)
            np.cumsum(rows[:-1], out=first_rows[1:])
            counts.append((files, first_rows, rows, tokens))
            entries.append(
                {
                    "name": spec.name,
                    "format": fmt,
                    "table": rel,
                    "table_checksum": checksum,
                    "spec_key": key,
                    "length": spec.length.describe(),
                    "payload": _payload(spec, fmt),
                    "keep": {c: str(table.schema[c]) for c in spec.keep},
                    "rows": table.height,
                    "tokens": int(n.sum()),
                    "length_stats": _length_stats(n),
                }
            )
            del table, n
            scanned = [f for f in files if f.reuse is None]
            summary.sources.append(
                SourceSummary(
                    name=spec.name,
                    format=fmt,
                    files=len(files),
                    files_scanned=len(scanned),
                    rows=entries[-1]["rows"],
                    tokens=entries[-1]["tokens"],
                    exact=spec.length.exact,
                    bytes_scanned=sum(f.nbytes for f in scanned),
                )
            )
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "created_by": "mds",
            "root": str(config.root),
            "fingerprint_mode": config.fingerprint,
            "fingerprint": index_fingerprint(
                [
                    {
                        **e,
                        "files": ({"path": f.data.rel, "fingerprint": f.fingerprint} for f in c[0]),
                    }
                    for e, c in zip(entries, counts, strict=True)
                ]
            ),
            "sources": entries,
        }
        try:
            write_manifest(
                output / MANIFEST,
                manifest,
                [_file_entries(*c, config.root) for c in counts],
            )
        except OSError as exc:
            raise _cannot_write(output, MANIFEST, exc) from exc
    except BaseException:
        # an interrupt just after the manifest's rename: the new index is in place, whole
        if os.fspath(output / MANIFEST) not in commit.written()[mark:]:
            writer.rollback()
            if created_dir:
                shutil.rmtree(output, ignore_errors=True)
        raise
    owned = {str(e["table"]) for e in previous.sources} if previous else set()
    _collect_garbage(output, {e["table"] for e in entries}, owned)
    summary.fingerprint = manifest["fingerprint"]
    summary.seconds = clock() - started
    return summary


def _tasks(si: int, files: list[_File]) -> list[tuple[int, int, list[_File]]]:
    """(source, first file index, files) per pool task: runs of consecutive small files of a
    format with a batch scanner go together, every other file alone."""
    tasks: list[tuple[int, int, list[_File]]] = []
    run: list[_File] = []
    first = size = 0
    for fi, f in enumerate(files):
        if f.reuse is not None:
            continue
        batchable = f.data.format in BATCH_SCANNERS and f.nbytes <= SMALL_FILE
        if run and (
            not batchable
            or fi != first + len(run)
            or size >= BATCH_BYTES
            or len(run) >= BATCH_FILES
        ):
            tasks.append((si, first, run))
            run = []
        if not batchable:
            tasks.append((si, fi, [f]))
            continue
        if not run:
            first, size = fi, 0
        run.append(f)
        size += f.nbytes
    if run:
        tasks.append((si, first, run))
    return tasks


def _scan_task(first: int, files: list[_File], ctx: ScanContext) -> list[_Part]:
    """Scan files first, first+1, ...: together when there are several and the batch scanner
    takes them, else each alone."""
    fmt = files[0].data.format
    if len(files) > 1:
        got = BATCH_SCANNERS[fmt]([f.data for f in files], ctx)
        if got is not None and not any(
            nesting(got[0].schema[c]) > MAX_NESTING for c in ctx.spec.keep
        ):
            frame, rows = got
            return [_Part(first, rows, frame, alone=False)]
    parts = []
    for i, f in enumerate(files):
        frame = SCANNERS[fmt](f.data, ctx)
        check_nesting(frame, ctx.spec.keep, f.data)
        parts.append(_Part(first + i, np.array([frame.height], dtype=np.int64), frame))
    return parts


def _per_file_counts(table: pl.DataFrame, files: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows and tokens of each file, from a table ordered by file_id."""
    ids = table["file_id"].to_numpy()
    rows = np.bincount(ids, minlength=files).astype(np.int64)
    tokens = np.zeros(files, dtype=np.int64)
    has = rows > 0
    if has.any():
        starts = np.zeros(files, dtype=np.int64)
        np.cumsum(rows[:-1], out=starts[1:])
        n = table["n_tokens"].to_numpy().astype(np.int64)
        tokens[has] = np.add.reduceat(n, starts[has])
    return rows, tokens


def _file_entries(
    files: list[_File], first_rows: np.ndarray, rows: np.ndarray, tokens: np.ndarray, root: Path
) -> Iterator[dict[str, Any]]:
    """The manifest's entry of each file, made as it is written."""
    for fi, (f, first_row, n_rows, n_tok) in enumerate(
        zip(files, first_rows.tolist(), rows.tolist(), tokens.tolist(), strict=True)
    ):
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
        }


def _companion(f: DataFile, root: Path) -> dict[str, str]:
    if f.companion is None:
        return {}
    if storage.is_url(f.companion):  # beside the .bin, as discovery paired them
        return {
            "index_path": str(PurePosixPath(f.rel).with_name(PurePosixPath(str(f.companion)).name))
        }
    return {"index_path": f.companion.relative_to(root.resolve()).as_posix()}


def _collect_garbage(output: Path, live: set[str], owned: set[str]) -> None:
    """Remove the tables the previous manifest named (`owned`) and the new one does not, and
    temp files of dead writers: nothing else in `sources/`, which mds cannot prove it wrote."""
    tables = output / TABLES
    if not tables.is_dir():
        return
    for path in tables.iterdir():
        rel = f"{TABLES}/{path.name}"
        if rel not in live and (rel in owned or is_temp(path)):
            path.unlink(missing_ok=True)
