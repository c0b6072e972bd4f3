"""The planner's manifest writer: the same bytes as json.dumps(indent=2, sort_keys=True)."""

from __future__ import annotations

import json
from pathlib import Path

from mds.planner.index.manifest import manifest_chunks, write_manifest


def _file(i: int, **extra) -> dict:
    return {
        "id": i,
        "path": f"d/f{i}.jsonl",
        "size": 10 + i,
        "mtime_ns": 1_700_000_000_000_000_000 + i,
        "fingerprint": f"sampled:{i:032x}",
        "first_row": 4 * i,
        "rows": 4,
        "tokens": 2**40 + i,
        **extra,
    }


def _manifest() -> tuple[dict, list[list[dict]]]:
    files = [
        [_file(0), _file(1, index_path="d/f1.idx"), _file(2, path='ünï "quoted" \\ \t.jsonl')],
        [],
        [_file(0)],
    ]
    sources = [
        {"name": name, "rows": 1, "keep": {"lang": "String"}, "length_stats": {}, "payload": None}
        for name in ("a", "b\u00e9", "c")
    ]
    manifest = {"format": "mds-index", "version": 1, "root": "/data/ü", "sources": sources}
    return manifest, files


def test_chunks_equal_json_dumps() -> None:
    manifest, files = _manifest()
    full = {
        **manifest,
        "sources": [{**s, "files": f} for s, f in zip(manifest["sources"], files, strict=True)],
    }
    expected = json.dumps(full, indent=2, sort_keys=True) + "\n"
    assert "".join(manifest_chunks(manifest, [iter(f) for f in files])) == expected


def test_write_manifest_writes_the_same_bytes(tmp_path: Path) -> None:
    manifest, files = _manifest()
    full = {
        **manifest,
        "sources": [{**s, "files": f} for s, f in zip(manifest["sources"], files, strict=True)],
    }
    write_manifest(tmp_path / "manifest.json", manifest, [iter(f) for f in files])
    expected = (json.dumps(full, indent=2, sort_keys=True) + "\n").encode()
    assert (tmp_path / "manifest.json").read_bytes() == expected
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]
