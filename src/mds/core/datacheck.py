"""Checks that a source file is still the one indexed: paths that stay inside the index root,
then size and mtime (cheap, with the content fingerprint when only the mtime differs) or the
content fingerprint (full).

Shared by `mds verify` and the executor's start-up check; stdlib only.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mds.core import storage
from mds.core.fingerprint import fingerprint, hashes_every_byte, stat_signature
from mds.errors import MdsError

__all__ = [
    "MODES",
    "content_decides",
    "content_problem",
    "entry_paths",
    "holds_none",
    "file_identity",
    "file_problem",
    "identity_change",
    "safe_path",
    "stat_identity",
]

MODES = ("sampled", "full")


def escapes(rel: str) -> bool:
    """Whether a relative path names something outside the directory it is relative to, by
    its text alone (absolute, or with a `..` part)."""
    return rel.startswith("/") or ".." in rel.split("/") or os.path.isabs(rel)


def safe_path(root: Path | str, rel: Any, where: str, dirs: set[str] | None = None) -> Path | str:
    """`root / rel`; a ValueError for anything but a relative path inside the root (an
    s3:// root gives the object's URL: a store has no symlinks or special files).

    `dirs`: directories under the root already found to be no symlinks, kept by the
    caller across calls, so a file beside others costs one lstat (its own)."""
    if not isinstance(rel, str) or not rel:
        raise ValueError(f"{where}: path {rel!r} is not a relative file path")
    if escapes(rel):
        raise ValueError(f"{where}: path {rel!r} escapes the index root {root}; refused, not read")
    if storage.is_url(root):
        return storage.join(root, rel)
    assert isinstance(root, Path)
    parts = [p for p in rel.split("/") if p and p != "."]  # PurePosixPath(rel).parts
    path = root.joinpath(*parts)
    linked, mode = _links_below(os.fspath(root), parts, dirs)
    if linked:
        # A symlink inside the root may still point outside it: follow links, then compare.
        try:
            inside = path.resolve().is_relative_to(root.resolve())
        except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL byte
            raise ValueError(
                f"{where}: path {rel!r} cannot be resolved ({exc}); refused, not read"
            ) from None
        if not inside:
            raise ValueError(
                f"{where}: path {rel!r} leads outside the index root {root}; refused, not read"
            )
        try:
            mode = path.stat().st_mode
        except OSError:
            mode = None
    # Opening a FIFO or a device can block or never end: only regular files are read (a
    # missing file is left to the checks and readers, which name it).
    if mode is not None and not stat.S_ISREG(mode):
        raise ValueError(f"{where}: path {rel!r} is not a regular file; refused, not read")
    return path


def _links_below(
    root: str, parts: list[str], dirs: set[str] | None = None
) -> tuple[bool, int | None]:
    """Whether a part of root/parts (which has no `..`) may be a symlink, else the file's
    mode (None if missing): without links the path stays inside the root, known from one
    lstat per part instead of resolving both paths from /. Directories in `dirs` are
    known to be no links; those found so are added."""
    path, mode = root, None
    last = len(parts) - 1
    for k, part in enumerate(parts):
        path = os.path.join(path, part)
        if k < last and dirs is not None and path in dirs:
            continue
        try:
            mode = os.lstat(path).st_mode
        except OSError:  # missing (or unreadable): no link below it is followed either
            return False, None
        except ValueError:  # a NUL byte: the resolving path says so
            return True, None
        if stat.S_ISLNK(mode):
            return True, None
        if k < last and dirs is not None and stat.S_ISDIR(mode):
            dirs.add(path)
    return False, mode


def holds_none(root: Path | str, entries: Iterable[Any]) -> bool:
    """Whether none of (the first 16 of) the files that `entries` (records with a `path`)
    name exists under `root`: the root is the wrong one (the plan or the data moved, a
    mistyped root, an empty directory or bucket), rather than a file disappearing. False
    when the store cannot be asked (the file checks then name its failure)."""
    paths = [e["path"] for e in itertools.islice(entries, 16) if isinstance(e.get("path"), str)]
    try:
        return bool(paths) and not any(storage.exists(storage.join(root, p)) for p in paths)
    except (MdsError, ValueError):
        return False


def entry_paths(
    root: Path | str, item: Any, where: str, dirs: set[str] | None = None
) -> tuple[Any, Any]:
    """A file entry's path and Megatron `.idx` companion, both checked to stay in root
    (`dirs`: see `safe_path`)."""
    if not isinstance(item, dict):
        raise ValueError(f"{where}: not an object")
    path = safe_path(root, item.get("path"), where, dirs)
    companion = safe_path(root, item["index_path"], where, dirs) if "index_path" in item else None
    return path, companion


def file_problem(
    root: Path | str,
    item: Any,
    full: bool,
    where: str,
    content: bool = False,
    known: dict[str, tuple[int, int] | MdsError] | None = None,
    prints: dict[tuple[str, str], str] | None = None,
) -> str | None:
    """Why the file of manifest entry `item` under `root` is not the indexed one, or None:
    `full` compares content fingerprints alone; otherwise size and mtime, with the content
    fingerprint where the mtime differs, or always (`content`: a relocated root, where a copy
    keeps names, sizes and mtimes whatever its bytes are). `known`: (size, mtime_ns) by
    path, or the error asking for them raised, as the caller just had them from the store
    (an object's open), not asked again; `prints`: fingerprints by (path, mode) the caller
    just read through that open (`fingerprint.opened_fingerprints`)."""
    try:
        path, companion = entry_paths(root, item, where)
    except ValueError as exc:
        return str(exc)
    rel = item["path"]
    try:
        if full:
            return _content_problem(path, companion, item, rel, prints)
        return _stat_problem(path, companion, item, rel, content, known or {}, prints)
    except MdsError as exc:  # unreadable or missing: SourceDataError from the fingerprint helpers
        for where, name in ((path, rel), (companion, item.get("index_path"))):
            if where is not None and str(exc).startswith(f"{where}: "):
                reason = str(exc).removeprefix(f"{where}: ")
                if storage.is_url(where):
                    gone = reason.startswith("missing")
                    if not gone:  # the store failed (down, slow, refused): not a data change
                        raise
                else:
                    gone = not os.path.lexists(where)
                return f"{name}: {'missing' if gone else reason}"
        return f"{rel}: {exc}"


def _stat_problem(
    path: Any,
    companion: Any,
    item: dict,
    rel: str,
    content: bool = False,
    known: dict[str, tuple[int, int] | MdsError] | None = None,
    prints: dict[tuple[str, str], str] | None = None,
) -> str | None:
    """Size, then mtime; a file whose only difference is its mtime (touched, copied without
    keeping times, synced from object storage) is checked by its content fingerprint, so
    data that moved passes and data that changed fails naming the file. `content`: the
    fingerprint is checked whatever the mtime. `known`, `prints`: see `file_problem`."""
    known = known or {}

    def signature(p: Any) -> tuple[int, int]:
        got = known.get(str(p))
        if isinstance(got, MdsError):
            raise got
        return got or stat_signature(p)

    size, mtime = signature(path)
    if size != item.get("size"):
        return f"{rel}: size changed ({item.get('size')} -> {size} bytes)"
    if companion is not None:
        signature(companion)  # no recorded stat: its content is checked by --full
    if mtime != item.get("mtime_ns"):
        problem = _content_problem(path, companion, item, rel, prints)
        if problem is not None:
            return f"{problem}; modified (mtime_ns {item.get('mtime_ns')} -> {mtime})"
    elif content:
        return _content_problem(path, companion, item, rel, prints)
    return None


def content_decides(item: dict, pins: list[tuple | None]) -> bool:
    """Whether `item`'s fingerprint covers every byte of the file (and companion) at the
    pinned sizes, so that a same-size version whose content matches it is the same data; a
    sampled fingerprint of a larger file skips most bytes, and cannot."""
    stored = item.get("fingerprint")
    sizes = [p[3] if p[0] == "file" else p[1] for p in pins if p is not None]
    return isinstance(stored, str) and hashes_every_byte(stored, *sizes)


def content_problem(path: Any, companion: Any, item: dict, rel: str) -> str | None:
    """Why the content of `path` (and its companion) is not what `item`'s fingerprint says."""
    return _content_problem(path, companion, item, rel)


def _content_problem(
    path: Any, companion: Any, item: dict, rel: str, prints: dict | None = None
) -> str | None:
    stored = item.get("fingerprint")
    mode = stored.partition(":")[0] if isinstance(stored, str) else None
    if mode not in MODES:
        return f"{rel}: unknown fingerprint {stored!r} in the manifest"
    prints = prints or {}

    def of(p: Any) -> str:
        return prints.get((str(p), mode)) or fingerprint(p, mode)

    got = of(path)
    if companion is not None:
        got = f"{got}+{of(companion).split(':', 1)[1]}"
    if got != stored:
        return f"{rel}: content changed ({mode} fingerprint {stored} -> {got})"
    return None


# --- re-checks while reading ------------------------------------------------------------
#
# A file checked once can still be rewritten while a run reads it. Its version at the check
# is pinned: for a file (device, inode, size, mtime_ns), for an object ("object", size,
# ETag or generation); each open handle, and each read that goes to the file, is compared
# with it (`identity_change`).


def stat_identity(st: os.stat_result) -> tuple:
    """The pinned version of a file from its stat (or fstat)."""
    return ("file", st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def file_identity(path: Any) -> tuple | None:
    """The version of the file or object at `path` now; None if it cannot be had (the check
    or the read then names the problem)."""
    try:
        if storage.is_url(path):
            return storage.version(str(path))
        return stat_identity(os.stat(path))
    except (OSError, MdsError):
        return None


def identity_change(pinned: tuple, now: tuple) -> tuple[str, bool] | None:
    """How version `now` differs from `pinned` (None: the same), and whether its size did
    not (another inode, mtime or object version of the same size, as `touch`, a copy that
    keeps times or a re-upload makes): then the content may decide (`content_decides`)."""
    if now == pinned:
        return None
    if now[0] != pinned[0]:
        return "replaced", False
    if pinned[0] == "object":
        if now[1] != pinned[1]:
            return f"size {pinned[1]} -> {now[1]} bytes", False
        return f"rewritten (version {pinned[2]} -> {now[2]})", True
    if now[3] != pinned[3]:
        return f"size {pinned[3]} -> {now[3]} bytes", False
    if now[4] != pinned[4]:  # touched, or edited in place: the content decides
        return f"modified (mtime_ns {pinned[4]} -> {now[4]})", True
    return "replaced by another file of the same size and mtime", True
