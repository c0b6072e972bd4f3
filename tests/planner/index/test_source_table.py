"""src/mds/planner/index/source_table.py: small files scanned in batches give the table a
scan of each file alone gives (its errors too), reused rows fit around rescanned files, the
scan tasks group only what a batch scanner takes, and the length percentiles."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from builders import config_file, data_file, snapshot, source, write_jsonl

from mds.errors import SourceDataError
from mds.planner.index import source_table
from mds.planner.index.build import build_index
from mds.planner.index.config import load_config
from mds.planner.index.reuse import IndexedFile
from mds.planner.index.source_table import PERCENTILES, nearest_ranks, per_file_counts, scan_tasks
from mds.planner.index.tables import read_manifest, source_frame


def _build(root: Path, **kwargs):
    return build_index(load_config(root / "mds.toml"), **kwargs)


def _manifest(index: Path) -> dict:
    return json.loads((index / "manifest.json").read_text())


def _table(index: Path, name: str) -> pl.DataFrame:
    return source_frame(read_manifest(index), name).collect()


def _small_files(root: Path, langs: list) -> None:
    for i, lang in enumerate(langs):
        write_jsonl(root / f"s/f{i}.jsonl", [{"n": 1 + i, "lang": lang}, {"n": 2, "lang": None}])
    config_file(
        root,
        '[index]\noutput = "index"\n\n[[source]]\nname = "s"\npath = "s/*.jsonl"\n'
        'count = "n"\nkeep = ["lang"]\n',
    )


def test_small_files_in_batches_index_as_one_by_one(tmp_path: Path, monkeypatch) -> None:
    _small_files(tmp_path, ["en", None, "fr", "de", None, "en", "xx"])
    monkeypatch.setattr(source_table, "BATCH_FILES", 3)
    _build(tmp_path, output=tmp_path / "batched")
    monkeypatch.setattr(source_table, "BATCH_SCANNERS", {})
    _build(tmp_path, output=tmp_path / "alone")
    batched, alone = _manifest(tmp_path / "batched"), _manifest(tmp_path / "alone")
    assert batched["sources"] == alone["sources"]
    assert _table(tmp_path / "batched", "s").equals(_table(tmp_path / "alone", "s"))


def test_type_drift_between_batches_names_the_files_a_file_scan_would(
    tmp_path: Path, monkeypatch
) -> None:
    # Batches {f0, f1} and {f2, f3}: the first file with a value in each decides its type.
    _small_files(tmp_path, [None, 7, None, "en"])
    monkeypatch.setattr(source_table, "BATCH_FILES", 2)
    with pytest.raises(SourceDataError) as batched:
        _build(tmp_path)
    monkeypatch.setattr(source_table, "BATCH_SCANNERS", {})
    with pytest.raises(SourceDataError) as alone:
        _build(tmp_path)
    assert str(batched.value) == str(alone.value)
    assert str(alone.value).startswith(
        "s/f3.jsonl: column `lang` has type String but Int64 in s/f1"
    )


def test_reindex_reuses_rows_around_rescanned_small_files(tmp_path: Path, monkeypatch) -> None:
    _small_files(tmp_path, ["a", "b", "c", "d", "e", "f"])
    monkeypatch.setattr(source_table, "BATCH_FILES", 2)
    _build(tmp_path)
    write_jsonl(tmp_path / "s/f2.jsonl", [{"n": 9, "lang": "z"}])
    write_jsonl(tmp_path / "s/f2b.jsonl", [{"n": 8, "lang": "y"}])
    (tmp_path / "s/f4.jsonl").unlink()
    summary = _build(tmp_path)
    assert summary.sources[0].files_scanned == 2
    _build(tmp_path, output=tmp_path / "fresh")
    again, fresh = _manifest(tmp_path / "index"), _manifest(tmp_path / "fresh")
    assert again["sources"] == fresh["sources"]
    assert _table(tmp_path / "index", "s").equals(_table(tmp_path / "fresh", "s"))


def test_length_percentiles_are_polars_nearest_ranks() -> None:
    """The manifest's p50/p90/p99 are what `quantile(..., "nearest")` gives (the report's
    numbers), at every length, exact halves of a rank included."""
    rng = np.random.default_rng(7)
    for size in [*range(1, 1202), 4096, 65537]:
        n = pl.Series("n_tokens", rng.integers(0, 50, size), dtype=pl.UInt32)
        expected = [int(n.quantile(p / 100, interpolation="nearest")) for p in PERCENTILES]
        assert nearest_ranks(n) == expected, size


def test_runs_of_small_new_files_make_one_task_and_the_rest_go_alone(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(source_table, "BATCH_FILES", 2)

    def indexed(name: str, nbytes: int, reuse: int | None = None) -> IndexedFile:
        (tmp_path / name).write_bytes(b"")
        return IndexedFile(data_file(tmp_path / name), 0, 0, "fp", nbytes, reuse)

    files = [
        indexed("a.jsonl", 10),
        indexed("b.jsonl", 10),
        indexed("c.jsonl", 10),  # a third small file: BATCH_FILES is 2
        indexed("d.jsonl", 10, reuse=0),  # reused: not scanned, and it ends the run
        indexed("e.jsonl", 10),
        indexed("f.jsonl", 2 << 20),  # too large for a batch
        indexed("g.parquet", 10),  # no batch scanner
    ]
    tasks = scan_tasks(5, files)
    assert [(si, first, [f.data.rel for f in fs]) for si, first, fs in tasks] == [
        (5, 0, ["a.jsonl", "b.jsonl"]),
        (5, 2, ["c.jsonl"]),
        (5, 4, ["e.jsonl"]),
        (5, 5, ["f.jsonl"]),
        (5, 6, ["g.parquet"]),
    ]


def test_rows_and_tokens_per_file():
    table = pl.DataFrame({"file_id": [0, 0, 2, 2, 2], "n_tokens": [1, 2, 3, 4, 5]})
    rows, tokens = per_file_counts(table, 4)
    assert rows.tolist() == [2, 0, 3, 0] and tokens.tolist() == [3, 0, 12, 0]


def _merge_corpus(root: Path, langs: list) -> None:
    """Tiny Parquet files, one per entry of `langs` (its `lang` column: a string, an
    integer, or None for an all-null column of Arrow's null type), and a JSONL source."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "p").mkdir(parents=True)
    for i, lang in enumerate(langs):
        column = pa.nulls(3) if lang is None else pa.array([lang] * 3)
        pq.write_table(pa.table({"n": [1 + i, 2, 3], "lang": column}), root / f"p/f{i:02d}.parquet")
    for i in range(3):
        write_jsonl(root / f"j/{i}.jsonl", [{"n": 4 + i}, {"n": 5}])
    config_file(
        root,
        '[[source]]\nname = "p"\npath = "p/*.parquet"\ncount = "n"\nkeep = ["lang"]\n\n'
        '[[source]]\nname = "j"\npath = "j/*.jsonl"\ncount = "n"\n',
    )


def _small_groups(monkeypatch) -> None:
    """Tasks of at most 5 units (the local pool groups sized units, merge_parts included)."""
    from mds.planner.runtime import engine

    monkeypatch.setattr(engine, "GROUP_ITEMS", 5)


def _ungrouped(monkeypatch) -> None:
    """The local pool runs a unit a task and merges nothing: a part per file scanned."""
    from mds.planner.runtime import engine

    monkeypatch.setattr(engine.LocalEngine, "group_bytes", lambda self: None)


def _tasks(monkeypatch) -> list[list[int]]:
    """Filled with the first file index of each unit of each scan task the pool runs."""
    from mds.planner.runtime import engine

    tasks: list[list[int]] = []
    call_each = engine._call_each

    def recording(fn, units, merge):
        tasks.append([unit[0] for unit in units])
        return call_each(fn, units, merge)

    monkeypatch.setattr(engine, "_call_each", recording)
    return tasks


def test_merged_parts_of_a_grouped_task_give_the_index_of_one_part_per_file(
    tmp_path: Path, monkeypatch
) -> None:
    # a null-typed column between typed ones splits a run; the JSONL units follow in a task
    _merge_corpus(tmp_path, ["en", "de", "fr", None, "en", "de", "xx", "en", None, "fr", "de"])
    with monkeypatch.context() as patched:
        _ungrouped(patched)
        _build(tmp_path, output=tmp_path / "alone", workers=2)
    _small_groups(monkeypatch)
    _build(tmp_path, output=tmp_path / "grouped", workers=2)
    assert snapshot(tmp_path / "grouped") == snapshot(tmp_path / "alone")
    # a re-index scans one changed file between reused ones, in a task of its own
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"n": [9], "lang": ["zz"]}), tmp_path / "p/f05.parquet")
    _build(tmp_path, output=tmp_path / "grouped", workers=2)
    _assert_as_fresh(tmp_path, tmp_path / "grouped", monkeypatch)


def test_a_reindex_of_changed_files_in_runs_gives_the_fresh_index(
    tmp_path: Path, monkeypatch
) -> None:
    """Changed files around reused ones, grouped into tasks: runs of rescanned files merge
    into parts that interleave with the reused rows as a fresh index of one part per file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    langs = ["en", "de", "fr", "en", "de", "xx", "en", "fr", "de", "en", "fr", "de"]
    _merge_corpus(tmp_path, langs)
    _build(tmp_path, workers=1)
    for i in (1, 2, 3, 6, 10, 11):  # runs of three, one and two changed files
        table = pa.table({"n": [i, 1], "lang": ["zz", "zz"]})
        pq.write_table(table, tmp_path / f"p/f{i:02d}.parquet")
    tasks = _tasks(monkeypatch)
    summary = _build(tmp_path, workers=1)
    assert summary.sources[0].files_scanned == 6
    assert tasks == [[1, 2], [3, 6], [10, 11]]  # 6 units, at least 4 tasks a worker
    _assert_as_fresh(tmp_path, tmp_path / "index", monkeypatch)


def _assert_as_fresh(tmp_path: Path, index: Path, monkeypatch) -> None:
    """The index at `index` equals a fresh one of the same files, one scan task per file."""
    with monkeypatch.context() as patched:
        _ungrouped(patched)
        _build(tmp_path, output=tmp_path / "fresh", workers=2)
    assert _manifest(index)["sources"] == _manifest(tmp_path / "fresh")["sources"]
    assert _table(index, "p").equals(_table(tmp_path / "fresh", "p"))


def test_type_drift_inside_a_grouped_task_names_the_files_of_a_local_run(
    tmp_path: Path, monkeypatch
) -> None:
    _merge_corpus(tmp_path, ["en", None, "de", "fr", 7, "en", "de"])
    with monkeypatch.context() as patched:
        _ungrouped(patched)
        with pytest.raises(SourceDataError) as alone:
            _build(tmp_path, workers=2)
    _small_groups(monkeypatch)
    with pytest.raises(SourceDataError) as grouped:
        _build(tmp_path, workers=2)
    assert str(grouped.value) == str(alone.value)
    assert str(alone.value).startswith("p/f04.parquet: column `lang` has type Int64 but String")


def test_a_file_failing_in_the_middle_of_a_grouped_task_is_named(
    tmp_path: Path, monkeypatch
) -> None:
    _merge_corpus(tmp_path, ["en", "de", "fr", "en", "de", "xx", "en", "fr", "de", "en"])
    (tmp_path / "p/f04.parquet").write_bytes(b"not a parquet file")
    with monkeypatch.context() as patched:
        _ungrouped(patched)
        with pytest.raises(SourceDataError) as alone:
            _build(tmp_path, workers=1)
    tasks = _tasks(monkeypatch)
    with pytest.raises(SourceDataError) as grouped:
        _build(tmp_path, workers=1)
    assert str(grouped.value) == str(alone.value)
    assert str(alone.value).startswith("p/f04.parquet: ")
    assert [3, 4, 5] in tasks  # f04 was scanned in the middle of a task (11 units: 3 a task)


def test_merge_parts_folds_runs_of_one_schema_into_their_first_unit() -> None:
    from mds.planner.index.scan import ScanContext
    from mds.planner.index.source_table import Part, merge_parts

    a, b = (ScanContext(source(name=name, count="n")) for name in ("a", "b"))

    def part(first: int, rows: int, dtype=pl.Int64, alone: bool = True) -> Part:
        frame = pl.DataFrame({"x": [1] * rows}).cast({"x": dtype})
        return Part(first, np.array([rows], dtype=np.int64), frame, alone=alone)

    units = [(0, [], a), (1, [], a), (2, [], a), (4, [], a), (5, [], a), (0, [], b), (1, [], b)]
    results = [
        [part(0, 2)],
        [part(1, 1)],
        [part(2, 3, pl.String)],  # another schema
        [part(4, 1)],  # file 3 is not in the task
        [part(5, 2)],
        [part(0, 1)],  # another source
        [part(1, 4, alone=False)],  # a batch part stays as it is
    ]
    merged = merge_parts(units, results)
    shape = [[(p.first, p.rows.tolist(), p.frame.height, p.alone) for p in ps] for ps in merged]
    assert shape == [
        [(0, [2, 1], 3, True)],
        [],
        [(2, [3], 3, True)],
        [(4, [1, 2], 3, True)],
        [],
        [(0, [1], 1, True)],
        [(1, [4], 4, False)],
    ]


def test_parts_of_several_schemas_assemble_in_file_order_as_one_by_one() -> None:
    """assemble puts parts of one schema together before its polars calls: the table is the
    one made part by part (file ids, casts, columns, file order), whatever the parts' column
    order, extra columns and types of a kept column that has no value."""
    from mds.planner.index.source_table import Part, assemble

    spec = source(name="s", count="n", keep=["lang"])
    files = [
        IndexedFile(data_file(Path(f"/r/f{i}.parquet"), Path("/r")), 1, 1, "sampled:x", 1)
        for i in range(7)
    ]

    def part(first: int, rows: list[int], lang, extra: bool = False) -> Part:
        n = sum(rows)
        frame = pl.DataFrame(
            {"n_tokens": list(range(first * 10, first * 10 + n)), "file_row": list(range(n))}
        ).with_columns(pl.Series("lang", [lang] * n))
        frame = frame.with_columns(pl.lit(7).alias("x")) if extra else frame
        return Part(first, np.array(rows, dtype=np.int64), frame)

    parts = [
        part(4, [1, 2], "de", extra=True),  # an extra column: another schema
        part(0, [2], "en"),
        part(2, [0, 3], None),  # no value: a Null column, cast to the kept type
        part(1, [1], "fr"),
        part(6, [2], "en", extra=True),
    ]
    got = assemble(spec, "parquet", files, parts)

    def alone(p: Part) -> pl.DataFrame:  # what assembly did part by part
        ids = np.repeat(np.arange(p.first, p.first + len(p.rows), dtype=np.uint32), p.rows)
        return p.frame.with_columns(
            pl.Series("file_id", ids, dtype=pl.UInt32), pl.col("lang").cast(pl.String)
        ).select(["file_id", "file_row", "n_tokens", "lang"])

    want = pl.concat([alone(p) for p in sorted(parts, key=lambda p: p.first)])
    assert got.equals(want) and got.schema == want.schema
    assert got["file_id"].to_list() == [0, 0, 1, 3, 3, 3, 4, 5, 5, 6, 6]
