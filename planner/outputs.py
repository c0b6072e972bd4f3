"""Refuse an output path that is one of the command's inputs, before anything runs.

Two paths are the same file when they share (st_dev, st_ino), so symlinks and hard links
are caught; a directory output (an index) is also refused when it holds an input, and a
file output when it lies inside an input directory (an index).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from mds.executor.errors import ConfigError

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


def check_output(
    flag: str, output: Path, inputs: Iterable[tuple[str, Path | None]], *, directory: bool = False
) -> None:
    """Raise ConfigError if `output` (given as `flag`) is, holds or lies inside an input.

    `inputs` are (role, path) pairs such as ("config file", mds.toml); `directory` says the
    output is a directory (mds index -o), which must not hold any input either.
    """
    output = Path(output)
    out_id = _ident(output)
    pairs = [(role, Path(path)) for role, path in inputs if path is not None]
    # An output that does not exist yet is no input and holds none: the inputs (every source
    # file of an index) need no stat then.
    # The same file: the same (st_dev, st_ino), through any symlink or hard link. One stat per
    # input; no path resolution, which costs ~0.5 ms a file on a source of a million files.
    for role, path in pairs if out_id is not None else ():
        if out_id == _ident(path):
            raise ConfigError(f"{flag} {output} is the {role} {path}; choose another output")
    for role, path in pairs:
        if directory and out_id is not None and _inside(path, output):
            raise ConfigError(f"{flag} {output} holds the {role} {path}; choose another output")
        if role.startswith("index") and path.is_dir() and _inside(output, path):
            raise ConfigError(f"{flag} {output} is inside the {role} {path}; choose another output")


def index_inputs(index: Path | None) -> list[tuple[str, Path | None]]:
    """An index directory, its manifest and the source files it lists, as inputs."""
    if index is None:
        return []
    import json

    from mds.executor.storage import is_url

    index = Path(index)
    out: list[tuple[str, Path | None]] = [
        ("index directory", index),
        ("index manifest", index / "manifest.json"),
    ]
    try:
        data = json.loads((index / "manifest.json").read_text(encoding="utf-8"))
        if is_url(data["root"]):
            return out  # objects are never an output's path
        root = Path(data["root"])
        for source in data["sources"]:
            out.extend(("source file", root / f["path"]) for f in source["files"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # an unreadable manifest is reported by the command itself
    return out


def recorded_root(root: str, plan_dir: Path) -> str:
    """The data root as a plan records it: relative to the plan's directory, so the tree
    can move as a whole; an object store root (s3://) as its URL."""
    from mds.executor.storage import is_url

    return root if is_url(root) else os.path.relpath(root, plan_dir)
