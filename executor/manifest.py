"""The index manifest (`manifest.json`): format version, sources, files and fingerprints.

JSON and stdlib only, so the executor can check an index without the planner.

The manifest is the index's commit point: tables it does not name are not part of the index.
The layout is specified in docs/index-format.md.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mds.executor.errors import IndexFormatError

__all__ = [
    "FORMAT",
    "MANIFEST",
    "VERSION",
    "IndexManifest",
    "index_fingerprint",
    "read_manifest",
    "table_checksum",
]

FORMAT = "mds-index"
VERSION = 1
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class IndexManifest:
    """A parsed, version-checked manifest plus the directory it came from."""

    path: Path
    data: dict[str, Any]

    @property
    def sources(self) -> list[dict[str, Any]]:
        return self.data["sources"]

    @property
    def fingerprint(self) -> str:
        return self.data["fingerprint"]

    def source(self, name: str) -> dict[str, Any]:
        for entry in self.sources:
            if entry["name"] == name:
                return entry
        known = ", ".join(s["name"] for s in self.sources)
        raise IndexFormatError(f"{self.path}: no source named {name!r}; the index has {known}")


def table_checksum(path: Path) -> str:
    """ "blake2b:<hex>" of an index table file, read in pieces (the manifest's `table_checksum`)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while piece := f.read(8 << 20):
            h.update(piece)
    return "blake2b:" + h.hexdigest()


def index_fingerprint(sources: list[dict[str, Any]]) -> str:
    """Identity of an index's content: its tables' checksums and its files' fingerprints."""
    ident = [
        [s["name"], s["table_checksum"], [[f["path"], f["fingerprint"]] for f in s["files"]]]
        for s in sources
    ]
    blob = json.dumps(ident, separators=(",", ":"), sort_keys=True).encode()
    return "blake2b:" + hashlib.blake2b(blob, digest_size=16).hexdigest()


def _check(data: Any, where: Path) -> None:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise IndexFormatError(f"{where}: not an mds index manifest")
    version = data.get("version")
    if not isinstance(version, int):
        raise IndexFormatError(f"{where}: manifest has no integer `version`")
    if version > VERSION:
        raise IndexFormatError(
            f"{where}: index format version {version} is newer than this mds supports "
            f"({VERSION}); upgrade mds"
        )
    if version < 1:
        raise IndexFormatError(f"{where}: invalid index format version {version}")
    sources = data.get("sources")
    if not isinstance(sources, list) or not all(isinstance(s, dict) for s in sources):
        raise IndexFormatError(f"{where}: manifest `sources` must be a list of objects")
    for i, entry in enumerate(sources):
        for key, kind in (
            ("name", str),
            ("table", str),
            ("table_checksum", str),
            ("files", list),
            ("rows", int),
        ):
            if not isinstance(entry.get(key), kind):
                raise IndexFormatError(
                    f"{where}: sources[{i}].{key} is missing or not a {kind.__name__}"
                )
        table = Path(entry["table"])
        if table.is_absolute() or ".." in table.parts:
            raise IndexFormatError(
                f"{where}: sources[{i}].table {entry['table']!r} leaves the index directory"
            )
    if not isinstance(data.get("fingerprint"), str):
        raise IndexFormatError(f"{where}: manifest has no `fingerprint`")


def read_manifest(directory: str | Path) -> IndexManifest:
    """Load and validate `directory/manifest.json`."""
    directory = Path(directory)
    where = directory / MANIFEST
    try:
        data = json.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise IndexFormatError(
            f"{directory}: not an mds index (no {MANIFEST}); run `mds index`"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise IndexFormatError(f"{where}: unreadable manifest ({exc})") from None
    _check(data, where)
    return IndexManifest(directory, data)
