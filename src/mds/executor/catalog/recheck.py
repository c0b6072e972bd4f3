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
    MODES,
    content_decides,
    content_problem,
    file_identity,
    file_problem,
    holds_none,
    identity_change,
    stat_identity,
)
from mds.core.fingerprint import opened_fingerprints
from mds.core.object_ranges import RangeFile, in_order, keep_open, parallel, take_kept
from mds.core.planfile import RankChunk
from mds.core.storage import MOVED_HINT
from mds.errors import DataChangedError, PlanError, SourceDataError
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

    def __init__(self, plan: PlanSources, owner: Any = None):
        self.plan = plan
        self.rechecks = os.environ.get(RECHECK_ENV, "").strip() != "0"
        self.checked: set[tuple[int, int]] = set()  # (source id, file) already checked
        # (source id, file) -> the versions of the file and its companion seen at its check
        # (datacheck.stat_identity, storage.object_version), which every open and every read
        # of it is compared with (`recheck`)
        self.pins: Pins = {}
        self._changed: dict[tuple[int, int], str] = {}  # files found changed: their error
        self.step: int | None = None  # the step being read, for messages
        # whose kept object handles a check may take (`object_ranges.keep_open`): the first
        # reads' of the same catalog
        self.owner = owner

    def restore(self, checked: set[tuple[int, int]], pins: Pins) -> None:
        """Take over another process's `checked` and `pins` (copies)."""
        self.checked = set(checked)
        self.pins = {k: list(v) for k, v in pins.items()}

    def check_files(self, block: RankChunk, full: bool, lo: int = 0, hi: int | None = None) -> None:
        """Stat (or, with `full`, fingerprint) the files samples [lo, hi) of `block` read that
        this process has not checked yet, against the records the plan copied from the index:
        start-up I/O follows what is read first, not the corpus's files or the whole chunk.
        Under a relocated root each file's content fingerprint is checked too. The version
        each file has is pinned first: what is read of it later must be that version. Objects
        are opened all at once first (`_open_objects`), then checked in order."""
        plan = self.plan
        files = block.fetch.files
        used = np.unique(block.fetch.file[lo:hi]).tolist() if hi != lo else []
        entries = [files[f] for f in used]
        opened = self._open_objects(entries)
        try:
            prints = self._opened_prints(entries, opened, full)
            for sid, fid, entry in entries:
                s = plan.source_of(sid)
                plan.same_record(s, fid, entry)
                if (sid, fid) in self.checked:
                    continue
                where = f"{s.name} files[{fid}]"
                problem, seen_before = self._check(sid, fid, entry, full, where, opened, prints)
                if problem is not None and seen_before:
                    # seen through a handle the first reads opened earlier: look again, so a
                    # refusal is of the file as it is now
                    problem, _ = self._check(sid, fid, entry, full, where, {})
                if (
                    problem is not None
                    and problem.endswith(": missing")
                    and holds_none(plan.root, (entry for _s, _f, entry in block.fetch.files))
                ):
                    raise DataChangedError(
                        f"the data root {plan.root} ({plan.root_origin()}) holds none of the "
                        f"indexed files (source {s.name!r}: {problem}); if the plan or the data "
                        f"moved, or the root is mistyped: {MOVED_HINT}"
                    )
                if problem is not None:
                    raise DataChangedError(
                        f"source {s.name!r}: {problem}; the data changed since it was indexed "
                        "(re-index and re-plan, or restore the file)"
                    )
                self.checked.add((sid, fid))
        finally:
            for handle, _before in opened.values():
                if not isinstance(handle, SourceDataError):
                    handle.close()

    def _open_objects(self, entries: list) -> dict[str, tuple[Any, bool]]:
        """Open handles of the objects (and companions) of the unchecked `entries` (or the
        error opening one raised), by URL, and whether each was opened before this check:
        with the re-checks on (which compare what is read with the store's version after
        each fetch), the handles this catalog's first reads kept a few seconds before (no
        request); the rest opened now, all at once (one metadata request each, in flight
        together). Nothing for local files."""
        if not storage.is_url(self.plan.root):
            return {}
        urls = []
        for sid, fid, entry in entries:
            try:
                s = self.plan.source_of(sid)
                urls += [
                    str(p)
                    for p in self.plan.paths(entry, f"{s.name} files[{fid}]")
                    if p is not None and (sid, fid) not in self.checked
                ]
            except (PlanError, ValueError):  # raised by the check, in order
                continue
        opened: dict[str, tuple[Any, bool]] = {}
        fresh = []
        for url in dict.fromkeys(urls):
            kept = take_kept(url, self.owner) if self.rechecks and self.owner is not None else None
            if kept is not None:
                opened[url] = (kept, True)
            else:
                fresh.append(url)
        for url, handle in zip(fresh, parallel(_open_object, fresh), strict=True):
            opened[url] = (handle, False)
        return opened

    def _opened_prints(self, entries: list, opened: dict, full: bool) -> dict:
        """The content fingerprints the checks of the unchecked `entries` will compare (all
        of them with `full`; else those of a relocated root, or whose mtime differs), of the
        objects `_open_objects` opened: read through those handles with every object's
        ranges in flight together, instead of each object opened again and read one range
        after another on the building thread. A read that fails is left to the check."""
        plan, objects = self.plan, {}
        for sid, fid, entry in entries:
            stored = entry.get("fingerprint") if isinstance(entry, dict) else None
            mode = stored.partition(":")[0] if isinstance(stored, str) else None
            if (sid, fid) in self.checked or mode not in MODES:
                continue
            try:
                paths = plan.paths(entry, f"{plan.source_of(sid).name} files[{fid}]")
            except (PlanError, ValueError):
                continue
            handles = [opened.get(str(p), (None, False))[0] for p in paths if p is not None]
            if not handles or any(isinstance(h, SourceDataError | None) for h in handles):
                continue
            try:
                st = storage.opened_stat(handles[0], str(paths[0]))
                sizes = [int(h.size()) for h in handles]
            except (SourceDataError, OSError):
                continue
            if not full and (
                st is None
                or st.st_size != entry.get("size")
                or (not plan.relocated and st.st_mtime_ns == entry.get("mtime_ns"))
            ):
                continue  # no content check, or one left to the check itself
            for p, h, size in zip((p for p in paths if p is not None), handles, sizes, strict=True):
                objects[str(p)] = (h, size, mode)
        if not objects:
            return {}

        def read(job: tuple) -> bytes | None:
            handle, url, size, lo, hi = job
            try:
                return storage.read_exact(handle, url, size, lo, hi - lo)
            except SourceDataError:
                return None

        return opened_fingerprints(
            objects, lambda jobs: in_order(read, jobs, [job[4] - job[3] for job in jobs])
        )

    def _check(
        self,
        sid: int,
        fid: int,
        entry: Any,
        full: bool,
        where: str,
        opened: dict,
        prints: dict | None = None,
    ) -> tuple[str | None, bool]:
        """Pin a file's version (re-checks on) and compare it with its record
        (`file_problem`, with the fingerprints `prints` read for it): the problem or None,
        and whether an object was seen through a handle opened before the check
        (`_open_objects`)."""
        plan = self.plan
        known: dict[str, Any] = {}
        seen_before = False
        if self.rechecks or storage.is_url(plan.root):
            versions, seen_before = self._versions_now(entry, where, known, opened)
            if self.rechecks:
                self.pins[(sid, fid)] = versions
        problem = file_problem(
            plan.root, entry, full, where, content=plan.relocated, known=known, prints=prints
        )
        return problem, seen_before

    def _versions_now(
        self, entry: Any, where: str, known: dict[str, Any], opened: dict
    ) -> tuple[list[tuple | None], bool]:
        """The versions of a file and its companion now (None: cannot be had; the check
        names the problem), and whether one was seen before the check. An object's version,
        size and mtime (into `known`, for the check) come from its open, taken from
        `opened` (else opened now), whose handle is then kept for the reader's open
        (`object_ranges.keep_open`): one metadata request, or none, for the check, the pin
        and the open."""
        try:
            path, companion = self.plan.paths(entry, where)
        except ValueError:
            return [None, None], False
        versions: list[tuple | None] = [None, None]
        seen_before = False
        for k, p in enumerate((path, companion)):
            if p is None:
                continue
            if not storage.is_url(p):
                versions[k] = file_identity(p)
                continue
            handle, before = opened.pop(str(p), None) or (_open_object(str(p)), False)
            seen_before |= before
            versions[k] = _object_now(str(p), handle, known, self.owner)
        return versions, seen_before

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


def _open_object(url: str) -> Any:
    """An open pyarrow file of object `url` (one metadata request), or the error opening it
    raised (named as a stat's, which the check is)."""
    try:
        return storage.open_input(url, "stat")
    except SourceDataError as exc:
        return exc


def _object_now(url: str, handle: Any, known: dict, owner: Any) -> tuple | None:
    """The version of object `url` from `handle`, its size and mtime (or the error opening
    it raised) into `known` for the check; the handle is kept (by `owner`) for the reader's
    open. None where there is no version."""
    if isinstance(handle, SourceDataError):
        known[url] = handle  # the check raises it, or names the object missing
        return None
    try:
        version = storage.object_version(handle, url)
        st = storage.opened_stat(handle, url)
    except SourceDataError as exc:
        handle.close()
        known[url] = exc
        return None
    if st is not None:
        known[url] = (st.st_size, st.st_mtime_ns)
    keep_open(url, handle, owner)
    return version
