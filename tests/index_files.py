"""Index manifests with their file lists in hand, for tests that read or forge them.

Since format VERSION 2 a source's files are a Parquet table beside its source table, named
by the manifest (`files_table`). `manifest_with_files` reads a manifest as JSON with each
source's `files` filled in from that table (the shape a VERSION 1 manifest has);
`write_v1` writes such a dict back as a VERSION 1 manifest, files inline, which every
reader still accepts: the way to forge an index a test damages entry by entry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mds.core.index_manifest import SourceEntry


def with_files(data: dict[str, Any], index: Path | str) -> dict[str, Any]:
    """`data` (a parsed manifest of the index `index`) with every source's `files`."""
    index = Path(index)
    for i, s in enumerate(data["sources"]):
        if "files_table" in s and "files" not in s:
            entry = SourceEntry(s, index, index / "manifest.json")
            data["sources"][i] = {**s, "files": entry["files"]}
    return data


def manifest_with_files(index: Path | str, name: str = "manifest.json") -> dict[str, Any]:
    """The manifest `name` of the index `index`, parsed, each source with its `files`."""
    data = json.loads((Path(index) / name).read_text(encoding="utf-8"))
    return with_files(data, index)


def v1_manifest(data: dict[str, Any], index: Path | str) -> dict[str, Any]:
    """A VERSION 1 manifest of the same index: files inline, no file-list tables."""
    out = with_files(json.loads(json.dumps(data)), index)
    out["version"] = 1
    for s in out["sources"]:
        s.pop("files_table", None)
        s.pop("files_checksum", None)
    return out


def write_v1(index: Path | str, data: dict[str, Any], name: str = "manifest.json") -> None:
    """Write `data` (files inline) as the VERSION 1 manifest `name` of `index`."""
    out = v1_manifest(data, index)
    (Path(index) / name).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
