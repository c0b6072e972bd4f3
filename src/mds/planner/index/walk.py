"""glob.glob(pattern, root_dir=root, recursive=True), with the directory entry of each match.

The same matches in the same order as the standard library's glob (hidden names skipped
unless the pattern's part starts with ".", `**` following symlinks to directories), from
the same os.scandir listings, but each match keeps the os.DirEntry it was listed with, so
discovery stats it from there (an lstat, no path parsing) instead of starting again from a
string. A match glob finds by its literal name (no listing) has no entry (None).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator

__all__ = ["cat", "glob_entries", "glob_groups"]

Match = tuple[str, "os.DirEntry[str] | None"]


def glob_entries(pattern: str, root: str) -> list[Match]:
    """(path relative to `root` as glob gives it, its entry or None) of each match of the
    relative `pattern` under the directory `root`, as glob.glob(pattern, root_dir=root,
    recursive=True) lists them."""
    it = _iglob(pattern, root, False)
    if not pattern or _recursive(pattern[:2]):
        first = next(it, None)  # glob leaves out the root itself ("")
        if first is not None and first[0]:
            return [first, *it]
    return list(it)


def glob_groups(pattern: str, root: str) -> list[tuple[str, list[Match]]] | None:
    """glob_entries's matches of a pattern whose last part is a plain glob (`**/*.jsonl`,
    `data/*.parquet`) as (directory as glob gives it, [(name, entry), ...] of its matches),
    each directory listed once, in glob's order: a caller handles a directory's files
    together, never parsing a path per file. None for any other pattern."""
    dirname, basename = os.path.split(pattern)
    if not _magic(basename) or _recursive(basename) or "//" in pattern or pattern[-1:] == "/":
        return None
    if dirname and _magic(dirname):
        dirs: Iterator[Match] | list[Match] = _iglob(dirname, root, True)
    else:
        dirs = [(dirname, None)]
    return [(d, _glob1(_join(root, d), basename, False)) for d, _ in dirs]


def _recursive(part: str) -> bool:
    return part == "**"


def _hidden(name: str) -> bool:
    return name[0] == "."


def _join(directory: str, name: str) -> str:
    return os.path.join(directory, name) if directory and name else directory or name


def _iglob(pattern: str, root: str, dironly: bool) -> Iterator[Match]:
    dirname, basename = os.path.split(pattern)
    if not _magic(pattern):
        if basename:
            if os.path.lexists(_join(root, pattern)):
                yield pattern, None
        elif os.path.isdir(_join(root, dirname)):
            yield pattern, None
        return
    if not dirname:
        if _recursive(basename):
            yield from _glob2(root, dironly)
        else:
            yield from _glob1(root, basename, dironly)
        return
    dirs: Iterator[Match] | list[Match]
    if dirname != pattern and _magic(dirname):
        dirs = _iglob(dirname, root, True)
    else:
        dirs = [(dirname, None)]
    for directory, _ in dirs:
        where = _join(root, directory)
        if not _magic(basename):
            found: Iterator[Match] | list[Match] = _glob0(where, basename)
        elif _recursive(basename):
            found = _glob2(where, dironly)
        else:
            found = _glob1(where, basename, dironly)
        for name, entry in found:
            yield cat(directory, name), entry


def cat(directory: str, rel: str) -> str:
    """os.path.join(directory, rel) for a relative `rel` (POSIX), without its checks."""
    return directory + "/" + rel if directory and directory[-1] != "/" else directory + rel


def _magic(text: str) -> bool:
    return "*" in text or "?" in text or "[" in text


def _listdir(directory: str, dironly: bool) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory or os.curdir) as it:
            out = []
            for entry in it:
                try:
                    if not dironly or entry.is_dir():
                        out.append(entry)
                except OSError:
                    pass
            return out
    except OSError:
        return []


def _glob0(directory: str, basename: str) -> list[Match]:
    if basename:
        return [(basename, None)] if os.path.lexists(_join(directory, basename)) else []
    return [(basename, None)] if os.path.isdir(directory) else []


def _glob1(directory: str, pattern: str, dironly: bool) -> list[Match]:
    entries = _listdir(directory, dironly)
    if not _hidden(pattern):
        entries = [e for e in entries if not _hidden(e.name)]
    names = {e.name: e for e in entries}
    return [(n, names[n]) for n in fnmatch.filter(list(names), pattern)]


def _glob2(directory: str, dironly: bool) -> Iterator[Match]:
    yield "", None
    yield from _rlistdir(directory, dironly)


def _rlistdir(directory: str, dironly: bool) -> Iterator[Match]:
    for entry in _listdir(directory, dironly):
        name = entry.name
        if _hidden(name):
            continue
        yield name, entry
        # glob lists every name as a directory (a file's listing fails): only directories
        # (a symlink to one included) have anything under them
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        if is_dir:
            for sub, e in _rlistdir(entry.path if directory else name, dironly):
                yield cat(name, sub), e
