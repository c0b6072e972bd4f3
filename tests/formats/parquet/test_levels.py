"""Tests for the level-only Parquet list-length reader: agreement with a full pyarrow decode
over writer settings, the files it must decline (None), and truncated files."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from builders import uleb as _uleb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mds.errors import ConfigError, SourceDataError
from mds.formats.parquet import levels as parquet_levels
from mds.formats.parquet.compression import PREFIX_DECODERS
from mds.formats.parquet.levels import list_lengths
from mds.formats.parquet.thrift import Truncated, Unsupported

FAST = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
COMPRESSIONS = ["none", "snappy", "zstd", "gzip", "lz4", "brotli"]
VALUE_TYPES = [pa.int32(), pa.int64(), pa.uint16()]


def oracle(path: Path, column: str = "tokens") -> np.ndarray:
    lengths = pc.list_value_length(pq.read_table(path, columns=[column])[column])
    return pc.fill_null(lengths, -1).to_numpy().astype(np.int64)


def assert_fast_path(path: Path, column: str = "tokens") -> None:
    got = list_lengths(path, column)
    assert got is not None, "the fast path declined a file it should read"
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, oracle(path, column))


@st.composite
def list_arrays(draw, value_type: pa.DataType | None = None) -> pa.Array:
    """Lists with empty, null and very long rows; the shape is drawn, the values are random."""
    rows = draw(st.integers(0, 400))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p_null, p_empty, p_null_element = (draw(st.sampled_from([0.0, 0.05, 0.5])) for _ in range(3))
    lengths = rng.geometric(draw(st.sampled_from([0.5, 0.1, 0.01])), rows) - 1
    long_rows = rng.random(rows) < draw(st.sampled_from([0.0, 0.02]))
    lengths[long_rows] = rng.integers(1000, 5000, int(long_rows.sum()))
    lengths[rng.random(rows) < p_empty] = 0
    nulls = rng.random(rows) < p_null
    lengths[nulls] = 0
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    value_type = value_type or draw(st.sampled_from(VALUE_TYPES))
    # A few distinct values: dictionary pages and RLE'd indices show up.
    hi = draw(st.sampled_from([3, 60000]))
    values = pa.array(
        rng.integers(0, hi, int(offsets[-1])),
        value_type,
        mask=rng.random(int(offsets[-1])) < p_null_element,
    )
    large = draw(st.booleans())
    cls = pa.LargeListArray if large else pa.ListArray
    return cls.from_arrays(
        pa.array(offsets, pa.int64() if large else pa.int32()), values, mask=pa.array(nulls)
    )


def write_random(tmp: Path, array: pa.Array, draw, *, nullable: tuple[bool, bool]) -> Path:
    """Write `array` as column `tokens` with drawn writer settings and list/element nullability."""
    list_nullable, element_nullable = nullable
    values = array.values if element_nullable else pc.fill_null(array.values, 7)
    element = pa.field("element", values.type, nullable=element_nullable)
    large = pa.types.is_large_list(array.type)
    list_type = pa.large_list(element) if large else pa.list_(element)
    # Null rows have no values (see list_arrays), so dropping the mask makes them empty lists.
    mask = array.is_null() if list_nullable else None
    array = type(array).from_arrays(array.offsets, values, type=list_type, mask=mask)
    schema = pa.schema([("id", pa.int64()), pa.field("tokens", list_type, list_nullable)])
    table = pa.table({"id": pa.array(range(len(array))), "tokens": array}, schema=schema)
    path = tmp / "t.parquet"
    pq.write_table(
        table,
        path,
        compression=draw(st.sampled_from(COMPRESSIONS)),
        data_page_version=draw(st.sampled_from(["1.0", "2.0"])),
        use_dictionary=draw(st.booleans()),
        data_page_size=draw(st.sampled_from([None, 1024])),
        write_batch_size=draw(st.sampled_from([None, 37])),
        row_group_size=draw(st.sampled_from([None, 50, 7])),
        write_statistics=draw(st.booleans()),
        write_page_checksum=draw(st.booleans()),
        write_page_index=draw(st.booleans()),
        max_rows_per_page=draw(st.sampled_from([None, 5])),
    )
    return path


@FAST
@given(data=st.data())
def test_matches_full_decode_for_pyarrow_files(tmp_path: Path, data) -> None:
    array = data.draw(list_arrays())
    path = write_random(tmp_path, array, data.draw, nullable=(True, True))
    assert_fast_path(path)


@FAST
@given(data=st.data(), nullable=st.sampled_from([(False, True), (True, False), (False, False)]))
def test_required_list_or_element(tmp_path: Path, data, nullable) -> None:
    array = data.draw(list_arrays())
    path = write_random(tmp_path, array, data.draw, nullable=nullable)
    col = pq.ParquetFile(path).schema.column(1)
    assert col.max_definition_level == 1 + sum(nullable)
    assert_fast_path(path)


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_each_codec_and_page_version(tmp_path: Path, compression: str, version: str) -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(0, 3000, 60)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    array = pa.ListArray.from_arrays(
        offsets,
        pa.array(rng.integers(0, 50000, offsets[-1], dtype=np.int32)),
        mask=pa.array(rng.random(60) < 0.1),
    )
    path = tmp_path / "c.parquet"
    pq.write_table(
        pa.table({"tokens": array}),
        path,
        compression=compression,
        data_page_version=version,
        data_page_size=4096,
        row_group_size=25,
    )
    assert_fast_path(path)


@FAST
@given(
    array=list_arrays(pa.int64()),
    statistics=st.booleans(),
    compression=st.sampled_from(["zstd", "snappy", "lz4", "uncompressed"]),
)
def test_polars_written_files(array: pa.Array, statistics: bool, compression: str) -> None:
    frame = pl.DataFrame({"tokens": pl.from_arrow(array), "n": list(range(len(array)))})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.parquet"
        frame.write_parquet(path, statistics=statistics, compression=compression)
        assert_fast_path(path)


@pytest.mark.parametrize("statistics", [True, False])
def test_polars_defaults(tmp_path: Path, statistics: bool) -> None:
    rows = [[1, 2, 3], None, [], [None, 4], list(range(5000)), [7] * 900] * 50
    path = tmp_path / "p.parquet"
    pl.DataFrame({"tokens": rows}).write_parquet(path, statistics=statistics)
    assert_fast_path(path)


def test_declines_what_it_cannot_read(tmp_path: Path) -> None:
    path = tmp_path / "other.parquet"
    table = pa.table(
        {
            "n": pa.array([1, 2]),
            "nested": pa.array([[[1], [2, 3]], None], pa.list_(pa.list_(pa.int32()))),
            "words": pa.array([["a"], ["b", "c"]]),
            "floats": pa.array([[1.0], []]),
            "inner": pa.array([{"t": [1, 2]}, {"t": None}]),
            "dotted.name": pa.array([[1], [2, 3]]),
            "dotted": pa.array([[1], [2]]),
        }
    )
    pq.write_table(table, path)
    for column in ["n", "nested", "words", "floats", "inner", "inner.t", "missing"]:
        assert list_lengths(path, column) is None, column
    # `dotted` is ambiguous with the leaves of `dotted.name`: declined, not guessed.
    assert list_lengths(path, "dotted") is None
    np.testing.assert_array_equal(list_lengths(str(path), "dotted.name"), [1, 2])


def test_empty_file_and_empty_row_groups(tmp_path: Path) -> None:
    path = tmp_path / "e.parquet"
    schema = pa.schema([("tokens", pa.list_(pa.int32()))])
    pq.write_table(schema.empty_table(), path)
    got = list_lengths(path, "tokens")
    assert got is not None and got.size == 0 and got.dtype == np.int64
    with pq.ParquetWriter(path, schema) as writer:
        writer.write_table(pa.table({"tokens": [[1, 2], None]}, schema=schema))
        writer.write_table(schema.empty_table())
        writer.write_table(pa.table({"tokens": [[], [3]]}, schema=schema))
    assert pq.ParquetFile(path).metadata.num_row_groups == 3
    np.testing.assert_array_equal(list_lengths(path, "tokens"), [2, -1, 0, 1])


def test_large_columns_of_very_short_lists_are_left_to_a_full_decode(tmp_path, monkeypatch):
    path = tmp_path / "short.parquet"
    pq.write_table(pa.table({"tokens": [[1, 2, 3]] * 1000, "long": [list(range(40))] * 1000}), path)
    np.testing.assert_array_equal(list_lengths(path, "tokens"), [3] * 1000)
    monkeypatch.setattr(parquet_levels, "_DENSE_MIN_LEVELS", 100)
    assert list_lengths(path, "tokens") is None
    np.testing.assert_array_equal(list_lengths(path, "long"), [40] * 1000)


def _truncated_copy(src: Path, dst: Path, keep: int) -> None:
    """The first `keep` bytes of the data, then the intact footer: chunks point past the data."""
    raw = src.read_bytes()
    footer = int.from_bytes(raw[-8:-4], "little") + 8
    dst.write_bytes(raw[:keep] + raw[-footer:])


def test_truncated_column_chunk_raises(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    offsets = np.arange(0, 40001, 100, dtype=np.int32)
    array = pa.ListArray.from_arrays(offsets, pa.array(rng.integers(0, 1 << 30, 40000)))
    src = tmp_path / "full.parquet"
    pq.write_table(pa.table({"tokens": array}), src, row_group_size=100)
    bad = tmp_path / "cut.parquet"
    _truncated_copy(src, bad, keep=src.stat().st_size // 2)
    with pytest.raises(SourceDataError, match=r"cut\.parquet: row group \d+"):
        list_lengths(bad, "tokens")
    half = tmp_path / "half.parquet"
    half.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    with pytest.raises(pa.ArrowException):  # no footer: pyarrow itself refuses the file
        list_lengths(half, "tokens")


def test_twenty_megabyte_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    lengths = np.minimum((rng.pareto(1.5, 20_000) * 300 + 20).astype(np.int64), 8192)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(rng.integers(0, 50000, offsets[-1], dtype=np.int32))
    path = tmp_path / "big.parquet"
    pq.write_table(
        pa.table({"tokens": pa.ListArray.from_arrays(offsets, values)}), path, row_group_size=5000
    )
    assert path.stat().st_size > 15e6
    got = list_lengths(path, "tokens")
    assert got is not None
    np.testing.assert_array_equal(got, lengths)



def _field(delta: int, kind: int) -> bytes:
    return bytes([delta << 4 | kind])


def _zz(n: int) -> bytes:
    return _uleb((n << 1) ^ (n >> 63))


def test_page_header_skips_unknown_fields_of_every_type() -> None:
    junk_struct = b"".join(
        [
            _field(1, 8) + _uleb(3) + b"abc",  # binary
            _field(1, 9) + bytes([2 << 4 | 5]) + _zz(1) + _zz(-2),  # list<i32>
            _field(1, 10) + bytes([0xF0 | 1]) + _uleb(16) + b"\x01" * 16,  # set<bool>, long
            _field(1, 11) + _uleb(2) + bytes([8 << 4 | 12]),  # map<binary, struct>: 2 entries
            _uleb(1) + b"k" + _field(1, 7) + b"\0" * 8 + b"\0",  # "k": {1: double}
            _uleb(0) + b"\0",  # "": {}
            _field(1, 11) + _uleb(0),  # empty map
            _field(1, 1) + _field(1, 2) + _field(1, 3) + b"\x7f",  # bools, byte
            _field(1, 13) + b"\0" * 16,  # uuid
            _field(0, 6) + _zz(300) + _zz(2**40),  # long-form field id, i64
            b"\0",
        ]
    )
    data_header = b"".join(
        [
            _field(1, 5) + _zz(123),  # num_values
            _field(1, 5) + _zz(0),  # encoding
            _field(1, 5) + _zz(3),  # definition_level_encoding: RLE
            _field(1, 5) + _zz(3),  # repetition_level_encoding: RLE
            _field(1, 12) + junk_struct,  # statistics
            b"\0",
        ]
    )
    header = b"".join(
        [
            _field(1, 5) + _zz(0),  # type: DATA_PAGE
            _field(1, 5) + _zz(1000),  # uncompressed_page_size
            _field(1, 5) + _zz(900),  # compressed_page_size
            _field(1, 5) + _zz(-12345),  # crc
            _field(1, 12) + data_header,
            _field(0, 12) + _zz(99) + junk_struct,  # an unknown struct field from the future
            b"\0",
        ]
    )
    page = parquet_levels._page_header(memoryview(header + b"body"), 0)
    assert (page.type, page.uncompressed_size, page.compressed_size) == (0, 1000, 900)
    assert page.num_values == 123 and page.header_size == len(header)


def test_page_header_with_bit_packed_levels_is_declined() -> None:
    header = _field(1, 5) + _zz(0) + _field(1, 5) + _zz(10) + _field(1, 5) + _zz(10)
    header += _field(2, 12) + _field(1, 5) + _zz(5) + _field(1, 5) + _zz(0)
    header += _field(1, 5) + _zz(4) + _field(1, 5) + _zz(4) + b"\0" + b"\0"
    with pytest.raises(Unsupported):
        parquet_levels._page_header(memoryview(header), 0)


# --- decompressing only the start of a v1 page ---

PREFIX_CODECS = ["none", "snappy", "zstd", "gzip"]


def _compress(data: bytes, codec: str) -> bytes:
    return data if codec == "none" else pa.compress(data, codec=codec, asbytes=True)


def _decoder(codec: str):
    return PREFIX_DECODERS[None if codec == "none" else codec]


def _levels_page(rng, rep: int, dfn: int, rest: int) -> bytes:
    """The start of a v1 page: length-prefixed rep and def levels, then the values."""
    parts = [rng.integers(0, 4, size).astype(np.uint8).tobytes() for size in (rep, dfn)]
    values = rng.integers(0, 256, rest).astype(np.uint8).tobytes()
    return b"".join(len(p).to_bytes(4, "little") + p for p in parts) + values


class _FakeReader:
    def __init__(self, data: bytes) -> None:
        self.data, self.reads = data, 0

    def read(self, pos: int, n: int) -> bytes:
        self.reads += 1
        return self.data[pos : pos + n]


@pytest.mark.parametrize("codec", PREFIX_CODECS)
def test_read_prefix_reads_more_of_the_body_as_needed(codec: str) -> None:
    page = _levels_page(np.random.default_rng(4), 100_000, 10, 100_000)
    stream = _compress(page, codec)
    reader = _FakeReader(stream)
    body = parquet_levels._Body(reader, 0, len(stream), stream[:100])
    out = parquet_levels._read_prefix(body, _decoder(codec), len(page))
    assert bytes(out[:100_018]) == page[:100_018]
    assert reader.reads > 0 and len(body.data) < len(stream)


def _many_pages(tmp_path: Path, compression: str, version: str = "1.0") -> Path:
    rng = np.random.default_rng(6)
    lengths = rng.integers(0, 2000, 300)
    lengths[rng.random(300) < 0.1] = 0
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(rng.integers(0, 50000, offsets[-1], dtype=np.int32))
    array = pa.ListArray.from_arrays(offsets, values, mask=pa.array(rng.random(300) < 0.1))
    path = tmp_path / "m.parquet"
    pq.write_table(
        pa.table({"tokens": array}),
        path,
        compression=compression,
        data_page_version=version,
        data_page_size=8192,
        row_group_size=100,
    )
    return path


@pytest.mark.parametrize("compression", PREFIX_CODECS)
def test_v1_pages_are_decompressed_only_partway(tmp_path, monkeypatch, compression) -> None:
    path = _many_pages(tmp_path, compression)

    def whole_page(*args):
        raise AssertionError("a whole page was decompressed")

    monkeypatch.setattr(parquet_levels, "_decompress", whole_page)
    assert_fast_path(path)
    # Tiny reads: page headers and level data are read again, larger, until they fit.
    monkeypatch.setattr(parquet_levels, "_READ_AHEAD", 7)
    assert_fast_path(path)


@pytest.mark.parametrize("compression", ["snappy", "zstd", "gzip"])
def test_whole_page_fallback_when_the_prefix_decoder_declines(
    tmp_path, monkeypatch, compression
) -> None:
    path = _many_pages(tmp_path, compression)

    def decline(src, need):
        raise Unsupported("declined")

    monkeypatch.setitem(PREFIX_DECODERS, compression, decline)
    assert_fast_path(path)


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_small_reads_for_every_codec(tmp_path, monkeypatch, version) -> None:
    monkeypatch.setattr(parquet_levels, "_READ_AHEAD", 5)
    for compression in COMPRESSIONS:
        assert_fast_path(_many_pages(tmp_path, compression, version))


def test_read_prefix_stops_at_the_end_of_the_body() -> None:
    page = _levels_page(np.random.default_rng(7), 5000, 10, 0)
    body_size = 3000  # the levels claim more than the page holds
    reader = _FakeReader(page)  # the bytes after the body belong to the next page
    body = parquet_levels._Body(reader, 0, body_size, page[:100])
    with pytest.raises(Unsupported):
        parquet_levels._read_prefix(body, PREFIX_DECODERS[None], 1 << 20)
    assert len(body.data) == body_size


@pytest.mark.parametrize(
    ("stream", "n"),
    [
        (_uleb(5) + b"\x00a" + bytes([1]), 5),  # a copy's offset byte missing
        (_uleb(100) + bytes([61 << 2, 5]), 1),  # a literal's length bytes missing
        (_uleb(100) + b"\x10abc", 6),  # a literal cut short
        (b"\x80", 1),  # the stream's length cut short
    ],
)
def test_read_prefix_of_a_whole_body_that_ends_too_early_is_unsupported(stream, n) -> None:
    """Truncated asks for more of the body; once the body is whole, it is Unsupported."""
    with pytest.raises(Truncated):
        PREFIX_DECODERS["snappy"](stream, lambda out: n)
    body = parquet_levels._Body(_FakeReader(stream), 0, len(stream), stream)
    with pytest.raises(Unsupported):
        parquet_levels._read_prefix(body, PREFIX_DECODERS["snappy"], 1 << 20)


# --- the page_reads switch (MDS_PAGE_READS) ---


def _sample(tmp_path: Path) -> Path:
    """Token lists with null and empty rows, in 4 row groups."""
    rows = [[1, 2, 3], None, [], list(range(700)), [5] * 40] * 30
    path = tmp_path / "s.parquet"
    pq.write_table(
        pa.table({"tokens": pa.array(rows, pa.list_(pa.int32()))}), path, row_group_size=40
    )
    return path


@pytest.mark.parametrize("setting", ["on", "off", "check"])
def test_every_setting_gives_the_lengths_pyarrow_decodes(tmp_path, monkeypatch, setting):
    path = _sample(tmp_path)
    monkeypatch.setenv("MDS_PAGE_READS", setting)
    if setting == "off":
        monkeypatch.setattr(parquet_levels, "list_lengths", None)  # not even called
    got = parquet_levels.lengths(path, "tokens", pq.read_metadata(path))
    assert got is not None and got.dtype == np.int64
    np.testing.assert_array_equal(got, oracle(path))


def test_check_leaves_a_file_the_level_reader_declines_to_the_full_decode(tmp_path, monkeypatch):
    path = _sample(tmp_path)
    monkeypatch.setattr(parquet_levels, "list_lengths", lambda *a: None)
    monkeypatch.setenv("MDS_PAGE_READS", "check")
    assert parquet_levels.lengths(path, "tokens") is None


@pytest.mark.parametrize("fault", ["length", "null", "missing row"])
def test_check_raises_on_wrong_lengths_naming_the_row(tmp_path, monkeypatch, fault):
    path = _sample(tmp_path)
    real = parquet_levels.list_lengths

    def wrong(*args):
        got = real(*args).copy()
        if fault == "length":
            got[83] += 1
        elif fault == "null":
            got[83] = -1
        else:
            got = got[:83]
        return got

    monkeypatch.setattr(parquet_levels, "list_lengths", wrong)
    monkeypatch.setenv("MDS_PAGE_READS", "check")
    with pytest.raises(SourceDataError) as err:
        parquet_levels.lengths(path, "tokens", None, "data/s.parquet")
    message = str(err.value)
    assert message.startswith("data/s.parquet: row group 2, column 'tokens', row 83: ")
    assert "MDS_PAGE_READS=off" in message and "\n" not in message


def test_an_invalid_setting_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("MDS_PAGE_READS", "ON")
    with pytest.raises(ConfigError, match="MDS_PAGE_READS='ON'"):
        parquet_levels.lengths(_sample(tmp_path), "tokens")
