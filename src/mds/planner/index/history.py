"""The manifests of earlier builds of an index, kept under history/ so plans made from them
still verify after a re-index: the previous manifest copied there before the new one is
committed, the newest HISTORY_KEEP kept, and the tables they name kept with them.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from mds.core.index_manifest import HISTORY, MANIFEST, IndexManifest, history_name
from mds.planner.runtime.atomic import atomic_path, is_temp

__all__ = ["HISTORY", "HISTORY_KEEP", "keep_previous", "manifest_tables", "prune", "prune_local"]

HISTORY_KEEP = 8  # earlier manifests kept; the tables only older ones name are removed

# A source's "table" (and its "files_table", VERSION 2) in a manifest laid out by
# json.dumps(indent=2, sort_keys=True): six spaces deep, and a string without quotes or
# escapes (mds names tables sources/NAME-HEX).
_TABLE = re.compile(rb'^ {6}"(?:files_)?table": "([^"\\\n]+)",?$', re.MULTILINE)


def manifest_tables(text: bytes) -> set[str]:
    """The tables a manifest's bytes name (its source tables and file lists), without
    parsing a VERSION 1 manifest's file entries."""
    return {m.decode() for m in _TABLE.findall(text)}


def keep_previous(output: Path, previous: IndexManifest | None, fingerprint: str) -> Path | None:
    """Copy the manifest a build is about to replace to history/ (temporary name, then
    rename); the path written, or None when there was nothing to keep (no previous index,
    the same index again, or a copy already there)."""
    if previous is None or previous.fingerprint == fingerprint:
        return None
    name = history_name(previous.fingerprint)
    target = output / name
    if not name or target.is_file():
        return None
    target.parent.mkdir(exist_ok=True)
    with atomic_path(target) as tmp:
        shutil.copyfile(output / MANIFEST, tmp)
    return target


def prune(kept: list[tuple[str, int]]) -> tuple[list[str], list[str]]:
    """(retained, dropped) names of history manifests given with their modification times:
    the newest HISTORY_KEEP are retained (ties by name)."""
    order = sorted(kept, key=lambda k: (-k[1], k[0]))
    return [n for n, _ in order[:HISTORY_KEEP]], [n for n, _ in order[HISTORY_KEEP:]]


def prune_local(output: Path, live: set[str]) -> tuple[set[str], set[str]]:
    """Remove the history manifests beyond the newest HISTORY_KEEP of the index `output`;
    returns (tables only the removed ones named, tables the retained ones name), the latter
    read only when the former holds one not in `live`."""
    folder = output / HISTORY
    if not folder.is_dir():
        return set(), set()
    found = [
        (p.name, p.stat().st_mtime_ns)
        for p in folder.iterdir()
        if p.suffix == ".json" and not is_temp(p)
    ]
    retained, dropped = prune(found)
    gone: set[str] = set()
    for name in dropped:
        gone |= manifest_tables((folder / name).read_bytes())
        (folder / name).unlink()
    named: set[str] = set()
    if gone - live:
        for name in retained:
            named |= manifest_tables((folder / name).read_bytes())
    return gone, named
