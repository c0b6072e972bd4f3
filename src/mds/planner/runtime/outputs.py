"""Refuse an output path that is one of the command's inputs, before anything runs.

Two paths are the same file when they share (st_dev, st_ino), so symlinks and hard links
are caught; a directory output (an index) is also refused when it holds an input, and a
file output when it lies inside an input directory (an index).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mds.errors import ConfigError

__all__ = ["check_output", "index_inputs", "recorded_root"]


def _ident(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _inside(path: Path, directory: Path) -> bool:
    try:
        path.resolve().relative_to(directory.resolve())
    except (ValueError, OSError):
        return False
    return True


# A directory holding at least this many inputs is listed once (readdir gives each entry's
# inode and whether it is a symlink) instead of stat-ing each input, and resolved once for
# all of them: a million source files in a thousand directories cost a thousand listings
# and resolutions, not a million stats and path resolutions (~0.06 ms each).
_LIST_FROM = 8


class _Inputs:
    """Identity and resolved path of many input files, one directory at a time (paths are
    handled as strings: Path objects cost more than the stat they replace)."""

    def __init__(self, paths: list[str]) -> None:
        self._dirs: dict[str, tuple[int, str, dict[str, os.DirEntry]]] = {}
        members: dict[str, list[str]] = {}
        for path in paths:
            members.setdefault(os.path.dirname(path), []).append(path)
        for directory, files in members.items():
            if len(files) >= _LIST_FROM:
                try:
                    dev = os.stat(directory or ".").st_dev
                    with os.scandir(directory or ".") as entries:
                        listed = {e.name: e for e in entries if not e.is_symlink()}
                    if self._consistent(dev, listed, files):
                        self._dirs[directory] = (dev, os.path.realpath(directory), listed)
                except OSError:
                    continue

    @staticmethod
    def _consistent(dev: int, listed: dict[str, os.DirEntry], files: list[str]) -> bool:
        """True if stat agrees with the listing on one input of the directory: some overlay
        file systems give readdir inode numbers that differ from stat's, then each input
        is stat-ed."""
        sample = next((f for f in files if os.path.basename(f) in listed), None)
        if sample is None:
            return True
        st = os.stat(sample)
        return (st.st_dev, st.st_ino) == (dev, listed[os.path.basename(sample)].inode())

    def _entry(self, path: str) -> tuple[int, str, os.DirEntry] | None:
        """(device, resolved directory, entry) of a file (not a symlink) of a listed
        directory, else None."""
        directory, name = os.path.split(path)
        listed = self._dirs.get(directory)
        entry = listed[2].get(name) if listed else None
        return (listed[0], listed[1], entry) if entry else None

    def ident(self, path: str) -> tuple[int, int] | None:
        """(st_dev, st_ino) as os.stat gives it; None for a missing path."""
        found = self._entry(path)
        return (found[0], found[2].inode()) if found else _ident(path)

    def holds(self, directory: str, path: str) -> bool:
        """True if the resolved `directory` holds `path` once resolved."""
        found = self._entry(path)
        try:
            resolved = os.path.join(found[1], found[2].name) if found else os.path.realpath(path)
        except OSError:
            return False
        return os.path.commonpath([resolved, directory]) == directory


def check_output(
    flag: str,
    output: Path,
    inputs: Iterable[tuple[str, str | Path | None]],
    *,
    directory: bool = False,
) -> None:
    """Raise ConfigError if `output` (given as `flag`) is, holds or lies inside an input.

    `inputs` are (role, path) pairs such as ("config file", mds.toml); `directory` says the
    output is a directory (mds index -o), which must not hold any input either.
    """
    output = Path(output)
    out_id = _ident(output)
    pairs = [(role, os.fspath(path)) for role, path in inputs if path is not None]
    # An output that does not exist yet is no input and holds none: the inputs (every source
    # file of an index) need no look then.
    if out_id is not None:
        # The same file: the same (st_dev, st_ino), through any symlink or hard link.
        files = _Inputs([path for _, path in pairs])
        for role, path in pairs:
            if out_id == files.ident(path):
                raise ConfigError(f"{flag} {output} is the {role} {path}; choose another output")
        if directory:
            resolved = os.path.realpath(output)
            for role, path in pairs:
                if files.holds(resolved, path):
                    raise ConfigError(
                        f"{flag} {output} holds the {role} {path}; choose another output"
                    )
    for role, path in pairs:
        if role.startswith("index") and os.path.isdir(path) and _inside(output, Path(path)):
            raise ConfigError(f"{flag} {output} is inside the {role} {path}; choose another output")


def index_inputs(
    index: Path | None, output: Path, data: dict[str, Any] | None = None
) -> list[tuple[str, str | Path | None]]:
    """An index directory, its manifest and, when `output` exists, the source files the
    manifest lists, as inputs (a new file is none of them: no need to read the file list).
    `data`: the manifest, when the caller has read it already (at a million files a parse
    costs seconds)."""
    if index is None:
        return []
    import json

    from mds.core.storage import is_url

    index = Path(index)
    out: list[tuple[str, str | Path | None]] = [
        ("index directory", index),
        ("index manifest", index / "manifest.json"),
    ]
    if not os.path.exists(output):
        return out
    try:
        if data is None:
            data = json.loads((index / "manifest.json").read_text(encoding="utf-8"))
        if is_url(data["root"]):
            return out  # objects are never an output's path
        root = str(data["root"])  # strings: a Path per file costs more than its check
        for source in data["sources"]:
            out.extend(("source file", os.path.join(root, f["path"])) for f in source["files"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # an unreadable manifest is reported by the command itself
    return out


def recorded_root(root: str, plan_dir: Path) -> str:
    """The data root as a plan records it: relative to the plan's directory, so the tree
    can move as a whole; an object store root (s3://) as its URL."""
    from mds.core.storage import is_url

    return root if is_url(root) else os.path.relpath(root, plan_dir)
