"""Rows read from Parquet pages are the rows pyarrow decodes, for every writer setting the
page reader takes; anything it does not take (nulls, empty lists, other types, damaged
pages) gives None, never other values or another error."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mds.errors import ConfigError, SourceDataError
from mds.formats.parquet import pages as parquet_pages
from mds.formats.parquet.thrift import (
    DATA_PAGE,
    DATA_PAGE_V2,
    Unsupported,
    field_int,
    field_struct,
    page_fields,
)

WRITERS = st.fixed_dictionaries(
    {
        "compression": st.sampled_from(["none", "snappy", "zstd", "gzip", "lz4", "brotli"]),
        "use_dictionary": st.booleans(),
        "data_page_version": st.sampled_from(["1.0", "2.0"]),
        "data_page_size": st.sampled_from([64, 1024, 1 << 20]),
        "dictionary_pagesize_limit": st.sampled_from([256, 1 << 20]),
        "row_group_size": st.integers(1, 60),
    }
)


def _file(tmp_path, table: pa.Table, **writer) -> tuple[int, pq.FileMetaData, pa.Table]:
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, **writer)
    fh = open(path, "rb")  # noqa: SIM115 - closed by the test's finalizer below
    _OPEN.append(fh)
    return fh.fileno(), pq.read_metadata(path), pq.read_table(path)


_OPEN: list = []


@pytest.fixture(autouse=True)
def _page_reads_on(monkeypatch):
    """These tests are of the page reader itself, whatever MDS_PAGE_READS the run has."""
    monkeypatch.setenv("MDS_PAGE_READS", "on")


@pytest.fixture(autouse=True)
def _close_files():
    yield
    while _OPEN:
        _OPEN.pop().close()


def _groups(meta: pq.FileMetaData, column: pa.ChunkedArray):
    """Per row group: (offsets of its rows' values in the group, lengths, the rows' values)."""
    start = 0
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        lists = column.slice(start, n).combine_chunks()
        lengths = np.diff(lists.offsets.to_numpy()).astype(np.int64)
        offsets = np.cumsum(lengths) - lengths
        yield g, offsets, lengths, lists
        start += n


def _layout(meta: pq.FileMetaData, table: pa.Table, name: str = "t"):
    return parquet_pages.layout(meta, name, table.schema.field(name).type.value_type)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    writer=WRITERS,
    dtype=st.sampled_from([pa.int32(), pa.int64()]),
    vocab=st.sampled_from([1, 2, 7, 300, 70_000, 1 << 40]),
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=120),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_rows_from_pages_are_the_rows_pyarrow_decodes(
    tmp_path, writer, dtype, vocab, lengths, seed, data
):
    rng = np.random.default_rng(seed)
    vocab = min(vocab, 2**31 - 1) if dtype == pa.int32() else vocab
    values = rng.integers(0, vocab, sum(lengths))
    if rng.random() < 0.3:  # long repeats: RLE runs among the bit-packed ones
        values = np.sort(values)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=dtype))
    fd, meta, table = _file(tmp_path, pa.table({"t": lists}), **writer)
    lay = _layout(meta, table)
    assert lay is not None
    for g, starts, counts, rows in _groups(meta, table.column("t")):
        ask = np.array(data.draw(st.lists(st.integers(0, len(rows) - 1), min_size=1, max_size=20)))
        got = parquet_pages.read_rows(fd, lay, g, starts[ask], counts[ask])
        assert got is not None
        for r, v in zip(ask.tolist(), got, strict=True):
            want = rows[r].values.to_numpy()
            assert v.dtype == want.dtype and np.array_equal(v, want)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    writer=WRITERS,
    dtype=st.sampled_from([pa.int32(), pa.int64()]),
    vocab=st.sampled_from([1, 300, 65_535, 65_536, 65_537, 70_000, 1 << 40]),
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=120),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_rows_read_narrow_are_the_rows_pyarrow_decodes_at_two_bytes_where_they_fit(
    tmp_path, writer, dtype, vocab, lengths, seed, data
):
    """`narrow`: the same values as pyarrow's whole-chunk decode, as uint16 exactly where
    every value asked fits (a dictionary cast before its indices are looked up, or the
    values after), else at the column's width; rows asked in any order, some twice."""
    rng = np.random.default_rng(seed)
    vocab = min(vocab, 2**31 - 1) if dtype == pa.int32() else vocab
    values = rng.integers(0, vocab, sum(lengths))
    if rng.random() < 0.3:
        values = np.sort(values)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=dtype))
    fd, meta, table = _file(tmp_path, pa.table({"t": lists}), **writer)
    lay = _layout(meta, table)
    for g, starts, counts, rows in _groups(meta, table.column("t")):
        ask = np.array(data.draw(st.lists(st.integers(0, len(rows) - 1), min_size=1, max_size=30)))
        got = parquet_pages.read_rows(fd, lay, g, starts[ask], counts[ask], narrow=True)
        wide = parquet_pages.read_rows(fd, lay, g, starts[ask], counts[ask])
        assert got is not None and wide is not None and len(got) == len(ask)
        wants = [rows[r].values.to_numpy() for r in ask.tolist()]
        fits = all(w.max() <= 65_535 for w in wants)
        event(f"fits uint16: {fits}")
        assert got.values.dtype == (np.uint16 if fits else wants[0].dtype)
        for v, w, x in zip(got, wants, wide, strict=True):
            assert v.tobytes() == w.astype(v.dtype).tobytes() and np.array_equal(v, w)
            assert x.dtype == w.dtype and x.tobytes() == w.tobytes()


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    writer=WRITERS,
    rows=st.lists(
        st.one_of(
            st.none(),
            st.lists(st.one_of(st.none(), st.integers(0, 999)), max_size=12),
        ),
        min_size=1,
        max_size=80,
    ),
    data=st.data(),
)
def test_pages_with_nulls_or_empty_lists_give_none_or_the_right_rows(tmp_path, writer, rows, data):
    """The plan's offsets count a null or empty row as no values and a null token as one:
    wherever that could shift a value, the page reader declines and pyarrow decodes."""
    fd, meta, table = _file(
        tmp_path, pa.table({"t": pa.array(rows, pa.list_(pa.int32()))}), **writer
    )
    lay = _layout(meta, table)
    column = table.column("t")
    start = 0
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        group = column.slice(start, n).to_pylist()
        start += n
        counts = np.array([len(r) if r is not None else 0 for r in group], dtype=np.int64)
        starts = np.cumsum(counts) - counts
        ask = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=10)))
        got = parquet_pages.read_rows(fd, lay, g, starts[ask], counts[ask])
        narrow = parquet_pages.read_rows(fd, lay, g, starts[ask], counts[ask], narrow=True)
        assert (got is None) == (narrow is None)
        if got is None:
            continue
        assert narrow.values.dtype == np.uint16  # token ids under 1000
        for r, v, n in zip(ask.tolist(), got, narrow, strict=True):
            assert group[r] is not None and None not in group[r]
            assert v.tolist() == n.tolist() == group[r]


@pytest.mark.parametrize(
    ("type_", "value"),
    [
        (pa.list_(pa.uint32()), [1, 2]),
        (pa.list_(pa.int16()), [1, 2]),
        (pa.list_(pa.list_(pa.int32())), [[1, 2]]),
        (pa.int32(), 1),
    ],
)
def test_other_types_are_left_to_pyarrow(tmp_path, type_, value):
    _fd, meta, _table = _file(tmp_path, pa.table({"t": pa.array([value] * 3, type_)}))
    value_type = type_.value_type if pa.types.is_list(type_) else type_
    assert parquet_pages.layout(meta, "t", value_type) is None


@pytest.mark.parametrize(
    "writer",
    [
        {"data_page_size": 4096},
        {"data_page_size": 4096, "data_page_version": "2.0", "compression": "zstd"},
        {"use_dictionary": False, "compression": "none"},
        {"data_page_size": 4096, "compression": "gzip"},  # v1 pages read partway
        {"data_page_size": 4096, "compression": "zstd"},
    ],
)
def test_damaged_pages_give_none_or_rows_of_the_asked_lengths(tmp_path, writer):
    """Bytes flipped anywhere in the column chunk: the reader declines (pyarrow then reports
    the damage) or, where the flip hit only values, returns rows of the asked lengths."""
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 300, 200)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    lists = pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(rng.integers(0, 5000, offsets[-1]))
    )
    buf = io.BytesIO()
    pq.write_table(pa.table({"t": lists}), buf, **writer)
    clean = buf.getvalue()
    meta = pq.read_metadata(pa.BufferReader(clean))
    lay = parquet_pages.layout(meta, "t", pa.int64())
    chunk = lay.chunk(0)
    starts = np.cumsum(lengths) - lengths
    ask = rng.choice(200, 20, replace=False)
    path = tmp_path / "d.parquet"
    declined = 0
    for trial in range(300):
        data = bytearray(clean)
        end = chunk.start + (32 if trial % 8 == 0 else chunk.size)  # a header, now and then
        for at in rng.integers(chunk.start, end, 1 + trial % 4):
            data[at] ^= 1 << int(rng.integers(8))
        path.write_bytes(bytes(data))
        with open(path, "rb") as fh:
            got = parquet_pages.read_rows(fh.fileno(), lay, 0, starts[ask], lengths[ask])
        if got is None:
            declined += 1
        else:
            assert [len(v) for v in got] == lengths[ask].tolist()
    assert declined > 0


@pytest.mark.parametrize("page_size", [64, 1 << 20])  # values over many pages, or one
def test_ranges_that_overlap_are_read_in_their_order(tmp_path, page_size):
    """Ranges of values that overlap (no two rows of a file do; a damaged plan's could) are
    decoded in the order asked, not as one stretch a page."""
    values = np.arange(500, dtype=np.int64) % 97
    lists = pa.ListArray.from_arrays(pa.array([0, 250, 500], pa.int32()), pa.array(values))
    fd, meta, table = _file(tmp_path, pa.table({"t": lists}), data_page_size=page_size)
    lay = _layout(meta, table)
    starts, counts = np.array([300, 10, 20, 10]), np.array([150, 30, 290, 30])
    for narrow in (False, True):
        got = parquet_pages.read_rows(fd, lay, 0, starts, counts, narrow=narrow)
        assert got is not None
        for v, a, n in zip(got, starts.tolist(), counts.tolist(), strict=True):
            assert v.tolist() == values[a : a + n].tolist()


def test_offsets_beyond_the_group_are_declined(tmp_path):
    lists = pa.array([[1, 2, 3], [4, 5]], pa.list_(pa.int32()))
    fd, meta, table = _file(tmp_path, pa.table({"t": lists}))
    lay = _layout(meta, table)
    assert parquet_pages.read_rows(fd, lay, 0, np.array([3]), np.array([2])) is not None
    assert parquet_pages.read_rows(fd, lay, 0, np.array([4]), np.array([2])) is None
    assert parquet_pages.read_rows(fd, lay, 0, np.array([-1]), np.array([2])) is None


@pytest.mark.parametrize("width, index", [(8, 3), (8, 255), (16, 3), (16, 40_000)])
def test_a_dictionary_index_past_the_end_is_declined(width, index):
    """Indices in an RLE run (one value) and a bit-packed run (8 values) of 3 entries."""
    dictionary = np.array([10, 20, 30], dtype=np.int32)
    starts, ends = np.array([0]), np.array([4])

    def runs(value: int) -> list[memoryview]:
        v = value.to_bytes(width // 8, "little")
        return [memoryview(bytes([width, 4 << 1]) + v), memoryview(bytes([width, 3]) + v * 8)]

    for bad, ok in zip(runs(index), runs(2), strict=True):
        with pytest.raises(Unsupported, match="out of range"):
            parquet_pages._values(8, bad, starts, ends, dictionary, np.dtype(np.int32), 4)
        got = parquet_pages._values(8, ok, starts, ends, dictionary, np.dtype(np.int32), 4)
        assert got.tolist() == [30] * 4


@pytest.mark.parametrize("distinct", [1, 3, 200, 40_000, 70_000])
def test_every_dictionary_index_width(tmp_path, distinct):
    """Dictionaries of 1 (0-bit indices), 3, 200 (8-bit, whole bytes), 40k (16-bit, whole
    bytes) and 70k entries (17-bit), in bit-packed runs and, sorted, in RLE runs."""
    rng = np.random.default_rng(distinct)
    for values in (rng.permutation(np.arange(120_000) % distinct), np.arange(120_000) % distinct):
        lengths = rng.integers(1, 600, 400)
        lengths = lengths[np.cumsum(lengths) <= len(values)]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        column = pa.ListArray.from_arrays(
            pa.array(offsets), pa.array(values[: offsets[-1]], pa.int32())
        )
        fd, meta, table = _file(
            tmp_path, pa.table({"t": column}), dictionary_pagesize_limit=1 << 22
        )
        assert "RLE_DICTIONARY" in meta.row_group(0).column(0).encodings
        lay = _layout(meta, table)
        for _g, starts, counts, rows in _groups(meta, table.column("t")):
            ask = rng.choice(len(rows), min(40, len(rows)), replace=False)
            got = parquet_pages.read_rows(fd, lay, 0, starts[ask], counts[ask])
            assert got is not None
            for r, v in zip(ask.tolist(), got, strict=True):
                assert np.array_equal(v, rows[r].values.to_numpy())


# --- the page_reads switch (MDS_PAGE_READS) ---


def _sample(tmp_path, **writer):
    """A file of 3 row groups of token lists, its layout, and what a fetch of some rows of
    row group 1 passes: their file rows, where their values start in the group, counts."""
    rng = np.random.default_rng(11)
    lengths = rng.integers(1, 50, 90)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    lists = pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(rng.integers(0, 3000, offsets[-1]), pa.int32())
    )
    fd, meta, table = _file(tmp_path, pa.table({"t": lists}), row_group_size=30, **writer)
    lay = _layout(meta, table)
    group = lengths[30:60]
    rows = np.array([31, 45, 59, 30])
    starts = (np.cumsum(group) - group)[rows - 30]
    return fd, lay, rows, starts, group[rows - 30], table.column("t")


@pytest.mark.parametrize("setting", ["on", "check"])
def test_on_and_check_read_the_rows_pyarrow_decodes(tmp_path, monkeypatch, setting):
    monkeypatch.setenv("MDS_PAGE_READS", setting)
    fd, lay, rows, starts, counts, column = _sample(tmp_path)
    got = parquet_pages.fetch_rows(fd, lay, 1, rows, starts, counts, "t.parquet")
    assert got is not None
    for r, v in zip(rows.tolist(), got, strict=True):
        want = column[r].values.to_numpy()
        assert v.dtype == want.dtype and np.array_equal(v, want)


def test_off_leaves_every_read_to_pyarrow(tmp_path, monkeypatch):
    fd, lay, rows, starts, counts, _column = _sample(tmp_path)
    monkeypatch.setenv("MDS_PAGE_READS", "off")
    monkeypatch.setattr(parquet_pages, "read_rows", None)  # not even called
    assert parquet_pages.fetch_rows(fd, lay, 1, rows, starts, counts, "t.parquet") is None
    assert lay.chunk(1) is None  # a reader asking which groups to read from pages: none
    monkeypatch.setenv("MDS_PAGE_READS", "on")
    assert lay.chunk(1) is not None


@pytest.mark.parametrize("fault", ["value", "dtype", "short"])
def test_check_raises_on_a_wrong_decode_naming_the_row(tmp_path, monkeypatch, fault):
    fd, lay, rows, starts, counts, _column = _sample(tmp_path)
    real = parquet_pages.read_rows

    def wrong(*args):
        got = [v.copy() for v in real(*args)]
        if fault == "value":
            got[1][-1] += 1  # file row 45
        elif fault == "dtype":
            got[1] = got[1].astype(np.int64)
        else:
            got[1] = got[1][:-1]
        return got

    monkeypatch.setattr(parquet_pages, "read_rows", wrong)
    monkeypatch.setenv("MDS_PAGE_READS", "on")
    assert parquet_pages.fetch_rows(fd, lay, 1, rows, starts, counts, "t.parquet") is not None
    monkeypatch.setenv("MDS_PAGE_READS", "check")
    with pytest.raises(SourceDataError) as err:
        parquet_pages.fetch_rows(fd, lay, 1, rows, starts, counts, "data/t.parquet")
    message = str(err.value)
    assert message.startswith("data/t.parquet: row group 1, column 't', row 45: ")
    assert "MDS_PAGE_READS=off" in message and "\n" not in message


def test_check_reads_an_object_through_its_source(tmp_path, monkeypatch):
    """Of an object pyarrow decodes from the same reader the pages were read through."""
    fd, lay, rows, starts, counts, column = _sample(tmp_path, compression="zstd")
    data = (tmp_path / "t.parquet").read_bytes()

    class Bytes:
        size = len(data)
        reads = 0

        def read_at(self, size: int, start: int) -> bytes:
            Bytes.reads += 1
            return data[start : start + size]

    monkeypatch.setenv("MDS_PAGE_READS", "check")
    got = parquet_pages.fetch_rows(Bytes(), lay, 1, rows, starts, counts, "s3://b/t.parquet")
    assert got is not None and Bytes.reads > 1
    for r, v in zip(rows.tolist(), got, strict=True):
        assert np.array_equal(v, column[r].values.to_numpy())


def test_an_invalid_setting_is_refused(tmp_path, monkeypatch):
    fd, lay, rows, starts, counts, _column = _sample(tmp_path)
    monkeypatch.setenv("MDS_PAGE_READS", "maybe")
    with pytest.raises(ConfigError, match="MDS_PAGE_READS='maybe'"):
        parquet_pages.fetch_rows(fd, lay, 1, rows, starts, counts, "t.parquet")


def test_check_where_pyarrow_cannot_decode_the_group(tmp_path, monkeypatch):
    fd, lay, rows, starts, counts, _column = _sample(tmp_path)

    def broken(*args):
        raise pa.ArrowInvalid("Couldn't deserialize thrift\nmore detail")

    monkeypatch.setattr(parquet_pages, "_pyarrow_group", broken)
    monkeypatch.setenv("MDS_PAGE_READS", "check")
    with pytest.raises(SourceDataError) as err:
        parquet_pages.fetch_rows(fd, lay, 1, rows, starts, counts, "t.parquet")
    assert str(err.value) == (
        "t.parquet: row group 1, column 't': pyarrow cannot read it (Couldn't deserialize "
        "thrift), so the page reader's token ids cannot be checked; set MDS_PAGE_READS=off to "
        "read this file with pyarrow only"
    )


class _Counted:
    """A Source over a file that records the size of every read."""

    def __init__(self, path):
        self._fh = open(path, "rb")  # noqa: SIM115 - closed by the test's finalizer
        _OPEN.append(self._fh)
        self.size = path.stat().st_size
        self.reads: list[int] = []

    def read_at(self, size: int, start: int) -> bytes:
        self.reads.append(size)
        self._fh.seek(start)
        return self._fh.read(size)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    writer=WRITERS,
    page_index=st.booleans(),
    n_rows=st.integers(1, 300),
    holes=st.sampled_from([0.0, 0.02]),  # the share of null and of empty rows
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_rows_read_page_by_page_are_pyarrows_and_no_read_holds_the_whole_chunk(
    tmp_path, writer, page_index, n_rows, holes, seed, data
):
    """Read page by page (no chunk read at once), rows are what pyarrow decodes from the
    whole chunk, with and without the page index, nulls and empty rows where the schema
    allows (where they could shift a value the reader declines); no single read is larger
    than a page with its header."""
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(n_rows) < holes, 0, rng.integers(1, 300, n_rows))
    lengths[rng.random(n_rows) < holes] = -1  # a null row
    rows = [None if k < 0 else rng.integers(0, 70_000, k).tolist() for k in lengths]
    writer["row_group_size"] = data.draw(st.sampled_from([17, 150]))
    writer["data_page_size"] = data.draw(st.sampled_from([64, 1024, 4096]))
    writer["dictionary_pagesize_limit"] = data.draw(st.sampled_from([256, 4096]))
    path = tmp_path / "t.parquet"
    table = pa.table({"t": pa.array(rows, pa.list_(pa.int32()))})
    pq.write_table(table, path, write_page_index=page_index, **writer)
    meta = pq.read_metadata(path)
    assert meta.row_group(0).column(0).has_offset_index == page_index
    lay = _layout(meta, table)
    column = pq.read_table(path).column("t")
    start = 0
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        group = column.slice(start, n).to_pylist()
        start += n
        counts = np.array([len(r) if r is not None else 0 for r in group], dtype=np.int64)
        starts = np.cumsum(counts) - counts
        ask = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=10)))
        source = _Counted(path)
        got = parquet_pages.read_rows(source, lay, g, starts[ask], counts[ask], most=0)
        chunk = meta.row_group(g).column(0)
        # a page: the dictionary's, or one of data (pyarrow closes it after a batch of at
        # most 1024 values once it holds data_page_size bytes), with its header
        dictionary = chunk.data_page_offset - (chunk.dictionary_page_offset or 0)
        page = max(dictionary if chunk.has_dictionary_page else 0, writer["data_page_size"])
        page += 1024 * 8 + 256
        big = chunk.total_compressed_size > 2 * page
        if big:
            assert max(source.reads, default=0) <= page
        event("declined" if got is None else "read", "many pages" if big else "a few pages")
        if got is None:
            continue
        # again, other rows: pages found full by the first read are skipped unread
        again = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=10)))
        got_again = parquet_pages.read_rows(source, lay, g, starts[again], counts[again], most=0)
        if got_again is None:  # a page of a null or empty row before those rows: declined
            again, got_again = again[:0], []
        for r, v in zip([*ask.tolist(), *again.tolist()], [*got, *got_again], strict=True):
            assert group[r] is not None and None not in group[r]
            assert v.dtype == np.int32 and v.tolist() == group[r]


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_a_small_chunk_read_for_its_first_rows_reads_only_the_pages_that_hold_them(
    tmp_path, version
):
    """A chunk that fits the buffer is read whole when the values asked reach its second
    half, but page by page, up to the page of the last value asked, when they all lie in
    its first half (a file's first read of a few rows); the rows are the same."""
    rng = np.random.default_rng(5)
    rows = [rng.integers(0, 70_000, 50).tolist() for _ in range(400)]
    path = tmp_path / "t.parquet"
    table = pa.table({"t": pa.array(rows, pa.list_(pa.int32()))})
    pq.write_table(table, path, data_page_size=4096, data_page_version=version)
    meta = pq.read_metadata(path)
    lay = _layout(meta, table)
    size = meta.row_group(0).column(0).total_compressed_size
    starts = np.arange(400, dtype=np.int64) * 50
    counts = np.full(400, 50, dtype=np.int64)
    for ask, whole in (([3, 7], False), ([3, 390], True)):
        source = _Counted(path)
        got = parquet_pages.read_rows(source, lay, 0, starts[ask], counts[ask])
        assert [v.tolist() for v in got] == [rows[r] for r in ask]
        assert (sum(source.reads) >= size) == whole, (ask, sum(source.reads), size)


# --- v1 data pages decompressed only through the last value asked (`_prefix`) ---


def _page_firsts(path, meta: pq.FileMetaData, group: int) -> list[tuple[int, int]]:
    """(first value, values) of each data page of row group `group`'s chunk of column 0."""
    chunk = parquet_pages.footer.chunk(meta, group, 0)
    data = memoryview(path.read_bytes())[chunk.start : chunk.start + chunk.size]
    pos = first = 0
    out = []
    while pos < chunk.size:
        fields, size = page_fields(data, pos)
        kind = field_int(fields, 1)
        if kind in (DATA_PAGE, DATA_PAGE_V2):
            n = field_int(field_struct(fields, 5 if kind == DATA_PAGE else 8), 1)
            out.append((first, n))
            first += n
        pos += size + field_int(fields, 3)
    return out


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    compression=st.sampled_from(["none", "snappy", "zstd", "gzip"]),
    use_dictionary=st.booleans(),
    data_page_size=st.sampled_from([256, 4096, 1 << 16]),
    vocab=st.sampled_from([2, 300, 70_000]),
    sorted_values=st.booleans(),
    n_rows=st.integers(1, 300),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_pages_decompressed_through_the_last_value_asked_give_the_whole_pages_rows(
    tmp_path, monkeypatch, compression, use_dictionary, data_page_size, vocab, sorted_values,
    n_rows, seed, data,
):
    """Rows at the start, middle and end of pages, and random ones, read with v1 pages
    decompressed only as far as needed (every codec that has a prefix decoder, not only
    those the reader uses it for) are the rows of whole pages and pyarrow's, byte for
    byte; and the prefix is taken, not always declined."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 120, n_rows)
    values = rng.integers(0, vocab, int(lengths.sum()))
    if sorted_values:  # RLE runs among the bit-packed ones
        values = np.sort(values)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32()))
    path = tmp_path / "p.parquet"
    pq.write_table(
        pa.table({"t": lists}),
        path,
        compression=compression,
        use_dictionary=use_dictionary,
        data_page_size=data_page_size,
        data_page_version="1.0",
    )
    meta = pq.read_metadata(path)
    table = pq.read_table(path)
    lay = _layout(meta, table)
    starts = np.cumsum(lengths) - lengths
    # the rows holding each page's first, middle and last value, and a few drawn
    at = [v for f, n in _page_firsts(path, meta, 0) for v in (f, f + n // 2, f + n - 1)]
    rows = np.searchsorted(starts, at, side="right") - 1
    drawn = data.draw(st.lists(st.integers(0, n_rows - 1), max_size=6))
    asks = [[int(r)] for r in rows] + [drawn] * bool(drawn) + [rows[:3].tolist()]
    prefixes = []
    real = parquet_pages._prefix

    def counted(*args):
        got = real(*args)
        prefixes.append(got is not None)
        return got

    monkeypatch.setattr(parquet_pages, "_prefix", counted)
    with open(path, "rb") as fh:
        for ask in asks:
            ask = np.array(ask, dtype=np.int64)
            whole = []
            for codecs in [{}, dict.fromkeys([None, "snappy", "zstd", "gzip"], 1)]:
                monkeypatch.setattr(parquet_pages, "_PREFIX_CODECS", codecs)
                lay._checked.clear()  # pages skipped as known full would not be decoded
                got = parquet_pages.read_rows(fh.fileno(), lay, 0, starts[ask], lengths[ask])
                assert got is not None
                whole = whole or got
                for r, v, w in zip(ask.tolist(), got, whole, strict=True):
                    want = table.column("t")[r].values.to_numpy()
                    assert v.dtype == want.dtype and v.tobytes() == want.tobytes()
                    assert v.tobytes() == w.tobytes()
    event("prefix taken" if any(prefixes) else "prefix never taken")
