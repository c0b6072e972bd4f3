"""Build or refresh an index directory from an IndexConfig.

Steps: discover every source's files; fingerprint them; reuse the rows of files whose
fingerprint and source settings are unchanged (index/reuse.py); scan the rest in parallel
and assemble each source's table (index/source_table.py); write each table under a
temporary name, rename it to a content-addressed name (index/publish.py); finally replace
manifest.json, the commit point. On any failure the previous index is untouched. An index
under an object-store prefix is built in a local directory, then uploaded
(index/object_output.py).
"""

from __future__ import annotations

import gc
import os
import shutil
import socket
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from mds.core import commit, storage
from mds.core.index_manifest import identity_fingerprint
from mds.errors import ConfigError, SourceDataError
from mds.planner.index.config import IndexConfig, SourceSpec, resolve_format
from mds.planner.index.discover import discover
from mds.planner.index.history import HISTORY, keep_previous, prune_local
from mds.planner.index.object_output import (
    check_object_output,
    previous_objects,
    seed_previous,
    upload_index,
)
from mds.planner.index.objects import discover_objects, listing
from mds.planner.index.publish import (
    TableWriter,
    cannot_write_index,
    collect_garbage,
    file_list,
)
from mds.planner.index.reuse import (
    FINGERPRINT_BATCH,
    Hint,
    IndexedFile,
    Recorded,
    fingerprint_batch,
    known_fingerprints,
    previous_index,
    recorded_files,
    resolve_tokenizer,
    reused_files,
    source_payload,
    spec_key,
    unchanged_source,
)
from mds.planner.index.scan import ScanContext
from mds.planner.index.source_table import (
    Part,
    assemble,
    length_stats,
    merge_parts,
    per_file_counts,
    reused_rows,
    scan_task,
    scan_tasks,
)
from mds.planner.index.tables import (
    FORMAT,
    MANIFEST,
    TABLES,
    VERSION,
    index_tables,
    write_manifest,
)
from mds.planner.runtime.atomic import clean_stale_temps
from mds.planner.runtime.engine import EngineSpec, open_engine
from mds.planner.runtime.lock import output_lock
from mds.planner.runtime.outputs import check_output

__all__ = ["IndexSummary", "Progress", "SourceSummary", "build_index"]


class Progress:
    """Callbacks for long work; the CLI draws a bar, the library default does nothing.
    `advance` is called from the scanning threads too (per chunk of a large file)."""

    def start(self, total_bytes: int, total_files: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...


class Meter:
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
    # A build makes a few objects per file and keeps most of them to its end: the cyclic
    # collector's passes over them find nothing (they are freed by reference counts); they
    # cost about a tenth of the CPU of a 1% re-index of 20k tiny files (0.50 s against
    # 0.45 s in one pair of runs). Paused for the build, restored after, even on error.
    collecting = gc.isenabled()
    gc.disable()
    try:
        if output is not None and storage.is_url(output):
            with output_lock(str(output)) as held:
                return _build_to_objects(
                    config, str(output), workers, progress, clock, engine, held
                )
        return _build_dir(config, output, workers, progress, clock, engine, None)
    finally:
        if collecting:
            gc.enable()


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
    # Discover everything first: a bad glob fails before any work is done. An object
    # store is listed once; the listing's sizes and mtimes stand in for a stat per object.
    infos = storage.list_object_infos(str(config.root)) if remote else []
    listed = {key: (size, mtime) for key, size, mtime in infos}
    objects = [(key, size) for key, size, _ in infos]
    keys = listing(str(config.root), [place] if place else [], objects) if remote else ()
    discovered = []
    for spec in config.sources:
        if remote:
            files = discover_objects(spec, str(config.root), keys)
        else:
            files = discover(spec, config.root, exclude=(output,))
        discovered.append((resolve_format(spec, files[0].format), files))
    tokenizers = {spec.name: resolve_tokenizer(spec, config.root) for spec, _ in discovered}
    check_output("-o", output, [("tokenizer", t) for t in tokenizers.values()], directory=True)
    if not remote:
        _check_sources_outside(output, config.root, discovered)
    with output_lock(output):
        return _build_locked(
            config, output, discovered, tokenizers, workers, progress, clock, started, engine,
            listed,
        )


def _check_sources_outside(output: Path, root: Path, discovered) -> None:
    """Refuse an output directory that holds a source file. Discovery gives each file's
    resolved path (symlinks followed) under the resolved root, as the root and `rel`, sorted
    by `rel`, and leaves out the output directory: the files inside it, if any, are one run
    of that order, found by bisection; a re-index of a million unchanged files should not
    pay a million path resolutions (check_output's), nor a comparison each."""
    if os.path.lexists(output) and not os.path.isdir(output):  # a file: which one it is
        sources = [("source file", f.path) for _, files in discovered for f in files]
        check_output("-o", output, sources, directory=True)
        return
    inside = os.path.realpath(output) + os.sep
    top = os.path.join(str(root.resolve()), "")
    for _, files in discovered:
        if top.startswith(inside):  # the root itself is in the output
            held = files[0].text
        elif inside.startswith(top):  # the files under the output's path below the root
            prefix = inside[len(top) :].replace(os.sep, "/")
            at = bisect_left(files, prefix, key=attrgetter("rel"))
            inner = at < len(files) and files[at].rel.startswith(prefix)
            held = files[at].text if inner else None
        else:
            held = None
        if held is None and files[0].companion is not None:  # a Megatron .idx: anywhere
            held = next((c for f in files if os.fspath(c := f.companion).startswith(inside)), None)
        if held is not None:
            raise ConfigError(f"-o {output} holds the source file {held}; choose another output")


def _unit_bytes(unit: tuple[int, list[IndexedFile], ScanContext]) -> int:
    """The bytes a scan unit reads, by which an engine groups small units into one task."""
    return sum(f.nbytes for f in unit[1])


def _seen_by_workers(config: IndexConfig, discovered) -> list[tuple[str, str]]:
    """(name, path) of what every worker must see of a local data root: the root and the
    first file of each source, checked on each node before any file is read."""
    if storage.is_url(config.root):
        return []
    paths = [(str(config.root), str(config.root))]
    for _, files in discovered:
        f = files[0]
        if not storage.is_url(f.path):
            paths.append((f.rel, str(f.path)))
    return paths


def _dropped(spec: SourceSpec, files, parts: list[Part], old: Recorded | None) -> np.ndarray | None:
    """An image-text source's samples left out for a bad image, per file: counted by the
    scans, or recorded in the previous file list for a reused file. None for other sources."""
    if spec.images is None:
        return None
    dropped = np.zeros(len(files), dtype=np.int64)
    for part in parts:
        if part.dropped is not None:
            dropped[part.first : part.first + len(part.dropped)] = part.dropped
    before = old.dropped() if old is not None else {}
    for fi, f in enumerate(files):
        if f.reuse is not None:
            dropped[fi] = int(before.get(f.reuse, 0))
    return dropped


def _build_to_objects(config, url, workers, progress, clock, engine, held) -> IndexSummary:
    """Index into a local temporary directory, then upload it under the prefix `url`
    (object_output.upload_index: new tables first, the manifest last, never a partial
    object; an interrupt says what it left). The index in place is copied into that
    directory first (object_output.seed_previous), so its unchanged files' rows are reused
    and its unchanged tables are not uploaded again. `held`: the prefix's lock object."""
    import tempfile

    url = url.rstrip("/")
    started = clock()
    check_object_output(config, url)
    previous = previous_objects(url)
    with tempfile.TemporaryDirectory(prefix="mds-index-") as tmp:
        local = Path(tmp) / "index"
        kept = seed_previous(local, url, previous)
        summary = _build_dir(config, local, workers, progress, clock, engine, url)
        upload_index(local, url, previous, held, kept)
    summary.path = url
    summary.seconds = clock() - started
    return summary


def _known(
    discovered, recorded: dict[str, Recorded], mode: str, listed: dict
) -> tuple[list, list[Hint]]:
    """Per discovered file, in order: its fingerprint answer (reuse.fingerprint_file's)
    when the previous index recorded it with the size and mtime it has now (a local file's
    from discovery's stat, an object's from the listing), else None; and for each of the
    None ones, its Hint (listed (size, mtime_ns), what the previous index recorded)."""
    fps: list = []
    hints: list[Hint] = []
    for spec, files in discovered:
        known, unknown = known_fingerprints(files, recorded.get(spec.name), mode, listed)
        fps.extend(known)
        hints.extend(unknown)
    return fps, hints


def _build_locked(
    config, output, discovered, tokenizers, workers, progress, clock, started, engine, listed
):
    """The part of build_index that writes, under the output's lock."""
    previous = previous_index(output)
    created_dir = not output.exists()
    old_by_name = {s["name"]: s for s in previous.sources} if previous else {}
    recorded = recorded_files(previous)

    writer = TableWriter(output, set(index_tables(previous)) if previous else set())
    entries: list[dict[str, Any]] = []  # sources
    idents: list[tuple] = []  # (name, table checksum, [(path, fingerprint) of each file])
    summary = IndexSummary(path=str(output), fingerprint="")
    mark = len(commit.written())
    saved = None  # the previous manifest's copy under history/, once made
    try:
        output.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(output, every=True)
        clean_stale_temps(output / TABLES, every=True)
        clean_stale_temps(output / HISTORY, every=True)
        with open_engine(engine, workers) as pool:
            all_files = [f for _, files in discovered for f in files]
            # An unchanged file keeps its recorded fingerprint here; the others are hashed
            # by the workers. Few files are still shared among them: each hashes a few MiB.
            fps, hints = _known(discovered, recorded, config.fingerprint, listed)
            pool.check_visible(_seen_by_workers(config, discovered))
            todo = [i for i, fp in enumerate(fps) if fp is None]
            per = max(1, min(FINGERPRINT_BATCH, -(-len(todo) // max(pool.workers, 1))))
            host = socket.gethostname()
            batches = [
                (
                    [all_files[i] for i in todo[k : k + per]],
                    config.fingerprint,
                    host,
                    hints[k : k + per],
                )
                for k in range(0, len(todo), per)
            ]
            hashed = [fp for chunk in pool.map(fingerprint_batch, batches) for fp in chunk]
            for i, fp in zip(todo, hashed, strict=True):
                fps[i] = fp
            plans: list[tuple[SourceSpec, str, list[IndexedFile]]] = []
            chunks = []  # each source's fingerprints
            kept: set[int] = set()  # sources whose table and file list stay as they are
            pos = 0
            for si, (spec, files) in enumerate(discovered):
                fmt = files[0].format
                key = spec_key(spec, fmt, tokenizers[spec.name])
                chunks.append(fps[pos : pos + len(files)])
                pos += len(files)
                old, rec = old_by_name.get(spec.name), recorded.get(spec.name)
                if unchanged_source(spec, fmt, key, files, chunks[si], old, rec):
                    kept.add(si)  # nothing to scan
                    plans.append((spec, key, []))
                else:
                    plans.append((spec, key, reused_files(spec, files, chunks[si], key, rec)))
            tasks = [
                t
                for si, plan in enumerate(plans)
                for t in scan_tasks(si, plan[2], batch=plan[0].images is None)
            ]
            progress.start(
                sum(f.nbytes for _, _, fs in tasks for f in fs),
                sum(len(fs) for _, _, fs in tasks),
            )
            new_parts: dict[int, list[Part]] = {si: [] for si in range(len(plans))}
            stop = threading.Event()
            meters: list[Meter | None] = []

            # A remote scan shares its source's context (sent once per task, not per unit).
            shared = {si: ScanContext(p[0], tokenizers[p[0].name]) for si, p in enumerate(plans)}

            def units() -> Iterator[tuple[int, list[IndexedFile], ScanContext]]:
                for si, first, fs in tasks:
                    spec = plans[si][0]
                    # A scan in this process reports chunk by chunk and stops on `stop`; a
                    # remote one reports when done and is stopped with the engine.
                    meter = Meter(progress) if pool.in_process else None
                    meters.append(meter)
                    if not pool.in_process:
                        yield first, fs, shared[si]
                        continue
                    hooks = {"stop": stop, "progress": meter}
                    yield first, fs, ScanContext(spec, tokenizers[spec.name], **hooks)

            try:
                # As they complete: parts are put in file order when a table is assembled.
                # Runs of small units share a task (engine.groups), by their bytes, which hands
                # back its files' rows as a few parts (merge_parts), not one each: fewer
                # objects sent back from Ray, and fewer parts for the driver to assemble.
                scans = pool.map_unordered(
                    scan_task, list(units()), size=_unit_bytes, merge=merge_parts
                )
                for i, parts in scans:
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
            rec = recorded.get(spec.name)
            found = discovered[si][1]
            fmt = found[0].format
            if si in kept:
                # its table and file list as they are: neither read nor written again
                assert old is not None and rec is not None
                if "files_table" in old:
                    listing = {k: old[k] for k in ("files_table", "files_checksum")}
                else:  # an index of VERSION 1: its file list gets a table
                    files = reused_files(spec, found, chunks[si], key, rec)
                    rel, checksum = writer.write_file_list(
                        spec.name, file_list(files, *rec.counts(), config.root)
                    )
                    listing = {"files_table": rel, "files_checksum": checksum}
                pairs = list(zip(rec.paths, rec.fingerprints, strict=True))
                idents.append((spec.name, old["table_checksum"], pairs))
                entries.append(
                    {
                        "name": spec.name,
                        "format": fmt,
                        **{k: old[k] for k in ("table", "table_checksum")},
                        **listing,
                        "spec_key": key,
                        "length": spec.length.describe(),
                        "payload": source_payload(spec, fmt),
                        **{k: old[k] for k in ("keep", "rows", "tokens", "length_stats")},
                    }
                )
                summary.sources.append(
                    SourceSummary(spec.name, fmt, len(found), 0, old["rows"], old["tokens"],
                                  spec.length.exact, 0)
                )  # fmt: skip
                continue
            pairs = [(f.data.rel, f.fingerprint) for f in files]
            dropped = _dropped(spec, files, new_parts[si], rec)
            parts = new_parts.pop(si) + reused_rows(previous, old, rec, files)
            table = assemble(spec, fmt, files, parts)
            del parts
            if table.height == 0:
                more = ", ..." if len(files) > 3 else ""
                shown = ", ".join(f.data.rel for f in files[:3]) + more
                raise SourceDataError(
                    f"source '{spec.name}': no samples in its {len(files)} file(s): {shown}"
                )
            rel, checksum = writer.write_table(spec.name, table)
            n = table["n_tokens"]
            rows, tokens = per_file_counts(table, len(files))
            first_rows = np.zeros(len(files), dtype=np.int64)
            np.cumsum(rows[:-1], out=first_rows[1:])
            listed_rel, listed_checksum = writer.write_file_list(
                spec.name, file_list(files, first_rows, rows, tokens, config.root, dropped)
            )
            idents.append((spec.name, checksum, pairs))
            entries.append(
                {
                    "name": spec.name,
                    "format": fmt,
                    "table": rel,
                    "table_checksum": checksum,
                    "files_table": listed_rel,
                    "files_checksum": listed_checksum,
                    "spec_key": key,
                    "length": spec.length.describe(),
                    "payload": source_payload(spec, fmt),
                    "keep": {c: str(table.schema[c]) for c in spec.keep},
                    "rows": table.height,
                    "tokens": int(n.sum()),
                    "length_stats": length_stats(n),
                    **({"dropped_bad_images": int(dropped.sum())} if dropped is not None else {}),
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
            "fingerprint": identity_fingerprint(idents),  # index_fingerprint's, from the files
            "sources": entries,
        }
        try:
            # plans made from the index being replaced keep verifying against it
            saved = keep_previous(output, previous, manifest["fingerprint"])
            write_manifest(output / MANIFEST, manifest)
        except OSError as exc:
            raise cannot_write_index(output, MANIFEST, exc) from exc
    except BaseException:
        # an interrupt just after the manifest's rename: the new index is in place, whole
        if os.fspath(output / MANIFEST) not in commit.written()[mark:]:
            writer.rollback()
            if saved is not None:
                saved.unlink(missing_ok=True)
            if created_dir:
                shutil.rmtree(output, ignore_errors=True)
        raise
    live = {e[k] for e in entries for k in ("table", "files_table")}
    # the previous manifest's tables stay while history/ keeps it (it always does now);
    # tables go once no kept manifest names them
    gone, named = prune_local(output, live)
    collect_garbage(output, live | named, gone)
    summary.fingerprint = manifest["fingerprint"]
    summary.seconds = clock() - started
    return summary
