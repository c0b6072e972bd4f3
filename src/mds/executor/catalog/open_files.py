"""The files a process has open: a reader per (source, file), at most `max_open_files` of
them, and the cache of decoded blocks (row groups, zstd frames) they share.

Threads reading a step's files side by side share the readers: one evicted while a thread
reads it is closed when that thread is done with it. Each open is compared with the version
the file's check pinned (`DataChecks.recheck`).
"""

from __future__ import annotations

import threading
from typing import Any

from mds.core import storage
from mds.core.lru import LRU
from mds.core.memory_budget import BudgetCache
from mds.errors import PlanError, SourceDataError
from mds.executor.catalog.plan_sources import PlanSources, Source
from mds.executor.catalog.recheck import DataChecks
from mds.executor.readers import FileReader, open_reader

__all__ = ["OpenFiles"]


class OpenFiles:
    """Open readers by (source id, file), and the decoded blocks they cache (`blocks`,
    bounded by the budget's cache share less its rows read ahead, and by its room)."""

    def __init__(self, plan: PlanSources, checks: DataChecks, max_open_files: int, budget: Any):
        self.plan, self.checks = plan, checks
        self.max_open_files, self.budget = max_open_files, budget
        self.block_bytes = budget.cache - budget.ahead
        self.reset()

    def reset(self) -> None:
        """Forget open files and cached blocks (a new process must not share descriptors)."""
        # a new process (a DataLoader worker) gets a budget of its own: it is per process
        self.blocks = BudgetCache(self.block_bytes, self.budget.memory())
        # Open readers, by count. Threads reading a step's files share them: a reader
        # evicted while a thread reads it is closed when that thread is done with it.
        self._files = LRU(max_items=self.max_open_files, on_evict=self._retire)
        self._lock = threading.Lock()
        self._busy: dict[FileReader, int] = {}  # reader -> reads in progress
        self._retired: set[FileReader] = set()  # evicted while busy: closed when idle

    def __len__(self) -> int:
        """Readers open now."""
        return len(self._files)

    def close(self) -> None:
        with self._lock:
            self._files.clear()
        self.blocks.clear()

    def acquire(self, s: Source, file_id: int, entry: dict[str, Any]) -> FileReader:
        """The open reader of a file (opened if need be), marked busy until `release`."""
        key = (s.sid, file_id)
        self.checks.raise_if_changed(key)
        with self._lock:
            reader = self._files.get(key)
            if reader is not None:
                self._busy[reader] = self._busy.get(reader, 0) + 1
        if reader is None:
            where = f"{s.name} files[{file_id}]"
            try:
                path, companion = self.plan.paths(entry, where)
            except ValueError as exc:
                raise PlanError(f"{self.plan.plan_path}: {exc}") from None
            try:
                reader = self._open(s, file_id, entry, path, companion)
            except ValueError as exc:  # facts no reader takes (a forged plan)
                raise PlanError(f"{self.plan.plan_path}: corrupt plan ({where}: {exc})") from None
            try:
                self.checks.recheck(s, file_id, entry, reader)  # the version this open found
            except BaseException:
                reader.close()
                raise
            with self._lock:
                self._busy[reader] = 1
                self._files.put(key, reader)
        return reader

    def _open(self, s: Source, file_id: int, entry, path, companion) -> FileReader:
        """`open_reader` of a file; one it cannot open (its header, footer or frames are
        not where they were) is first compared with its pinned version, to say it changed."""
        try:
            return open_reader(
                s.fmt,
                path,
                payload_kind=s.payload["kind"],
                column=str(s.payload.get("column") or s.payload.get("text") or ""),
                companion=companion,
                blocks=self.blocks,
                # an object's errors name its URL (the store, not the file, may be at fault)
                display=str(path) if storage.is_url(path) else str(entry["path"]),
                images=s.payload.get("images") if s.image_text else None,
                root=self.plan.root,
            )
        except SourceDataError:
            paths = [(0, path)] + ([(1, companion)] if companion is not None else [])
            self.checks.recheck(s, file_id, entry, paths)
            raise

    def release(self, reader: FileReader) -> None:
        """A read of `reader` is done: close it if it was evicted meanwhile."""
        with self._lock:
            left = self._busy.pop(reader) - 1
            if left:
                self._busy[reader] = left
            elif reader in self._retired:
                self._retired.discard(reader)
                reader.close()

    def _retire(self, _key: Any, reader: FileReader) -> None:
        """The open-file cache lets go of `reader` (under `_lock`): closed now, or when the
        threads reading it are done."""
        if reader in self._busy:
            self._retired.add(reader)
        else:
            reader.close()
