"""Index table bytes as the executor and planner read them: checked in the same read."""

from __future__ import annotations

from pathlib import Path

import pytest

from mds.core.index_manifest import (
    IndexManifest,
    identity_fingerprint,
    index_fingerprint,
    index_sources,
    read_table_bytes,
    table_checksum,
)
from mds.errors import IndexFormatError


def test_read_table_bytes_returns_the_bytes_it_checked(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    path.write_bytes(b"PAR1 table bytes PAR1")
    assert read_table_bytes(path, table_checksum(path)) == b"PAR1 table bytes PAR1"


def test_read_table_bytes_refuses_other_bytes(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    path.write_bytes(b"PAR1 table bytes PAR1")
    recorded = table_checksum(path)
    path.write_bytes(b"PAR1 table byteZ PAR1")
    with pytest.raises(IndexFormatError) as info:
        read_table_bytes(path, recorded)
    assert str(info.value) == (
        f"{path}: checksum {table_checksum(path)} differs from the manifest's {recorded}; "
        "the index is damaged: re-run `mds index` to rebuild the table from its sources, "
        "or delete the index"
    )


def test_read_table_bytes_of_a_missing_table(tmp_path: Path) -> None:
    with pytest.raises(IndexFormatError, match="gone.parquet: cannot read index table"):
        read_table_bytes(tmp_path / "gone.parquet", "blake2b:00")


def test_index_sources_give_each_source_its_global_id_range() -> None:
    manifest = IndexManifest(
        Path("idx"),
        {
            "sources": [
                {"name": "a", "rows": 3, "table_checksum": "x", "format": "jsonl"},
                {"name": "b", "rows": 5, "table_checksum": "y"},
            ]
        },
    )
    assert index_sources(manifest) == [
        {"name": "a", "base": 0, "rows": 3, "table_checksum": "x"},
        {"name": "b", "base": 3, "rows": 5, "table_checksum": "y"},
    ]


def test_identity_fingerprint_is_the_index_fingerprint_of_the_same_files() -> None:
    files = [("a/ü.jsonl", "sampled:01"), ('b "q".jsonl', "full:02")]
    sources = [
        {"name": "web", "table_checksum": "blake2b:aa", "rows": 3,
         "files": [{"path": p, "fingerprint": f, "id": i} for i, (p, f) in enumerate(files)]},
        {"name": "empty", "table_checksum": "blake2b:bb", "files": []},
    ]  # fmt: skip
    ident = [("web", "blake2b:aa", files), ("empty", "blake2b:bb", [])]
    assert identity_fingerprint(ident) == index_fingerprint(sources)
    assert identity_fingerprint(ident[:1]) != index_fingerprint(sources)
