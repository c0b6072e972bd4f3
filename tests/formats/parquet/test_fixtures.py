"""Parquet files written by DuckDB, Polars and pyarrow with its less usual options
(fixtures/, made by fixtures/generate.py) are read as pyarrow reads them, bit for bit: the
indexer's list lengths from levels, the executor's rows read from pages (dtype included),
and a whole index, plan and replay of them. Where our readers do not take a file they
decline, and pyarrow (or Polars) decodes it; which files those are is pinned here, so a
change in what they take shows."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from executor_builders import Oracle
from plan_builders import index_data, plan_config

from mds.core.planfile_reader import PlanReader
from mds.executor import PlanExecutor
from mds.executor.readers import parquet as parquet_reader
from mds.formats.parquet import levels, pages

FIXTURES = Path(__file__).resolve().with_name("fixtures")
ENTRIES = json.loads((FIXTURES / "fixtures.json").read_text())
IDS = [e["file"].removesuffix(".parquet") for e in ENTRIES]
COLUMN = "tokens"

# What our readers leave to pyarrow, and why. DuckDB (2.0.1) ends a page's repetition
# levels with a bit-packed run of 32 groups padded far past the page's values, where the
# level reader takes at most one group of padding; and it annotates the ids as
# Int(32 or 64, signed), where the page reader takes only unannotated INT32/INT64.
LEVELS_DECLINE = {
    "duckdb-default",
    "duckdb-zstd-small-groups",
    "duckdb-v2",
    "duckdb-uncompressed-int64",
    "duckdb-lz4-raw",
    "duckdb-brotli-nulls",
}
NO_PAGE_LAYOUT = {name for name in IDS if name.startswith("duckdb-")}
# Every page holds an empty or null list (definition levels below the maximum).
PAGES_DECLINE = {"pyarrow-empty-lists", "pyarrow-nulls"}


def _decoded(path: Path) -> pa.ChunkedArray:
    return pq.read_table(path, columns=[COLUMN])[COLUMN]


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_level_lengths_are_pyarrow_list_lengths(entry, monkeypatch):
    path = FIXTURES / entry["file"]
    want = pc.fill_null(pc.list_value_length(_decoded(path)), -1).to_numpy().astype(np.int64)
    got = levels.list_lengths(path, COLUMN)
    if entry["file"].removesuffix(".parquet") in LEVELS_DECLINE:
        assert got is None
    else:
        assert got is not None and got.dtype == np.int64
        assert np.array_equal(got, want)
    for setting in ("off", "check"):  # never an error, and pyarrow's lengths where given
        monkeypatch.setenv("MDS_PAGE_READS", setting)
        got = levels.lengths(path, COLUMN)
        assert got is None or np.array_equal(got, want)


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_rows_read_from_pages_are_pyarrow_rows(entry, monkeypatch):
    """Several random subsets of each row group's rows (those with values: a plan asks for
    no empty or null row), read from pages, against pyarrow's decode; and through the
    check setting, which compares them itself."""
    name = entry["file"].removesuffix(".parquet")
    path = FIXTURES / entry["file"]
    column = _decoded(path)
    meta = pq.read_metadata(path)
    lay = pages.layout(meta, COLUMN, column.type.value_type)
    if name in NO_PAGE_LAYOUT:
        assert lay is None
        return
    assert lay is not None
    monkeypatch.setenv("MDS_PAGE_READS", "on")
    rng = np.random.default_rng(len(name))
    taken = declined = 0
    first = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            lists = column.slice(first, n).combine_chunks()
            lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy().astype(np.int64)
            starts = np.cumsum(lengths) - lengths
            rows = np.flatnonzero(lengths > 0)
            for _ in range(4 if len(rows) else 0):
                ask = rng.choice(rows, min(len(rows), int(rng.integers(1, 12))), replace=False)
                got = pages.read_rows(fd, lay, g, starts[ask], lengths[ask])
                if got is None:
                    declined += 1
                    continue
                taken += 1
                for r, v in zip(ask.tolist(), got, strict=True):
                    want = lists[r].values.to_numpy()
                    assert v.dtype == want.dtype and np.array_equal(v, want), (g, r)
                monkeypatch.setenv("MDS_PAGE_READS", "check")
                checked = pages.fetch_rows(fd, lay, g, ask + first, starts[ask], lengths[ask], name)
                monkeypatch.setenv("MDS_PAGE_READS", "on")
                assert checked is not None
            first += n
    finally:
        os.close(fd)
    if name in PAGES_DECLINE:
        assert declined and not taken
    else:
        assert taken and not declined


@pytest.mark.parametrize("setting", ["on", "check"])
def test_index_plan_and_replay_give_pyarrow_tokens(tmp_path, monkeypatch, setting):
    """Every fixture without null lists or ids (the index refuses those) as a source of one
    config: indexed (lengths from levels where they are read), planned, and replayed by
    every rank with each row group read from its pages wherever the page reader takes it;
    each sample's tokens are pyarrow's. With `check`, the index and the reads also compare
    themselves with pyarrow."""
    monkeypatch.setenv("MDS_PAGE_READS", setting)
    root = tmp_path / "data"
    usable = [e for e in ENTRIES if not e["null_lists"] and not e["null_ids"]]
    sources = []
    for entry in usable:
        name = entry["file"].removesuffix(".parquet")
        (root / name).mkdir(parents=True)
        shutil.copy(FIXTURES / entry["file"], root / name / entry["file"])
        sources.append({"name": name, "path": f"{name}/*.parquet", "tokens": COLUMN, "weight": 1})
    data = {
        "index": {"output": "index"},
        "source": sources,
        "train": {
            "steps": 12,
            "dp_size": 2,
            "micro_batches": 2,
            "samples_per_step": 96,
            "max_tokens_per_micro_batch": 1 << 16,
            "seed": 11,
        },
    }
    index = index_data(root, data)
    plan = tmp_path / "plan.mds"
    from mds.planner.plan.build import build_plan

    build_plan(plan_config(root, data), plan)
    # every row asked is read from its group's pages, not decoded with the whole group
    monkeypatch.setattr(parquet_reader, "_SPARSE", 1)
    monkeypatch.setattr(parquet_reader, "_PAGED_READS", 1 << 30)
    paged = []
    real = pages.read_rows

    def counted(*args):
        got = real(*args)
        paged.append(got is not None)
        return got

    monkeypatch.setattr(pages, "read_rows", counted)
    oracle = Oracle(index)
    samples = 0
    with PlanReader(plan) as reader:
        names = [s["name"] for s in reader.footer["index"]["sources"]]
        for rank in range(reader.dp):
            with PlanExecutor(plan, rank) as ex:
                for batch in ex:
                    cu = batch["cu_seqlens"].numpy()
                    ids = batch["input_ids"].numpy()
                    pairs = zip(batch["source"].tolist(), batch["row"].tolist(), strict=True)
                    for k, (s, r) in enumerate(pairs):
                        want = oracle.tokens(names[s], r)
                        assert np.array_equal(ids[cu[k] : cu[k + 1]], want), (names[s], r)
                        samples += 1
    assert samples == 12 * 96
    assert sum(paged) > 100  # most reads came from pages
