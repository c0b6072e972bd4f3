"""src/mds/planner/index/publish.py: tables named by their content, rolled back on failure,
each source's file list, and the removal of only the tables mds wrote and no longer
names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
from builders import data_file

from mds.core.index_manifest import FILE_COLUMNS, file_dicts, file_list_bytes
from mds.planner.index.publish import TableWriter, collect_garbage, file_list
from mds.planner.index.reuse import IndexedFile
from mds.planner.index.tables import TABLES, read_table


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


def test_file_list_numbers_the_files_and_records_their_rows(tmp_path: Path):
    (tmp_path / "a.jsonl").write_bytes(b"x")
    (tmp_path / "b.jsonl").write_bytes(b"y")
    files = [
        IndexedFile(data_file(tmp_path / name), 1, 7, f"sampled:{name}", 1)
        for name in ("a.jsonl", "b.jsonl")
    ]
    got = file_list(files, np.array([0, 2]), np.array([2, 3]), np.array([10, 0]), tmp_path)
    assert got.column_names == list(FILE_COLUMNS)
    assert file_dicts(got) == [
        {"id": 0, "path": "a.jsonl", "size": 1, "mtime_ns": 7, "fingerprint": "sampled:a.jsonl",
         "first_row": 0, "rows": 2, "tokens": 10},
        {"id": 1, "path": "b.jsonl", "size": 1, "mtime_ns": 7, "fingerprint": "sampled:b.jsonl",
         "first_row": 2, "rows": 3, "tokens": 0},
    ]  # fmt: skip
    dropped = file_list(files, np.array([0, 2]), np.array([2, 3]), np.array([10, 0]), tmp_path,
                        np.array([1, 0]))  # fmt: skip
    assert [f["dropped_bad_images"] for f in file_dicts(dropped)] == [1, 0]


def test_a_file_list_is_named_by_its_content_and_rolled_back_if_new(tmp_path: Path):
    (tmp_path / "a.jsonl").write_bytes(b"x")
    files = [IndexedFile(data_file(tmp_path / "a.jsonl"), 1, 7, "sampled:a", 1)]
    table = file_list(files, np.array([0]), np.array([2]), np.array([10]), tmp_path)
    writer = TableWriter(tmp_path, keep=set())
    rel, checksum = writer.write_file_list("web", table)
    assert rel == f"{TABLES}/web-files-{checksum.removeprefix('blake2b:')[:16]}.parquet"
    assert (tmp_path / rel).read_bytes() == file_list_bytes(table)
    assert [p.name for p in (tmp_path / TABLES).iterdir()] == [Path(rel).name]  # no temporary
    kept = TableWriter(tmp_path, keep={rel})
    assert kept.write_file_list("web", table) == (rel, checksum)
    kept.rollback()
    assert (tmp_path / rel).exists()
    writer.rollback()
    assert not (tmp_path / rel).exists()


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
