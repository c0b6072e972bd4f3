"""The checks that the data is still what was planned.

A file is checked (size and mtime, or its content fingerprint) when the first step that
reads it is built, against the record the plan copied from the index, and the version it
has then is pinned. Every later open and read of it is compared with that version (the
re-checks), so a file rewritten or replaced during a run raises DataChangedError naming it
and the step, before any of its new bytes is used. `MDS_RECHECK=0` turns the re-checks off,
for the benchmark's comparison only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from mds.core import storage
from mds.core.datacheck import (
    content_decides,
    content_problem,
    file_identity,
    file_problem,
    holds_none,
    identity_change,
    stat_identity,
)
from mds.core.object_ranges import RangeFile, parallel
from mds.core.planfile import RankChunk
from mds.core.storage import MOVED_HINT
from mds.errors import DataChangedError
from mds.executor.catalog.plan_sources import PlanSources, Source
from mds.executor.readers import FileReader

__all__ = ["RECHECK_ENV", "DataChecks", "ObjectRead", "Pins"]

# "0" turns off the re-checks of files already checked (for the benchmark's comparison).
RECHECK_ENV = "MDS_RECHECK"

Pins = dict[tuple[int, int], list[tuple | None]]


@dataclass
class ObjectRead:
    """The payloads read from an object, with what `DataChecks.recheck_objects` needs to
    check that the object was not rewritten meanwhile."""

    payloads: list
    source: Source
    fid: int
    entry: dict[str, Any]
    reader: FileReader


class DataChecks:
    """The files this process checked, the versions pinned at their checks, and the files
    found changed since (each raises its error again on every later open or read)."""

    def __init__(self, plan: PlanSources):
        self.plan = plan
        self.rechecks = os.environ.get(RECHECK_ENV, "").strip() != "0"
        self.checked: set[tuple[int, int]] = set()  # (source id, file) already checked
        # (source id, file) -> the versions of the file and its companion seen at its check
        # (datacheck.stat_identity, storage.object_version), which every open and every read
        # of it is compared with (`recheck`)
        self.pins: Pins = {}
        self._changed: dict[tuple[int, int], str] = {}  # files found changed: their error
        self.step: int | None = None  # the step being read, for messages

    def restore(self, checked: set[tuple[int, int]], pins: Pins) -> None:
        """Take over another process's `checked` and `pins` (copies)."""
        self.checked = set(checked)
        self.pins = {k: list(v) for k, v in pins.items()}

    def check_files(self, block: RankChunk, full: bool, lo: int = 0, hi: int | None = None) -> None:
        """Stat (or, with `full`, fingerprint) the files samples [lo, hi) of `block` read that
        this process has not checked yet, against the records the plan copied from the index:
        start-up I/O follows what is read first, not the corpus's files or the whole chunk.
        Under a relocated root each file's content fingerprint is checked too. The version
        each file has is pinned first: what is read of it later must be that version."""
        plan = self.plan
        files = block.fetch.files
        used = np.unique(block.fetch.file[lo:hi]).tolist() if hi != lo else []
        for sid, fid, entry in (files[f] for f in used):
            s = plan.source_of(sid)
            plan.same_record(s, fid, entry)
            if (sid, fid) in self.checked:
                continue
            where = f"{s.name} files[{fid}]"
            if self.rechecks:
                self.pins[(sid, fid)] = self._versions_now(entry, where)
            problem = file_problem(plan.root, entry, full, where, content=plan.relocated)
            if (
                problem is not None
                and problem.endswith(": missing")
                and holds_none(plan.root, (entry for _s, _f, entry in block.fetch.files))
            ):
                raise DataChangedError(
                    f"the data root {plan.root} ({plan.root_origin()}) holds none of the indexed "
                    f"files (source {s.name!r}: {problem}); if the plan or the data moved, or "
                    f"the root is mistyped: {MOVED_HINT}"
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
            path, companion = self.plan.paths(entry, where)
        except ValueError:
            return [None, None]
        return [file_identity(path), file_identity(companion) if companion else None]

    def raise_if_changed(self, key: tuple[int, int]) -> None:
        """DataChangedError again for a file (source id, file) found changed before."""
        if key in self._changed:
            raise DataChangedError(self._changed[key])

    def recheck(
        self,
        s: Source,
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
            path, companion = self.plan.paths(entry, f"{s.name} files[{fid}]")
            if (
                same_size
                and content_decides(entry, pins)
                and content_problem(path, companion, entry, entry["path"]) is None
            ):
                pins[which] = now  # another copy of the same bytes
                continue
            self._changed_file(s, fid, entry, which, reason)

    def _changed_file(self, s: Source, fid: int, entry, which: int, reason: str) -> None:
        """Raise (and remember, for every later read of the file) that it changed."""
        root = self.plan.root
        rel = entry["path"] if which == 0 else entry.get("index_path", entry["path"])
        shown = str(storage.join(root, rel)) if storage.is_url(root) else rel
        at = f" at step {self.step}" if self.step is not None else ""
        message = (
            f"source {s.name!r}: {shown} changed after it was checked ({reason}), found "
            f"reading{at}; none of its new bytes were used. Restore the file, or re-index and "
            "re-plan and resume from a checkpoint"
        )
        self._changed[(s.sid, fid)] = message
        raise DataChangedError(message)

    def recheck_objects(self, results: list) -> None:
        """Ask the store for the version of every object this fetch read from (one request
        each, all at once): the reads of a handle go to the object as it is now, whatever
        version the handle was opened at, so a rewrite since shows here, before the bytes
        are used. Objects whose reads were all served from caches need no request. Each
        `ObjectRead` of `results` is replaced by its payloads."""
        todo = []
        for k, read in enumerate(results):
            if not isinstance(read, ObjectRead):
                continue
            results[k] = read.payloads
            if self.pins.get((read.source.sid, read.fid)) is None:
                continue
            if any(
                isinstance(h, RangeFile) and h.requests != h.checked
                for _w, h in read.reader.handles()
            ):
                todo.append(read)

        def check(read: ObjectRead) -> DataChangedError | None:
            try:
                self.recheck(read.source, read.fid, read.entry, read.reader, fresh=True)
            except DataChangedError as exc:
                return exc
            return None

        for error in parallel(check, todo):
            if error is not None:
                raise error
