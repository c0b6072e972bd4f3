"""The sources a plan draws from, as the executor sees them: how to read each sample the plan
names, how to turn its payload into token ids, and the checks that the data is still what
was planned.

Everything comes from the plan: the footer says how each planned source is read and
tokenized (`fetch`), and each rank's block names, per sample, its file (a record copied from
the index), the row or byte range in it and the planned token count. No index table or
manifest is read, so a rank's memory and start-up follow its slice, not the corpus.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from mds.core import storage
from mds.core.datacheck import (
    content_decides,
    content_problem,
    entry_paths,
    file_identity,
    file_problem,
    holds_none,
    identity_change,
    stat_identity,
)
from mds.core.index_manifest import facts_problem, payload_problem
from mds.core.lru import LRU, LockedLRU
from mds.core.object_ranges import RangeFile, parallel, prefetch
from mds.core.planfile import RankChunk
from mds.core.storage import MOVED_HINT, given_root
from mds.core.tokenizer import index_tokenizer_path, load_tokenizer
from mds.errors import (
    ConfigError,
    DataChangedError,
    MdsError,
    PlanError,
    SourceDataError,
)
from mds.executor.catalog.early_rows import Lookahead
from mds.executor.readers import FileReader, open_reader

__all__ = ["ESTIMATED", "SourceCatalog", "Tokenize"]

Tokenize = Callable[[str], Sequence[int]]
ESTIMATED = ("error", "fit")
_JSONL = ("jsonl", "jsonl.zst")
# Formats read a block at a time (a row group, a zstd frame): worth reading rows ahead.
_BLOCK_CODED = ("parquet", "jsonl.zst")
# "0" turns off the re-checks of files already checked (for the benchmark's comparison).
RECHECK_ENV = "MDS_RECHECK"


@dataclass
class _Source:
    """One index source: its place in global ids and, if planned, how to read it."""

    sid: int
    name: str
    base: int
    rows: int
    facts: dict[str, Any]
    tokenize: Tokenize | None = None

    @property
    def fmt(self) -> str:
        return str(self.facts.get("format"))

    @property
    def payload(self) -> dict[str, Any]:
        return self.facts.get("payload") or {}

    @property
    def length(self) -> dict[str, Any]:
        return self.facts.get("length") or {}

    @property
    def exact(self) -> bool:
        return bool(self.length.get("exact", False))

    @property
    def located(self) -> str | None:
        """How the plan's offset and length locate a sample besides its row: "bytes" (a JSONL
        line's byte range), "values" (a Parquet token list row: where its values start in
        the row group, and the plan's token count), or None."""
        if self.fmt in _JSONL:
            return "bytes"
        if self.fmt == "parquet" and self.payload.get("offsets") == "row_group":
            return "values"
        return None


def _cache_groups(later) -> bool:
    """Whether a Parquet read's row groups are worth caching: not when no later sample of
    this process reads the file (`Later.complete`). `_pinned` and the read decide alike."""
    return later is None or not later.complete


@dataclass
class _ObjectRead:
    """The payloads read from an object, with what `_recheck_objects` needs to check that
    the object was not rewritten meanwhile."""

    payloads: list
    source: _Source
    fid: int
    entry: dict[str, Any]
    reader: FileReader


class SourceCatalog:
    """Fetches samples as token-id arrays, checked against the lengths the plan used."""

    def __init__(
        self,
        footer: dict[str, Any],
        plan_path: Path,
        *,
        data_root: str | os.PathLike | None = None,
        tokenize: Tokenize | Mapping[str, Tokenize] | None = None,
        estimated: str = "error",
        cache_bytes: int = 256 << 20,
        max_open_files: int = 64,
        read_threads: int = 2,
        next_block: Callable[[RankChunk], RankChunk | None] | None = None,
    ):
        if not isinstance(max_open_files, int) or max_open_files < 1:
            raise ConfigError(f"max_open_files={max_open_files!r} must be an integer >= 1")
        if isinstance(read_threads, bool) or not isinstance(read_threads, int) or read_threads < 1:
            raise ConfigError(f"read_threads={read_threads!r} must be an integer >= 1")
        self.read_threads = read_threads
        if not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise ConfigError(f"cache_bytes={cache_bytes!r} must be an integer >= 0")
        if estimated not in ESTIMATED:
            raise ConfigError(f"estimated={estimated!r} must be one of {', '.join(ESTIMATED)}")
        self.plan_path, self.estimated = plan_path, estimated
        self.cache_bytes, self.max_open_files = cache_bytes, max_open_files
        try:
            fetch = footer["fetch"]
            root, facts = fetch["root"], fetch["sources"]
            train = footer["config"]["train"]
            planned = {s["name"]: int(s.get("samples", 0)) for s in footer.get("sources", [])}
            self.sources = [
                _Source(i, str(s["name"]), int(s["base"]), int(s["rows"]), facts.get(s["name"], {}))
                for i, s in enumerate(footer["index"]["sources"])
            ]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PlanError(f"{plan_path}: corrupt plan footer (fetch facts: {exc})") from None
        if not isinstance(root, str) or not root:
            raise PlanError(f"{plan_path}: corrupt plan footer (data root {root!r})")
        self.root, recorded = storage.plan_data_root(plan_path, root, data_root)
        given, self._origin = given_root(data_root)
        self._recorded_root = root if given is None else None
        # a root elsewhere than the plan's: a copy there keeps names, sizes and mtimes
        # whatever its bytes are, so each file's content is checked on first use
        self.relocated = given is not None and storage.relocated(self.root, recorded)
        self.recheck = os.environ.get(RECHECK_ENV, "").strip() != "0"
        self.truncate_to = (
            int(train["max_tokens_per_micro_batch"])
            if train.get("overlong") == "truncate"
            else None
        )
        self.bases = np.array([s.base for s in self.sources], dtype=np.int64)
        self._rows = np.array([s.rows for s in self.sources], dtype=np.int64)
        self.used = [s for s in self.sources if planned.get(s.name, 0) > 0]
        self._used_ids = {s.sid for s in self.used}  # _source_of runs per file and sample
        for s in self.used:
            problem = facts_problem(s.facts)
            if problem is not None:
                raise PlanError(f"{plan_path}: corrupt plan footer (source {s.name!r}: {problem})")
        self._bind_tokenizers(tokenize)
        self.checked: set[tuple[int, int]] = set()  # (source id, file) already checked
        # (source id, file) -> the versions of the file and its companion seen at its check
        # (datacheck.stat_identity, storage.object_version), which every open and every read
        # of it is compared with (`_recheck`)
        self.pins: dict[tuple[int, int], list[tuple | None]] = {}
        self._changed: dict[tuple[int, int], str] = {}  # files found changed: their error
        self._step: int | None = None  # the step being read, for messages
        self._records: dict[tuple[int, int], Any] = {}  # (source id, file) -> its record
        self._dirs: set[str] = set()  # directories under the root found to be no symlinks
        # cache_bytes bounds both kinds of decoded data: a quarter for rows read ahead
        # (`Lookahead`), the rest for whole blocks (row groups, zstd frames).
        ahead = cache_bytes // 4
        self.ahead = Lookahead(ahead, next_block=next_block) if ahead else None
        self.reset()

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]

    def build_every(self, stride: int) -> None:
        """This process builds every `stride`-th micro-batch: rows are read ahead only for
        those (`Lookahead`)."""
        if self.ahead is not None:
            self.ahead.stride = stride

    def checks(self) -> tuple[set[tuple[int, int]], dict[tuple[int, int], list[tuple | None]]]:
        """The files this process checked and the versions pinned at their checks, for a
        process that goes on from here (a spawned DataLoader worker): `restore_checks`."""
        return self.checked, self.pins

    def restore_checks(self, checked: set, pins: dict) -> None:
        """Take over another process's `checks()`: those files are not checked again, and
        what is read of them must be the versions pinned there."""
        self.checked = set(checked)
        self.pins = {k: list(v) for k, v in pins.items()}

    def reset(self) -> None:
        """Forget open files, cached blocks and rows read ahead (a new process must not share
        descriptors)."""
        if self.ahead is not None:
            self.ahead.clear()
        ahead = self.ahead.max_bytes if self.ahead is not None else 0
        self._blocks = LockedLRU(max_bytes=self.cache_bytes - ahead)
        # Open readers, by count. Threads reading a step's files share them: a reader
        # evicted while a thread reads it is closed when that thread is done with it.
        self._files = LRU(max_items=self.max_open_files, on_evict=self._retire)
        self._files_lock = threading.Lock()
        self._busy: dict[FileReader, int] = {}  # reader -> reads in progress
        self._retired: set[FileReader] = set()  # evicted while busy: closed when idle
        self._pool: ThreadPoolExecutor | None = None  # a parent's threads are not a child's

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self.ahead is not None:
            self.ahead.clear()
        with self._files_lock:
            self._files.clear()
        self._blocks.clear()

    # --- set-up ---------------------------------------------------------------------------

    def _bind_tokenizers(self, tokenize: Tokenize | Mapping[str, Tokenize] | None) -> None:
        """Give every used text source a tokenize function, or say which one lacks it."""
        text = [s for s in self.used if s.payload.get("kind") == "text"]
        if isinstance(tokenize, Mapping):
            unknown = sorted(set(tokenize) - {s.name for s in text})
            if unknown:
                raise ConfigError(
                    f"tokenize has functions for {', '.join(unknown)}, which the plan does not "
                    f"draw text from; text sources: {', '.join(s.name for s in text) or 'none'}"
                )
        for s in self.used:
            kind = s.payload.get("kind")
            problem = payload_problem(s.name, s.facts)
            if problem is not None:
                raise ConfigError(problem)
            if not s.exact and self.estimated == "error":
                rule = s.length.get("rule", "an estimate")
                raise ConfigError(
                    f"source {s.name!r}: the plan used estimated lengths ({rule}), so its packing "
                    "cannot be replayed exactly; re-index it with a tokenizer or a count column, "
                    'or pass estimated="fit" to cut each sample to its planned length'
                )
            if kind == "text":
                recorded = s.length.get("kind") == "tokenizer"
                if isinstance(tokenize, Mapping):
                    fn = tokenize.get(s.name)
                else:  # one function: for the sources the index did not count with a tokenizer
                    fn = None if recorded else tokenize
                s.tokenize = fn or self._index_tokenizer(s)

    def _index_tokenizer(self, s: _Source) -> Tokenize:
        """The tokenizer.json the index counted with, checked to be the same file."""
        length = s.length
        if length.get("kind") != "tokenizer":
            raise ConfigError(
                f"source {s.name!r} stores text ({s.payload.get('column')!r}); pass tokenize= "
                f"(a function str -> token ids, or a dict {{{s.name!r}: fn}})"
            )
        tok = load_tokenizer(str(index_tokenizer_path(s.name, s.facts, self.root)))
        return lambda text: tok.encode(text, add_special_tokens=False).ids

    def check_files(self, block: RankChunk, full: bool, lo: int = 0, hi: int | None = None) -> None:
        """Stat (or, with `full`, fingerprint) the files samples [lo, hi) of `block` read that
        this process has not checked yet, against the records the plan copied from the index:
        start-up I/O follows what is read first, not the corpus's files or the whole chunk.
        Under a relocated root each file's content fingerprint is checked too. The version
        each file has is pinned first: what is read of it later must be that version."""
        files = block.fetch.files
        used = np.unique(block.fetch.file[lo:hi]).tolist() if hi != lo else []
        for sid, fid, entry in (files[f] for f in used):
            s = self._source_of(sid)
            self._same_record(s, fid, entry)
            if (sid, fid) in self.checked:
                continue
            where = f"{s.name} files[{fid}]"
            if self.recheck:
                self.pins[(sid, fid)] = self._versions_now(entry, where)
            problem = file_problem(self.root, entry, full, where, content=self.relocated)
            if (
                problem is not None
                and problem.endswith(": missing")
                and holds_none(self.root, (entry for _s, _f, entry in block.fetch.files))
            ):
                if self._recorded_root is not None:
                    recorded = (
                        f"recorded relative to the plan's directory as {self._recorded_root!r}"
                    )
                else:
                    recorded = f"from {self._origin}"
                raise DataChangedError(
                    f"the data root {self.root} ({recorded}) holds none of the indexed files "
                    f"(source {s.name!r}: {problem}); if the plan or the data moved, or the "
                    f"root is mistyped: {MOVED_HINT}"
                )
            if problem is not None:
                raise DataChangedError(
                    f"source {s.name!r}: {problem}; the data changed since it was indexed "
                    "(re-index and re-plan, or restore the file)"
                )
            self.checked.add((sid, fid))

    def _versions_now(self, entry: Any, where: str) -> list[tuple | None]:
        """The versions of a file and its companion now (None: cannot be had; the check
        names the problem)."""
        try:
            path, companion = entry_paths(self.root, entry, where, self._dirs)
        except ValueError:
            return [None, None]
        return [file_identity(path), file_identity(companion) if companion else None]

    def _same_record(self, s: _Source, fid: int, entry: Any) -> None:
        """Every block must give a file the same record: checks and open files are keyed by
        (source, file), so a record that differs would be read unchecked, or not at all."""
        seen = self._records.setdefault((s.sid, fid), entry)
        if seen is not entry and seen != entry:
            raise PlanError(
                f"{self.plan_path}: corrupt plan (blocks disagree on {s.name} files[{fid}])"
            )

    def _source_of(self, sid: int) -> _Source:
        if sid not in self._used_ids:
            raise PlanError(f"{self.plan_path}: corrupt plan (a block names source {sid})")
        return self.sources[sid]

    # --- fetching -------------------------------------------------------------------------

    def locate(self, gids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source id, row) of global sample ids."""
        sid = np.searchsorted(self.bases, gids, side="right") - 1
        rows = gids.astype(np.int64) - self.bases[sid]
        if len(gids) and (sid.min() < 0 or np.any(rows >= self._rows[sid])):
            raise PlanError(f"{self.plan_path}: corrupt plan (a sample beyond its index's rows)")
        return sid, rows

    def fetch(
        self, block: RankChunk, lo: int, hi: int, step: int | None = None
    ) -> list[np.ndarray]:
        """Token ids (integer arrays) of samples [lo, hi) of `block`, in order, checked and
        truncated. One reader call per file: its rows are read together, with the rows this
        rank's later samples need from a block-coded file (see `Lookahead`). `step`: the
        step they are of, named by the error if a file changed."""
        self._step = step
        rec = block.fetch
        ahead = self.ahead
        payloads: list[Any] = [None] * (hi - lo)
        if ahead is not None:
            base = ahead.bind(block)
            missing = ahead.take(base, lo, hi, payloads)
        else:
            missing = np.arange(lo, hi)
        files = rec.file[missing]
        order = np.argsort(files, kind="stable")
        cuts = np.flatnonzero(np.diff(files[order])) + 1
        reads: list[tuple[np.ndarray, Any, Callable[[], list] | Exception]] = []
        stage: list[tuple[_Source, int, Any, np.ndarray, Any]] = []  # object reads to prefetch
        for group in np.split(missing[order], cuts) if len(missing) else []:
            sid, fid, entry = rec.files[int(rec.file[group[0]])]
            try:
                s = self._source_of(sid)
                self._same_record(s, fid, entry)
            except PlanError as exc:  # raised when the files before it were read, as in order
                reads.append((group, None, exc))
                continue
            later = None
            if ahead is not None and s.fmt in _BLOCK_CODED:
                later = ahead.later((sid, fid), entry, base, lo, hi, s.located)
            reads.append((group, later, partial(self._read, block, s, fid, entry, group, later)))
            stage.append((len(reads) - 1, s, fid, entry, group, later))
        staged = self._stage(block, stage)
        try:
            # at most max_open_files files a window (or one a thread): `_pinned` opens a
            # window's page-read files before reading any, and more would be evicted, then
            # opened again
            results: list[list | Exception] = []
            window = max(self.max_open_files, self.read_threads)
            for first in range(0, len(reads), window):
                part = [r for _g, _l, r in reads[first : first + window]]
                opened = [e for e in stage if first <= e[0] < first + window]
                pinned = self._pinned(block, opened)
                for k, (s, fid, entry, where, pages) in pinned.items():
                    group, later, _r = reads[k]
                    pin = (where, pages)
                    part[k - first] = partial(self._read, block, s, fid, entry, group, later, pin)
                results += self._run(part, {k - first for k in pinned})
        finally:
            for obj in staged:
                obj.unstage()
        self._recheck_objects(results)
        for (group, later, _r), read in zip(reads, results, strict=True):
            if isinstance(read, Exception):
                raise read  # the first file's problem, in file order, whichever thread met it
            for j, payload in zip(group.tolist(), read, strict=False):
                payloads[j - lo] = payload
            if later is not None and len(read) > len(group):
                ahead.keep(later.index.tolist(), read[len(group) :])  # type: ignore[union-attr]
        return self._all_tokens(block, lo, hi, payloads)

    def _stage(self, block: RankChunk, reads: list) -> list[RangeFile]:
        """Fetch what the reads will need from objects in one go: every object's byte spans
        (row groups, blocks the caches lack) as concurrent range requests, kept until the
        fetch ends. Files need nothing: a local read costs no round trip. A file that cannot
        be opened here is left to its read, which raises its error in file order."""
        if not storage.is_url(self.root):
            return []
        wants = []
        for _k, s, fid, entry, now, later in reads:
            try:
                reader = self._reader(s, fid, entry)
            except MdsError:
                continue
            try:
                if reader.object is not None:
                    spans = reader.spans(*self._where(block, s, now, later))
                    if spans:
                        wants.append((reader.object, spans))
            except MdsError:
                pass
            finally:
                self._release(reader)
        prefetch(wants)
        return [obj for obj, _spans in wants]

    def _pinned(self, block: RankChunk, reads: list) -> dict[int, tuple]:
        """The reads that decode rows from Parquet pages: Python work that holds the GIL,
        which a second thread would only contend for, so they run on the calling thread.
        Their files (a window's, at most `max_open_files`: see `fetch`) are opened here and
        stay open for their reads: all before any is read, which is also quicker on one
        thread than opening each as it is read (1.1 against 1.4 ms/step at 1024 sources:
        the opens share warm caches, and so do the reads). A file that cannot be opened is
        left to its read, which raises its error in file order. Per read: its source,
        file, record, `_where` and the reader's `page_groups`, which the read reuses."""
        pinned: dict[int, tuple] = {}
        for k, s, fid, entry, now, later in reads:
            if s.located != "values":
                continue
            try:
                reader = self._reader(s, fid, entry)
            except MdsError:
                continue
            try:
                where = self._where(block, s, now, later)
                keep = _cache_groups(later)
                pages = reader.page_groups(*where, keep=keep)  # type: ignore[attr-defined]
                if pages:
                    pinned[k] = (s, fid, entry, where, pages)
            except MdsError:
                pass
            finally:
                self._release(reader)
        return pinned

    def _run(
        self, reads: list[Callable[[], list] | Exception], pinned: set[int] = frozenset()
    ) -> list[list | Exception]:
        """The result (or exception) of each read, in order. With `read_threads` > 1 the reads
        are shared among threads (this one included): Parquet and zstd decoding release the
        GIL, so a step that reads many files decodes them side by side. `pinned` reads run
        on this thread."""
        out: list[list | Exception] = [None] * len(reads)  # type: ignore[list-item]
        shared = [i for i in range(len(reads)) if i not in pinned]
        threads = max(1, min(self.read_threads, sum(callable(reads[i]) for i in shared)))
        mine = [i for i in range(len(reads)) if i in pinned]

        def share(k: int) -> None:
            for i in (mine if k == 0 else []) + shared[k::threads]:
                read = reads[i]
                if not callable(read):
                    out[i] = read
                    continue
                try:
                    out[i] = read()
                except Exception as exc:  # handed back in order; any other error stops all
                    out[i] = exc

        if threads == 1:
            share(0)
            return out
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.read_threads - 1, thread_name_prefix="mds-read")
        others = [self._pool.submit(share, k) for k in range(1, threads)]
        try:
            share(0)
        finally:
            for future in others:
                future.result()
        return out

    def _where(self, block: RankChunk, s: _Source, now: np.ndarray, later):
        """(rows, offsets, lengths) in the file of block samples `now`, then of `later`: for
        JSONL the lines' byte ranges, for a Parquet token list located by values where each
        row's values start in its row group and their planned count, else None."""
        rec = block.fetch
        gids = block.ids[now].astype(np.int64)
        rows = rec.row[now].astype(np.int64)
        offsets = lengths = None
        if s.located is not None:
            size = rec.length if s.located == "bytes" else rec.tokens
            offsets, lengths = rec.offset[now].astype(np.int64), size[now].astype(np.int64)
        if later is not None and len(later):
            gids, rows = np.concatenate([gids, later.gid]), np.concatenate([rows, later.row])
            if offsets is not None:
                offsets = np.concatenate([offsets, later.offset])
                lengths = np.concatenate([lengths, later.length])
        if len(gids) and (gids.min() < s.base or gids.max() >= s.base + s.rows):
            raise PlanError(
                f"{self.plan_path}: corrupt plan (a sample's file is of another source)"
            )
        return rows, offsets, lengths

    def _read(
        self, block: RankChunk, s: _Source, fid: int, entry, now: np.ndarray, later, pinned=None
    ):
        """Payloads of block samples `now`, then of `later` (one reader call). A problem
        with a later sample is not this step's: it is raised when that sample's step reads
        it, so a failed read is retried with this step's samples alone. `pinned`: the
        `_where` and page groups `_pinned` worked out for these samples."""
        where, pages = pinned if pinned is not None else (self._where(block, s, now, later), None)
        rows, offsets, lengths = where
        reader = self._reader(s, fid, entry)
        try:
            if s.fmt == "arrow" and reader.object is None:
                # a memory map: a truncated file would fault (SIGBUS) where it is read
                self._recheck(s, fid, entry, reader)
            if s.fmt == "parquet":
                out = reader.fetch(  # type: ignore[call-arg]
                    rows, offsets, lengths, keep=_cache_groups(later), pages=pages
                )
            else:
                out = reader.fetch(rows, offsets, lengths)
            # after the read: a file rewritten before or while it was read shows here, and
            # its bytes are not handed on (an object's are checked by `_recheck_objects`)
            self._recheck(s, fid, entry, reader)
            if reader.object is not None:
                return _ObjectRead(out, s, fid, entry, reader)
            return out
        except Exception as exc:
            # a changed file is often unreadable where the index says: say it changed
            self._recheck(s, fid, entry, reader, fresh=True)
            if not isinstance(exc, SourceDataError) or later is None or not len(later):
                raise
        finally:
            self._release(reader)
        return self._read(block, s, fid, entry, now, None)

    def _recheck(
        self,
        s: _Source,
        fid: int,
        entry: dict[str, Any],
        reader: FileReader | list[tuple[int, Any]],
        fresh: bool = False,
    ) -> None:
        """DataChangedError naming the file and the step if what `reader` reads is not the
        version pinned at the file's check: a file's fstat (size, mtime, inode), a memory
        map's path, an object's version when its handle was opened, or (`fresh`) now. Given
        (which, path) pairs instead of a reader, the files at those paths now."""
        key = (s.sid, fid)
        if key in self._changed:
            raise DataChangedError(self._changed[key])
        pins = self.pins.get(key)
        if pins is None:  # not checked (verify="none"), or re-checks off
            return
        handles = reader if isinstance(reader, list) else reader.handles()
        for which, handle in handles:
            pinned = pins[which]
            if type(handle) is int and pinned is not None and pinned[0] == "file":
                st = os.fstat(handle)  # the common case, once per file a fetch: kept lean
                if (
                    st.st_mtime_ns == pinned[4]
                    and st.st_size == pinned[3]
                    and st.st_ino == pinned[2]
                    and st.st_dev == pinned[1]
                ):
                    continue
                now = stat_identity(st)
            elif isinstance(handle, RangeFile):
                now = storage.version(handle.url) if fresh else handle.version
                if fresh:
                    handle.checked = handle.requests
            elif isinstance(handle, int):
                now = stat_identity(os.fstat(handle))
            else:
                now = file_identity(handle)
            if pinned is None:  # not known at the check: this first open pins it
                pins[which] = now
                continue
            change = identity_change(pinned, now) if now is not None else ("removed", False)
            if change is None:
                continue
            reason, same_size = change
            path, companion = entry_paths(self.root, entry, f"{s.name} files[{fid}]", self._dirs)
            if (
                same_size
                and content_decides(entry, pins)
                and content_problem(path, companion, entry, entry["path"]) is None
            ):
                pins[which] = now  # another copy of the same bytes
                continue
            self._changed_file(s, fid, entry, which, reason)

    def _changed_file(self, s: _Source, fid: int, entry, which: int, reason: str) -> None:
        """Raise (and remember, for every later read of the file) that it changed."""
        rel = entry["path"] if which == 0 else entry.get("index_path", entry["path"])
        shown = str(storage.join(self.root, rel)) if storage.is_url(self.root) else rel
        at = f" at step {self._step}" if self._step is not None else ""
        message = (
            f"source {s.name!r}: {shown} changed after it was checked ({reason}), found "
            f"reading{at}; none of its new bytes were used. Restore the file, or re-index and "
            "re-plan and resume from a checkpoint"
        )
        self._changed[(s.sid, fid)] = message
        raise DataChangedError(message)

    def _recheck_objects(self, results: list) -> None:
        """Ask the store for the version of every object this fetch read from (one request
        each, all at once): the reads of a handle go to the object as it is now, whatever
        version the handle was opened at, so a rewrite since shows here, before the bytes
        are used. Objects whose reads were all served from caches need no request."""
        todo = []
        for k, read in enumerate(results):
            if not isinstance(read, _ObjectRead):
                continue
            results[k] = read.payloads
            if self.pins.get((read.source.sid, read.fid)) is None:
                continue
            if any(
                isinstance(h, RangeFile) and h.requests != h.checked
                for _w, h in read.reader.handles()
            ):
                todo.append(read)

        def check(read: _ObjectRead) -> DataChangedError | None:
            try:
                self._recheck(read.source, read.fid, read.entry, read.reader, fresh=True)
            except DataChangedError as exc:
                return exc
            return None

        for error in parallel(check, todo):
            if error is not None:
                raise error

    def _all_tokens(self, block: RankChunk, lo: int, hi: int, payloads: list) -> list[np.ndarray]:
        """Each sample's token ids (`_tokens`). An integer array of the planned length that
        needs no cut is used as it is, with no per-sample conversion: `batch.compact` turns
        them into int64 as it concatenates them."""
        rec = block.fetch
        planned = rec.tokens[lo:hi].tolist()
        cut = self.truncate_to
        out = []
        for k, payload in enumerate(payloads):
            if (
                type(payload) is np.ndarray
                and payload.dtype.kind in "iu"
                and len(payload) == planned[k]
                and (cut is None or planned[k] <= cut)
            ):
                out.append(payload)
                continue
            sid, _fid, entry = rec.files[int(rec.file[lo + k])]
            s = self.sources[sid]
            gid, row = int(block.ids[lo + k]), int(rec.row[lo + k])
            out.append(self._tokens(s, entry, gid - s.base, row, planned[k], payload))
        return out

    def _reader(self, s: _Source, file_id: int, entry: dict[str, Any]) -> FileReader:
        """The open reader of a file (opened if need be), marked busy until `_release`."""
        key = (s.sid, file_id)
        if key in self._changed:
            raise DataChangedError(self._changed[key])
        with self._files_lock:
            reader = self._files.get(key)
            if reader is not None:
                self._busy[reader] = self._busy.get(reader, 0) + 1
        if reader is None:
            where = f"{s.name} files[{file_id}]"
            try:
                path, companion = entry_paths(self.root, entry, where, self._dirs)
            except ValueError as exc:
                raise PlanError(f"{self.plan_path}: {exc}") from None
            try:
                reader = self._open(s, file_id, entry, path, companion)
            except ValueError as exc:  # facts no reader takes (a forged plan)
                raise PlanError(f"{self.plan_path}: corrupt plan ({where}: {exc})") from None
            try:
                self._recheck(s, file_id, entry, reader)  # the version this open found
            except BaseException:
                reader.close()
                raise
            with self._files_lock:
                self._busy[reader] = 1
                self._files.put(key, reader)
        return reader

    def _open(self, s: _Source, file_id: int, entry, path, companion) -> FileReader:
        """`open_reader` of a file; one it cannot open (its header, footer or frames are
        not where they were) is first compared with its pinned version, to say it changed."""
        try:
            return open_reader(
                s.fmt,
                path,
                payload_kind=s.payload["kind"],
                column=str(s.payload.get("column") or ""),
                companion=companion,
                blocks=self._blocks,
                # an object's errors name its URL (the store, not the file, may be at fault)
                display=str(path) if storage.is_url(path) else str(entry["path"]),
            )
        except SourceDataError:
            paths = [(0, path)] + ([(1, companion)] if companion is not None else [])
            self._recheck(s, file_id, entry, paths)
            raise

    def _release(self, reader: FileReader) -> None:
        """A read of `reader` is done: close it if it was evicted meanwhile."""
        with self._files_lock:
            left = self._busy.pop(reader) - 1
            if left:
                self._busy[reader] = left
            elif reader in self._retired:
                self._retired.discard(reader)
                reader.close()

    def _retire(self, _key: Any, reader: FileReader) -> None:
        """The open-file cache lets go of `reader` (under `_files_lock`): closed now, or when
        the threads reading it are done."""
        if reader in self._busy:
            self._retired.add(reader)
        else:
            reader.close()

    def _tokens(
        self, s: _Source, entry: dict[str, Any], row: int, file_row: int, planned: int, payload
    ) -> np.ndarray:
        """Token ids of one sample; its length must be the one the plan was made with."""
        # JSONL lines are 1-based in messages, as the indexer reports them
        where = f"line {file_row + 1}" if s.fmt in _JSONL else f"row {file_row}"
        if isinstance(payload, str):
            assert s.tokenize is not None
            ids = _token_ids(
                s.tokenize(payload), f"source {s.name!r} row {row} ({entry['path']} {where})"
            )
        else:
            ids = np.asarray(payload)
            if ids.dtype.kind not in "iu":
                ids = ids.astype(np.int64)
        if len(ids) != planned:
            if s.exact:
                what = "tokenize returned" if isinstance(payload, str) else "the file holds"
                raise SourceDataError(
                    f"source {s.name!r} row {row} ({entry['path']} {where}): "
                    f"{what} {len(ids)} tokens, the index says {planned}; the plan "
                    "was made with other lengths (different tokenizer, or changed data)"
                )
            ids = ids[:planned]  # estimated="fit": never longer than planned
        if self.truncate_to is not None and len(ids) > self.truncate_to:
            ids = ids[: self.truncate_to]
        return ids


def _token_ids(out: Any, where: str) -> np.ndarray:
    """What a tokenize function returned, as int64 token ids; SourceDataError naming `where`
    and the value for anything but integers that fit int64 (a bool, 1.5, "7", None), which
    a cast would silently turn into other ids."""
    if isinstance(out, list | tuple) and {bool, np.bool_} & set(map(type, out)):
        bad = next(x for x in out if type(x) in (bool, np.bool_))
        raise SourceDataError(f"{where}: tokenize returned token id {bad!r}, not an integer")
    try:
        ids = np.asarray(out)
    except (TypeError, ValueError) as exc:
        raise SourceDataError(f"{where}: tokenize returned no array of token ids ({exc})") from None
    if ids.ndim != 1:
        raise SourceDataError(
            f"{where}: tokenize returned an array of shape {ids.shape}; it must return a flat "
            "sequence of token ids"
        )
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    if ids.dtype.kind == "u" and ids.itemsize == 8 and int(ids.max()) >= 2**63:
        bad = int(ids[np.argmax(ids >= 2**63)])
        raise SourceDataError(f"{where}: tokenize returned token id {bad}, outside int64")
    if ids.dtype.kind not in "iu":
        items = list(out) if isinstance(out, list | tuple) else ids.tolist()
        bad = next((x for x in items if type(x) is not int or not -(2**63) <= x < 2**63), items[0])
        raise SourceDataError(
            f"{where}: tokenize returned token id {bad!r} ({ids.dtype}), not an integer that "
            "fits int64"
        )
    return ids.astype(np.int64, copy=False)
