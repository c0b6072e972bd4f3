"""src/mds/planner/index/publish.py: tables named by their content, rolled back on failure,
the manifest's file entries, and the removal of only the tables mds wrote and no longer
names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
from builders import data_file

from mds.planner.index.publish import TableWriter, collect_garbage, file_entries, file_entry_texts
from mds.planner.index.reuse import IndexedFile
from mds.planner.index.tables import TABLES, manifest_chunks, read_table


def test_a_table_is_named_by_its_content_and_rolled_back_if_new(tmp_path: Path):
    frame = pl.DataFrame({"file_id": [0, 0], "n_tokens": [3, 4]})
    writer = TableWriter(tmp_path, keep=set())
    rel, checksum = writer.write_table("web", frame)
    assert rel == f"{TABLES}/web-{checksum.removeprefix('blake2b:')[:16]}.parquet"
    assert read_table(tmp_path / rel, checksum).equals(frame)
    assert [p.name for p in (tmp_path / TABLES).iterdir()] == [Path(rel).name]  # no temporary
    kept = TableWriter(tmp_path, keep={rel})  # the previous index names it
    assert kept.write_table("web", frame) == (rel, checksum)
    kept.rollback()
    assert (tmp_path / rel).exists()
    writer.rollback()
    assert not (tmp_path / rel).exists()


def test_file_entries_number_the_files_and_record_their_rows(tmp_path: Path):
    (tmp_path / "a.jsonl").write_bytes(b"x")
    (tmp_path / "b.jsonl").write_bytes(b"y")
    files = [
        IndexedFile(data_file(tmp_path / name), 1, 7, f"sampled:{name}", 1)
        for name in ("a.jsonl", "b.jsonl")
    ]
    got = list(file_entries(files, np.array([0, 2]), np.array([2, 3]), np.array([10, 0]), tmp_path))
    assert got == [
        {"id": 0, "path": "a.jsonl", "size": 1, "mtime_ns": 7, "fingerprint": "sampled:a.jsonl",
         "first_row": 0, "rows": 2, "tokens": 10},
        {"id": 1, "path": "b.jsonl", "size": 1, "mtime_ns": 7, "fingerprint": "sampled:b.jsonl",
         "first_row": 2, "rows": 3, "tokens": 0},
    ]  # fmt: skip


def test_file_entry_texts_write_what_file_entries_do(tmp_path: Path):
    """The entries given as text (a companion's as a dict) write the same manifest bytes."""
    names = ("a.jsonl", 'q "ü" %s\\.jsonl', "m.bin")
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "m.idx").write_bytes(b"i")
    files = [
        IndexedFile(
            data_file(tmp_path / name),
            2**40 + i,
            1_700_000_000_000_000_000 + i,
            f"sampled:{i}",
            1,
        )
        for i, name in enumerate(names)
    ]
    counts = (files, np.array([0, 2, 5]), np.array([2, 3, 0]), np.array([10, 0, 2**33]), tmp_path)
    manifest = {"format": "mds-index", "sources": [{"name": "a"}]}
    texts = list(file_entry_texts(*counts))
    assert [type(t) for t in texts] == [str, str, dict]
    assert "".join(manifest_chunks(manifest, [texts])) == "".join(
        manifest_chunks(manifest, [file_entries(*counts)])
    )


def test_garbage_is_only_what_mds_wrote_and_no_longer_names(tmp_path: Path):
    tables = tmp_path / TABLES
    tables.mkdir()
    for name in (
        "live.parquet",
        "stale.parquet",
        "theirs.parquet",
        ".x.parquet.tmp-1-abcdef-01234567",
    ):
        (tables / name).write_bytes(b"")
    collect_garbage(tmp_path, {f"{TABLES}/live.parquet"}, {f"{TABLES}/stale.parquet"})
    assert sorted(p.name for p in tables.iterdir()) == ["live.parquet", "theirs.parquet"]
