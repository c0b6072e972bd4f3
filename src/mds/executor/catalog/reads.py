"""Reading a fetch's samples from their files: one reader call per file, with the rows this
rank's later samples need from a block-coded file (`early_rows`), the files read side by
side by `read_threads` threads, and every read compared with the version its file's check
pinned (`recheck`).

Of objects (s3://, gs://), every byte span a fetch will read is requested at once before
the reads (`object_ranges.prefetch`); rows decoded from Parquet pages run on the calling
thread, their files opened before any is read.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from mds.core import storage
from mds.core.object_ranges import RangeFile, prefetch
from mds.core.planfile import RankChunk
from mds.errors import MdsError, PlanError, SourceDataError
from mds.executor.catalog.early_rows import Later, Lookahead
from mds.executor.catalog.first_reads import FirstReads
from mds.executor.catalog.open_files import OpenFiles
from mds.executor.catalog.plan_sources import PlanSources, Source
from mds.executor.catalog.recheck import DataChecks, ObjectRead

__all__ = ["BLOCK_CODED", "SampleReads"]

# Formats read a block at a time (a row group, a zstd frame): worth reading rows ahead.
BLOCK_CODED = ("parquet", "jsonl.zst")


def _cache_groups(later: Later | None) -> bool:
    """Whether a Parquet read's row groups are worth caching: not when no later sample of
    this process reads the file (`Later.complete`). `_pinned` and the read decide alike."""
    return later is None or not later.complete


def _rent(later: Later | None) -> bool:
    """Whether a Parquet read from pages should stay one however often the file is read:
    when it takes later samples' rows too, which then serve their steps from `Lookahead`
    (`ParquetReader._paged`)."""
    return later is not None and len(later) > 0


class SampleReads:
    """The payloads of a fetch's samples, read from their files in plan order."""

    def __init__(
        self,
        plan: PlanSources,
        checks: DataChecks,
        files: OpenFiles,
        ahead: Lookahead | None,
        read_threads: int,
        first: FirstReads | None = None,
    ):
        self.plan, self.checks, self.files, self.ahead = plan, checks, files, ahead
        self.read_threads, self.first = read_threads, first
        self._pool: ThreadPoolExecutor | None = None

    def reset(self) -> None:
        """Forget the reading threads (a parent's threads are not a child's)."""
        self._pool = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def payloads(self, block: RankChunk, lo: int, hi: int, step: int | None = None) -> list:
        """Payloads of samples [lo, hi) of `block`, in order. One reader call per file: its
        rows are read together, with the rows this rank's later samples need from a
        block-coded file (see `Lookahead`). `step`: the step they are of, named by the error
        if a file changed."""
        self.checks.step = step
        plan = self.plan
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
        stage: list[tuple[int, Source, int, Any, np.ndarray, Any]] = []  # to prefetch or pin
        for group in np.split(missing[order], cuts) if len(missing) else []:
            sid, fid, entry = rec.files[int(rec.file[group[0]])]
            try:
                s = plan.source_of(sid)
                plan.same_record(s, fid, entry)
            except PlanError as exc:  # raised when the files before it were read, as in order
                reads.append((group, None, exc))
                continue
            later = None
            # not the rows of image-text sources: the budget counts tokens, not image bytes
            if ahead is not None and s.fmt in BLOCK_CODED and not s.image_text:
                later = ahead.later((sid, fid), entry, base, lo, hi, s.located)
            reads.append((group, later, partial(self._read, block, s, fid, entry, group, later)))
            stage.append((len(reads) - 1, s, fid, entry, group, later))
        staged = self._stage(block, stage)
        try:
            # at most max_open_files files a window (or one a thread): `_pinned` opens a
            # window's page-read files before reading any, and more would be evicted, then
            # opened again
            results: list[list | Exception] = []
            window = max(self.files.max_open_files, self.read_threads)
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
        self.checks.recheck_objects(results)
        for (group, later, _r), read in zip(reads, results, strict=True):
            if isinstance(read, Exception):
                raise read  # the first file's problem, in file order, whichever thread met it
            for j, payload in zip(group.tolist(), read[: len(group)], strict=False):
                payloads[j - lo] = payload
            if later is not None and len(read) > len(group):
                ahead.keep(later.index.tolist(), read[len(group) :])  # type: ignore[union-attr]
        return payloads

    def _stage(self, block: RankChunk, reads: list) -> list[RangeFile]:
        """Fetch what the reads will need from objects in one go: every object's byte spans
        (row groups, blocks the caches lack) as concurrent range requests, kept until the
        fetch ends. Files need nothing: a local read costs no round trip. A file that cannot
        be opened here is left to its read, which raises its error in file order."""
        if not storage.is_url(self.plan.root):
            return []
        wants = []
        for _k, s, fid, entry, now, later in reads:
            try:
                reader = self.files.acquire(s, fid, entry)
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
                self.files.release(reader)
        prefetch(wants)
        return [obj for obj, _spans in wants]

    def _pinned(self, block: RankChunk, reads: list) -> dict[int, tuple]:
        """The reads that decode rows from Parquet pages: Python work that holds the GIL,
        which a second thread would only contend for, so they run on the calling thread.
        Their files (a window's, at most `max_open_files`: see `payloads`) are opened here
        and stay open for their reads: all before any is read, which is also quicker on one
        thread than opening each as it is read (1.1 against 1.4 ms/step at 1024 sources:
        the opens share warm caches, and so do the reads). A file that cannot be opened is
        left to its read, which raises its error in file order. Per read: its source,
        file, record, `_where` and the reader's `page_groups`, which the read reuses."""
        pinned: dict[int, tuple] = {}
        for k, s, fid, entry, now, later in reads:
            if s.located != "values":
                continue
            try:
                reader = self.files.acquire(s, fid, entry)
            except MdsError:
                continue
            try:
                where = self._where(block, s, now, later)
                keep = _cache_groups(later)
                pages = reader.page_groups(  # type: ignore[attr-defined]
                    *where, keep=keep, rent=_rent(later)
                )
                if pages:
                    pinned[k] = (s, fid, entry, where, pages)
            except MdsError:
                pass
            finally:
                self.files.release(reader)
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

    def _where(self, block: RankChunk, s: Source, now: np.ndarray, later):
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
                f"{self.plan.plan_path}: corrupt plan (a sample's file is of another source)"
            )
        return rows, offsets, lengths

    def _read(
        self, block: RankChunk, s: Source, fid: int, entry, now: np.ndarray, later, pinned=None
    ):
        """Payloads of block samples `now`, then of `later` (one reader call). A problem
        with a later sample is not this step's: it is raised when that sample's step reads
        it, so a failed read is retried with this step's samples alone. `pinned`: the
        `_where` and page groups `_pinned` worked out for these samples."""
        where, pages = pinned if pinned is not None else (self._where(block, s, now, later), None)
        rows, offsets, lengths = where
        if self.first is not None:
            self.first.reached(s.sid, fid)
        reader = self.files.acquire(s, fid, entry)
        try:
            if s.fmt == "arrow" and reader.object is None:
                # a memory map: a truncated file would fault (SIGBUS) where it is read
                self.checks.recheck(s, fid, entry, reader)
            if s.fmt == "parquet":
                # rows read ahead from pages are kept as one array, narrow where they fit
                out = reader.fetch(  # type: ignore[call-arg]
                    rows,
                    offsets,
                    lengths,
                    keep=_cache_groups(later),
                    pages=pages,
                    rent=_rent(later),
                    narrow=_rent(later),
                )
            else:
                out = reader.fetch(rows, offsets, lengths)
            # after the read: a file rewritten before or while it was read shows here, and
            # its bytes are not handed on (an object's are checked by `recheck_objects`)
            self.checks.recheck(s, fid, entry, reader)
            if reader.object is not None:
                return ObjectRead(out, s, fid, entry, reader)
            return out
        except Exception as exc:
            # a changed file is often unreadable where the index says: say it changed
            self.checks.recheck(s, fid, entry, reader, fresh=True)
            if not isinstance(exc, SourceDataError) or later is None or not len(later):
                raise
        finally:
            self.files.release(reader)
        return self._read(block, s, fid, entry, now, None)
