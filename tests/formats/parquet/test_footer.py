"""Column chunks located from the footer: their spans hold exactly their pages (a
dictionary's first), codecs map to pyarrow's names, leaves are found by top-level column,
and the footer's start is where the last chunk ends."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mds.formats.parquet import footer
from mds.formats.parquet.thrift import DICTIONARY_PAGE, field_int, page_fields


def _write(tmp_path, **writer):
    table = pa.table(
        {
            "id": pa.array(range(500)),
            "t": pa.array([[i, i + 1, i % 3] for i in range(500)], pa.list_(pa.int32())),
            "s": pa.array([{"a": [1], "b": 2}] * 500),
        }
    )
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, row_group_size=200, **writer)
    return path, pq.read_metadata(path)


@pytest.mark.parametrize("dictionary", [True, False])
def test_chunks_span_their_pages(tmp_path, dictionary):
    path, meta = _write(tmp_path, use_dictionary=dictionary, data_page_size=256)
    data = path.read_bytes()
    leaf = footer.leaves(meta, "t")[0]
    end = 0
    for g in range(meta.num_row_groups):
        chunk = footer.chunk(meta, g, leaf)
        assert chunk is not None
        assert (chunk.row_group, chunk.num_rows) == (g, meta.row_group(g).num_rows)
        assert chunk.num_values == meta.row_group(g).column(leaf).num_values
        assert chunk.codec == "snappy"
        fields, _size = page_fields(memoryview(data), chunk.start)
        assert (field_int(fields, 1) == DICTIONARY_PAGE) == dictionary
        span = footer.chunk_span(meta.row_group(g).column(leaf))
        assert span == (chunk.start, chunk.start + chunk.size)
        end = max(end, chunk.start + chunk.size)
    with open(path, "rb") as fh:
        assert footer.data_end(fh.fileno()) >= end
        assert footer.data_end(fh.fileno()) == len(data) - 8 - meta.serialized_size


def test_leaves_of_a_top_level_column(tmp_path):
    _path, meta = _write(tmp_path)
    names = [meta.schema.column(j).path for j in range(meta.num_columns)]
    assert [names[j] for j in footer.leaves(meta, "t")] == ["t.list.element"]
    assert [names[j] for j in footer.leaves(meta, "s")] == ["s.a.list.element", "s.b"]
    assert footer.leaves(meta, "missing") == []


@pytest.mark.parametrize(
    ("compression", "codec"),
    [("none", None), ("snappy", "snappy"), ("gzip", "gzip"), ("zstd", "zstd")]
    + [("brotli", "brotli"), ("lz4", "lz4_raw")],
)
def test_codecs_as_pyarrow_names_them(tmp_path, compression, codec):
    _path, meta = _write(tmp_path, compression=compression)
    chunk = footer.chunk(meta, 0, footer.leaves(meta, "t")[0])
    assert chunk is not None and chunk.codec == codec
    data = b"some bytes " * 50
    if codec is not None:
        packed = pa.compress(data, codec=codec, asbytes=True)
        assert pa.decompress(packed, len(data), codec=codec).to_pybytes() == data


def test_a_file_that_does_not_end_as_parquet(tmp_path):
    path = tmp_path / "x.parquet"
    for content in (b"", b"PAR1", b"x" * 100):
        path.write_bytes(content)
        fd = os.open(path, os.O_RDONLY)
        try:
            assert footer.data_end(fd) is None
        finally:
            os.close(fd)


def test_a_chunk_in_another_file_is_not_read_here(tmp_path):
    _path, meta = _write(tmp_path)
    leaf = footer.leaves(meta, "t")[0]
    assert footer.chunk(meta, 0, leaf) is not None
    meta.set_file_path("elsewhere.parquet")
    assert footer.chunk(meta, 0, leaf) is None
