"""SampleContents reads a block's samples as the executor does and hashes them: the same
hash for the same ids stored as int32 or int64, only the files of the samples asked for."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from catalog_helpers import plan_of

from mds.core.content_hash import hash_tokens
from mds.core.planfile_reader import PlanReader
from mds.executor.catalog.contents import SampleContents, subset


def test_int32_and_int64_files_hash_alike(tmp_path):
    rng = np.random.default_rng(5)
    rows = [rng.integers(0, 30000, int(n)).tolist() for n in rng.integers(2, 30, 24)]
    (tmp_path / "d").mkdir()
    for name, kind in (("narrow", pa.int32()), ("wide", pa.int64())):
        table = pa.table({"t": pa.array(rows, type=pa.list_(kind))})
        pq.write_table(table, tmp_path / "d" / f"{name}.parquet", row_group_size=10)
    sources = [
        {"name": name, "path": f"d/{name}.parquet", "tokens": "t", "weight": 1}
        for name in ("narrow", "wide")
    ]
    _index, plan = plan_of(tmp_path, sources, steps=6, samples_per_step=8)
    by_row = {"narrow": {}, "wide": {}}
    with PlanReader(plan) as reader, SampleContents(reader.footer, plan) as contents:
        bases = {s["name"]: s["base"] for s in reader.footer["index"]["sources"]}
        for chunk in range(len(reader.chunks)):
            for rank in range(reader.dp):
                block = reader.rank_chunk(chunk, rank)
                hashes = contents.hashes(block)
                for gid, h in zip(block.ids.tolist(), hashes, strict=True):
                    name = "wide" if gid >= bases["wide"] else "narrow"
                    by_row[name][gid - bases[name]] = h
    assert by_row["narrow"] and by_row["wide"]
    for name, hashes in by_row.items():
        for row, h in hashes.items():
            assert h == hash_tokens(rows[row]), (name, row)
    same = set(by_row["narrow"]) & set(by_row["wide"])
    assert all(by_row["narrow"][r] == by_row["wide"][r] for r in same)


def test_subset_reads_only_its_files(many_files, monkeypatch):
    """A subset of a block opens the files of its samples, none of the block's others."""
    from mds.executor.catalog.open_files import OpenFiles

    opened = []
    acquire = OpenFiles.acquire

    def spy(self, s, fid, entry):
        opened.append(entry["path"])
        return acquire(self, s, fid, entry)

    monkeypatch.setattr(OpenFiles, "acquire", spy)
    with PlanReader(many_files) as reader, SampleContents(reader.footer, many_files) as contents:
        block = reader.rank_chunk(0, 0)
        files = {block.fetch.files[f][2]["path"] for f in block.fetch.file}
        assert len(files) > 2
        pick = np.array([0, 3])
        part = subset(block, pick)
        assert part.ids.tolist() == block.ids[pick].tolist()
        payloads = contents.payloads(part)
    assert len(payloads) == 2
    assert set(opened) == {block.fetch.files[f][2]["path"] for f in block.fetch.file[pick]}
