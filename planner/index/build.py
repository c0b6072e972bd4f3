"""Build or refresh an index directory from an IndexConfig.

Steps: discover every source's files; fingerprint them; reuse the rows of files whose
fingerprint and source settings are unchanged; scan the rest in parallel; write each
source's table under a temporary name, rename it to a content-addressed name; finally
replace manifest.json, the commit point. On any failure the previous index is untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from mds.executor.errors import ConfigError, IndexFormatError, MdsError, SourceDataError
from mds.executor.fingerprint import fingerprint, stat_signature
from mds.planner.atomic import (
    atomic_write_bytes,
    cannot_write,
    clean_stale_temps,
    fsync_file,
    is_temp,
    temp_sibling,
)
from mds.planner.config import IndexConfig, SourceSpec, resolve_format
from mds.planner.index.arrow import scan_arrow
from mds.planner.index.discover import DataFile, discover
from mds.planner.index.jsonl import scan_jsonl
from mds.planner.index.manifest import (
    FORMAT,
    MANIFEST,
    VERSION,
    IndexManifest,
    index_fingerprint,
    read_manifest,
    read_table,
    table_checksum,
)
from mds.planner.index.megatron import scan_megatron
from mds.planner.index.parquet import scan_parquet
from mds.planner.index.scan import ScanContext
from mds.planner.lock import output_lock
from mds.planner.outputs import check_output

__all__ = ["IndexSummary", "Progress", "SourceSummary", "build_index"]

SCANNERS = {
    "parquet": scan_parquet,
    "jsonl": scan_jsonl,
    "jsonl.zst": scan_jsonl,
    "arrow": scan_arrow,
    "megatron": scan_megatron,
}
TABLES = "sources"
PERCENTILES = (50, 90, 99)


class Progress:
    """Callbacks for long work; the CLI draws a bar, the library default does nothing."""

    def start(self, total_bytes: int, total_files: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...


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


@dataclass
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


def _spec_key(spec: SourceSpec, fmt: str, tokenizer: Path | None) -> str:
    """Everything about a source that changes its table besides the files themselves."""
    key: dict[str, Any] = {
        "format": fmt,
        "length": spec.length.describe(),
        "text": spec.text,
        "keep": list(spec.keep),
    }
    if tokenizer is not None:
        key["tokenizer_fingerprint"] = fingerprint(tokenizer, "full")
    return json.dumps(key, sort_keys=True)


def _previous(output: Path) -> IndexManifest | None:
    if not output.exists():
        return None
    if not output.is_dir():
        raise ConfigError(f"{output}: output exists and is not a directory")
    if (output / MANIFEST).exists():
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
        raise ConfigError(
            f"{output}: exists, is not empty and is not an mds index; pick another --output"
        )
    return None


def _resolve_tokenizer(spec: SourceSpec, root: Path) -> Path | None:
    if spec.length.tokenizer is None:
        return None
    path = Path(spec.length.tokenizer)
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
    reusable: dict[tuple[str, int, int, str], int] = {}
    if old is not None and old.get("spec_key") == spec_key:
        for entry in old["files"]:
            reusable[(entry["path"], entry["size"], entry["mtime_ns"], entry["fingerprint"])] = (
                entry["id"]
            )
    return [
        _File(f, size, mtime, fp, nbytes, reusable.get((f.rel, size, mtime, fp)))
        for f, (size, mtime, fp, nbytes) in zip(files, fps, strict=True)
    ]


def _check_schema(
    frames: list[tuple[_File, pl.DataFrame]], spec: SourceSpec
) -> dict[str, pl.DataType]:
    """Kept columns must have one type across a source's files (all-null files adapt)."""
    types: dict[str, tuple[pl.DataType, str]] = {}
    for f, frame in frames:
        for col in spec.keep:
            dtype = frame.schema[col]
            if dtype == pl.Null:
                continue
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
    for p in PERCENTILES:
        stats[f"p{p}"] = int(n.quantile(p / 100, interpolation="nearest"))
    return stats


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


def _assemble(
    spec: SourceSpec, fmt: str, files: list[_File], frames: dict[int, pl.DataFrame]
) -> pl.DataFrame:
    ordered = [(f, frames[i]) for i, f in enumerate(files)]
    types = _check_schema(ordered, spec)
    parts = []
    for file_id, (_, frame) in enumerate(ordered):
        frame = frame.with_columns(
            pl.lit(file_id, dtype=pl.UInt32).alias("file_id"),
            *[pl.col(c).cast(types[c]) for c in spec.keep],
        )
        parts.append(frame)
    cols = ["file_id", "file_row"] + (["offset", "length"] if fmt.startswith("jsonl") else [])
    cols += ["n_tokens", *spec.keep]
    return pl.concat([p.select(cols) for p in parts], how="vertical")


def _intact(table: Path, checksum: str) -> bool:
    """Whether a previous index table still has the bytes its manifest records."""
    try:
        return table_checksum(table) == checksum
    except OSError:
        return False


def _old_rows(
    previous: IndexManifest | None, old: dict | None, files: list[_File]
) -> dict[int, pl.DataFrame]:
    ids = {f.reuse for f in files if f.reuse is not None}
    if not ids or previous is None or old is None:
        return {}
    table = read_table(previous.path / old["table"], old["table_checksum"])
    table = table.filter(pl.col("file_id").is_in(list(ids)))
    parts = table.partition_by("file_id", as_dict=True, include_key=False)
    return {int(key[0]): frame for key, frame in parts.items()}


def build_index(
    config: IndexConfig,
    output: Path | None = None,
    *,
    workers: int | None = None,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> IndexSummary:
    """Index every source of `config` into `output` (see the module docstring)."""
    started = clock()
    output = (output or config.output or (config.root / "index")).resolve()
    workers = workers or config.workers or max(1, min(8, os.cpu_count() or 1))
    progress = progress or Progress()

    check_output(
        "-o", output, [("config file", config.path), ("data root", config.root)], directory=True
    )
    # Discover everything first: a bad glob fails before any work is done.
    discovered = []
    for spec in config.sources:
        files = discover(spec, config.root, exclude=(output,))
        discovered.append((resolve_format(spec, files[0].format), files))
    tokenizers = {spec.name: _resolve_tokenizer(spec, config.root) for spec, _ in discovered}
    check_output(
        "-o",
        output,
        [
            *(("tokenizer", t) for t in tokenizers.values()),
            *(("source file", f.path) for _, files in discovered for f in files),
        ],
        directory=True,
    )
    with output_lock(output):
        return _build_locked(
            config, output, discovered, tokenizers, workers, progress, clock, started
        )


def _build_locked(config, output, discovered, tokenizers, workers, progress, clock, started):
    """The part of build_index that writes, under the output's lock."""
    previous = _previous(output)
    created_dir = not output.exists()
    old_by_name = {s["name"]: s for s in previous.sources} if previous else {}

    writer = _Writer(output, {s["table"] for s in old_by_name.values()})
    entries: list[dict[str, Any]] = []
    summary = IndexSummary(path=str(output), fingerprint="")
    try:
        output.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(output, every=True)
        clean_stale_temps(output / TABLES, every=True)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            all_files = [f for _, files in discovered for f in files]
            fps = list(pool.map(lambda f: _fingerprint(f, config.fingerprint), all_files))
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
            todo = [
                (si, fi, f)
                for si, (_, _, fs) in enumerate(plans)
                for fi, f in enumerate(fs)
                if f.reuse is None
            ]
            progress.start(sum(f.nbytes for _, _, f in todo), len(todo))
            frames: dict[tuple[int, int], pl.DataFrame] = {}
            futures: dict[Future, tuple[int, int, _File]] = {}
            stop = threading.Event()
            try:
                for si, fi, f in todo:
                    ctx = ScanContext(plans[si][0], tokenizers[plans[si][0].name], stop=stop)
                    futures[pool.submit(SCANNERS[f.data.format], f.data, ctx)] = (si, fi, f)
                pending = set(futures)
                while pending:
                    done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                    for fut in done:
                        if fut.exception() is not None:
                            raise fut.exception()  # type: ignore[misc]
                        si, fi, f = futures[fut]
                        frames[(si, fi)] = fut.result()
                        progress.advance(f.nbytes)
            except BaseException:
                # Ctrl-C, SIGTERM or a failed file: queued scans never start and running
                # ones stop at their next chunk, so the pool's exit does not wait for them.
                stop.set()
                pool.shutdown(wait=False, cancel_futures=True)
                raise

        for si, (spec, key, files) in enumerate(plans):
            old = old_by_name.get(spec.name)
            reused = _old_rows(previous, old, files)
            per_file = {
                fi: (reused[f.reuse] if f.reuse is not None else frames[(si, fi)])
                for fi, f in enumerate(files)
            }
            fmt = files[0].data.format
            table = _assemble(spec, fmt, files, per_file)
            if table.height == 0:
                more = ", ..." if len(files) > 3 else ""
                shown = ", ".join(f.data.rel for f in files[:3]) + more
                raise SourceDataError(
                    f"source '{spec.name}': no samples in its {len(files)} file(s): {shown}"
                )
            rel, checksum = writer.write_table(spec.name, table)
            n = table["n_tokens"]
            file_entries = []
            first_row = 0
            for fi, f in enumerate(files):
                frame = per_file[fi]
                file_entries.append(
                    {
                        "id": fi,
                        "path": f.data.rel,
                        **_companion(f.data, config.root),
                        "size": f.size,
                        "mtime_ns": f.mtime_ns,
                        "fingerprint": f.fingerprint,
                        "first_row": first_row,
                        "rows": frame.height,
                        "tokens": int(frame["n_tokens"].sum()),
                    }
                )
                first_row += frame.height
            entries.append(
                {
                    "name": spec.name,
                    "format": fmt,
                    "table": rel,
                    "table_checksum": checksum,
                    "spec_key": key,
                    "length": spec.length.describe(),
                    "payload": spec.payload,
                    "keep": {c: str(table.schema[c]) for c in spec.keep},
                    "rows": table.height,
                    "tokens": int(n.sum()),
                    "length_stats": _length_stats(n),
                    "files": file_entries,
                }
            )
            scanned = [f for f in files if f.reuse is None]
            summary.sources.append(
                SourceSummary(
                    name=spec.name,
                    format=fmt,
                    files=len(files),
                    files_scanned=len(scanned),
                    rows=table.height,
                    tokens=int(n.sum()),
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
            "fingerprint": index_fingerprint(entries),
            "sources": entries,
        }
        try:
            atomic_write_bytes(
                output / MANIFEST, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
            )
        except OSError as exc:
            raise _cannot_write(output, MANIFEST, exc) from exc
    except BaseException:
        writer.rollback()
        if created_dir:
            shutil.rmtree(output, ignore_errors=True)
        raise
    _collect_garbage(output, {e["table"] for e in entries})
    summary.fingerprint = manifest["fingerprint"]
    summary.seconds = clock() - started
    return summary


def _companion(f: DataFile, root: Path) -> dict[str, str]:
    if f.companion is None:
        return {}
    return {"index_path": f.companion.relative_to(root.resolve()).as_posix()}


def _collect_garbage(output: Path, live: set[str]) -> None:
    """Remove tables no longer named by the manifest (and temp files of dead writers)."""
    tables = output / TABLES
    if not tables.is_dir():
        return
    for path in tables.iterdir():
        rel = f"{TABLES}/{path.name}"
        if rel not in live and (path.suffix == ".parquet" or is_temp(path)):
            path.unlink(missing_ok=True)
