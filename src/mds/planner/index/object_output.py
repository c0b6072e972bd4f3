"""An index written under an object-store prefix: what the prefix held before the build
(one listing), the refusal of a prefix that is or holds the data root, the previous index
copied into the local build directory so its rows are reused, the upload (new tables
first, the manifest last, then the tables only the old manifest named removed), and what
an interrupt left there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from mds.core import commit, storage
from mds.core.index_manifest import bytes_checksum
from mds.errors import ConfigError, IndexFormatError, Interrupted
from mds.planner.index.config import IndexConfig
from mds.planner.index.discover import MANIFEST_HEAD, is_index_manifest
from mds.planner.index.history import HISTORY, manifest_tables, prune
from mds.planner.index.objects import head, relative_key
from mds.planner.index.reuse import not_an_index
from mds.planner.index.tables import MANIFEST, TABLES, index_tables, read_manifest
from mds.planner.runtime import upload

__all__ = [
    "Prefix",
    "check_object_output",
    "index_left",
    "previous_objects",
    "seed_previous",
    "tables_left",
    "upload_index",
]

# The name of a table mds writes: sources/<source>-<16 hex digits of its checksum>.parquet
# (a file list: sources/<source>-files-<16 hex>.parquet).
TABLE_NAME = re.compile(rf"{TABLES}/[^/]+-[0-9a-f]{{16}}\.parquet")


@dataclass
class Prefix:
    """What an index prefix held before a build wrote anything (one listing)."""

    named: set[str]  # tables (and file lists) its manifest names: the only objects a
    # re-index may remove
    present: set[str]  # table objects there, named or not (temporaries aside)
    had_index: bool  # a manifest.json of ours was there
    manifest: bytes | None = None  # its bytes, when they parse as an index this mds reads
    history: list[tuple[str, int]] = field(default_factory=list)  # (key, mtime_ns) of history/


def previous_objects(url: str) -> Prefix:
    """What the prefix `url` holds, read before anything is written. The rule of `previous_index`
    for a directory: a prefix holding anything but an mds index (or tables without a
    manifest, left by a failed run) is refused; a damaged mds manifest is rebuilt from
    scratch, removing nothing."""
    import tempfile

    from mds.planner.runtime.object_lock import lock_url

    own_lock = relative_key(lock_url(url), url)  # inside the prefix for a whole bucket
    infos = [(key, mtime) for key, _size, mtime in storage.list_object_infos(url)]
    keys = [key for key, _mtime in infos if key != own_lock]
    present = {k for k in keys if k.startswith(f"{TABLES}/") and not commit.is_temp_name(k)}
    history = [
        (k, m)
        for k, m in infos
        if k.startswith(f"{HISTORY}/") and k.endswith(".json") and not commit.is_temp_name(k)
    ]
    manifest_url = f"{url}/{MANIFEST}"
    if MANIFEST not in keys:
        if any(
            k.split("/", 1)[0] not in (TABLES, HISTORY) and not commit.is_temp_name(k)
            for k in keys
        ):
            raise not_an_index(url)
        return Prefix(set(), present, False, history=history)
    if not is_index_manifest(head(manifest_url, MANIFEST_HEAD)):
        raise not_an_index(url)
    data = storage.get_bytes(manifest_url)
    with tempfile.TemporaryDirectory(prefix="mds-index-") as tmp:
        (Path(tmp) / MANIFEST).write_bytes(data)
        try:
            previous = read_manifest(tmp)
        except IndexFormatError as exc:
            if "newer" in str(exc):
                raise IndexFormatError(
                    str(exc).replace(str(Path(tmp) / MANIFEST), manifest_url)
                ) from None
            return Prefix(set(), present, True, history=history)
    named = {t for t in index_tables(previous) if TABLE_NAME.fullmatch(t)}
    return Prefix(named, present, True, data, history)


def seed_previous(local: Path, url: str, previous: Prefix) -> dict[str, str]:
    """Copy the index in place at `url` into the empty build directory `local`: its
    manifest, then each table it names that arrives with the bytes its checksum records (a
    damaged or missing one is left out: its files are rescanned). The build then reuses
    their rows as in a directory. Returns {table: checksum} of the tables copied: the ones
    already in place, whole, that the upload need not send again."""
    if previous.manifest is None:
        return {}
    local.mkdir(parents=True)
    (local / MANIFEST).write_bytes(previous.manifest)
    kept: dict[str, str] = {}
    for rel, checksum in index_tables(read_manifest(local)).items():
        if rel not in previous.named or rel not in previous.present or rel in kept:
            continue
        data = storage.get_bytes(f"{url}/{rel}")
        if bytes_checksum(data) != checksum:
            continue
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(data)
        kept[rel] = checksum
    return kept


def check_object_output(config: IndexConfig, url: str) -> None:
    """Refuse an index prefix that is, or holds, the data root (as check_output refuses such
    a directory): its cleanup and its tables would share the prefix with the sources."""
    root = str(config.root)
    if not storage.is_url(root):
        return
    where = relative_key(root, url)
    if where == "":
        raise ConfigError(f"-o {url} is the data root {root}; choose another output")
    if where is not None:
        raise ConfigError(f"-o {url} holds the data root {root}; choose another output")


def upload_index(
    local: Path, url: str, previous: Prefix, held, kept: dict[str, str] | None = None
) -> None:
    """Upload the index in the directory `local` under the prefix `url`: the tables first
    (named by their content, so a table of the index in place is never changed; one in
    `kept`, {table: checksum} copied whole from the prefix, is not sent again), then the
    manifest it replaces under history/ (the build kept it in `local`), the manifest last,
    each one object (upload.put_file: never a partial one). Readers see the old manifest
    or the new one, and a failed or interrupted upload leaves the old index valid; an
    interrupt says what it left (Interrupted). Then the history manifests beyond the newest
    HISTORY_KEEP are removed, and the tables only they named: nothing else under the
    prefix, which mds did not write. `previous`: what the prefix held before the build;
    `held`: its lock object, checked before the manifest is written and before anything
    is removed."""
    manifest = read_manifest(local)
    checksums = index_tables(manifest)
    live = set(checksums)
    kept = kept or {}
    mark = len(commit.written())  # what this build puts in place is noted after it
    there = {k for k, _ in previous.history}
    added = sorted(
        f"{HISTORY}/{p.name}"
        for p in (local / HISTORY).glob("*.json")
        if f"{HISTORY}/{p.name}" not in there and not commit.is_temp_name(p.name)
    )
    # the previous manifest's tables stay: history/ keeps it (the build copied it there)
    saved = set(previous.named)
    stale: list[str] = []
    try:
        for rel in sorted(live):
            if kept.get(rel) != checksums[rel]:
                upload.put_file(local / rel, f"{url}/{rel}")
        for rel in added:
            upload.put_file(local / rel, f"{url}/{rel}")
        held.check()
        upload.put_file(local / MANIFEST, f"{url}/{MANIFEST}")
        held.check()
        newest = max((m for _, m in previous.history), default=0) + 1
        retained, dropped = prune([*previous.history, *((k, newest) for k in added)])
        gone: set[str] = set()
        for rel in dropped:
            gone |= manifest_tables(storage.get_bytes(f"{url}/{rel}"))
        if gone - live - saved:
            for rel in retained:
                saved = saved | manifest_tables(storage.get_bytes(f"{url}/{rel}"))
        stale = sorted(
            set(stale) | {t for t in gone - live - saved if TABLE_NAME.fullmatch(t)}
        )
        for rel in dropped:
            storage.delete(f"{url}/{rel}")
        while stale:
            storage.delete(f"{url}/{stale[0]}")
            stale.pop(0)
    except KeyboardInterrupt:
        done = set(commit.written()[mark:])
        if f"{url}/{MANIFEST}" in done:
            raise Interrupted(index_left(url, len(stale))) from None
        new = {rel for rel in live if f"{url}/{rel}" in done} - previous.present
        raise Interrupted(tables_left(url, previous.had_index, new)) from None


def tables_left(url: str, had_index: bool, new: set[str]) -> str:
    """What an interrupt before the new manifest's commit left at `url`."""
    state = (
        f"the previous index at {url} is intact"
        if had_index
        else f"no index was written at {url} (no {MANIFEST})"
    )
    if not new:
        return state
    named = " it does not name" if had_index else ""
    return f"{state}; {_were_left(len(new), 'new table object', named)} under {url}/{TABLES}/"


def index_left(url: str, stale: int) -> str:
    """What an interrupt after the new manifest's commit left at `url`."""
    state = f"the new index was written whole at {url}"
    if not stale:
        return state
    left = _were_left(stale, "table object", " it no longer names")
    return f"{state}; {left} under {url}/{TABLES}/"


def _were_left(n: int, what: str, which: str = "") -> str:
    return f"{n} {what}{'s' * (n != 1)}{which} {'was' if n == 1 else 'were'} left"
