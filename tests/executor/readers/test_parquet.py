"""Parquet reader: sample files read at random equal pyarrow's read, row groups decoded once
and cached (or a prefix, or from pages), the footer parsed once across reopens, and one
test per user-data error message."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from reader_helpers import (
    CACHES,
    SAMPLE,
    assert_payloads_equal,
    count_calls,
    fetch_all,
    reader_for,
    reopen_fetch,
    shuffled_with_repeats,
)

import mds.executor.readers.parquet as parquet_reader
from mds.core import metacache
from mds.core.lru import LRU
from mds.core.row_slices import RowSlices
from mds.errors import SourceDataError
from mds.formats.parquet import pages as parquet_pages
from mds.planner.index.parquet import group_offsets


@pytest.mark.parametrize("cache", sorted(CACHES))
@pytest.mark.parametrize(
    "rel, kind, column",
    [
        ("web/part-00000.parquet", "token_ids", "tokens"),
        ("web/part-00001.parquet", "token_ids", "tokens"),
        ("web/part-00002.parquet", "token_ids", "tokens"),
        ("books/books.parquet", "text", "text"),
    ],
)
def test_sample_parquet_matches_read_table(rel, kind, column, cache):
    expected = pq.read_table(SAMPLE / rel, columns=[column]).column(0).to_pylist()
    order = shuffled_with_repeats(len(expected))
    got = fetch_all(reader_for("parquet", SAMPLE / rel, kind, column, CACHES[cache]()), order)
    assert_payloads_equal(got, [expected[i] for i in order])


def _token_table(n: int, value_type=pa.int32(), list_type=pa.list_) -> tuple[pa.Table, list]:
    rows = [list(range(i, i + i % 7)) for i in range(n)]
    return pa.table({"tokens": pa.array(rows, list_type(value_type)), "id": range(n)}), rows


@pytest.mark.parametrize("value_type", [pa.int8(), pa.uint16(), pa.int32(), pa.int64()])
@pytest.mark.parametrize("list_type", [pa.list_, pa.large_list])
def test_parquet_token_types(tmp_path, value_type, list_type):
    table, rows = _token_table(50, value_type, list_type)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=16)
    got = fetch_all(
        reader_for("parquet", tmp_path / "t.parquet", "token_ids", "tokens"), [49, 3, 3]
    )
    assert_payloads_equal(got, [rows[49], rows[3], rows[3]])
    assert got[0].dtype == value_type.to_pandas_dtype()


def test_parquet_reads_each_row_group_once_per_call_and_caches(tmp_path):
    table, rows = _token_table(100)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=10)
    blocks = LRU(max_bytes=1 << 20)
    reader = reader_for("parquet", tmp_path / "t.parquet", "token_ids", "tokens", blocks)
    reads: list[tuple[int, int]] = []
    inner = reader._read
    reader._read = lambda i, need, whole, row: reads.append((i, need)) or inner(i, need, whole, row)
    order = np.array([95, 3, 91, 5, 95, 0, 42])
    assert_payloads_equal(reader.fetch(order, None, None), [rows[i] for i in order])
    assert sorted(reads) == [(0, 10), (4, 10), (9, 10)]  # the cache has room: whole groups
    reader.fetch(np.array([1, 99, 49]), None, None)
    assert len(reads) == 3  # from the cache
    reader.close()


def test_parquet_decodes_only_a_prefix_once_the_cache_is_full(tmp_path):
    table, rows = _token_table(100)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=10)
    blocks = LRU(max_bytes=1 << 20)
    reader = reader_for("parquet", tmp_path / "t.parquet", "token_ids", "tokens", blocks)
    reader._room = lambda i: False
    reads: list[tuple[int, int]] = []
    inner = reader._read
    reader._read = lambda i, need, whole, row: reads.append((i, need)) or inner(i, need, whole, row)
    order = np.array([95, 3, 91, 5, 95, 0, 42])
    assert_payloads_equal(reader.fetch(order, None, None), [rows[i] for i in order])
    # one decode per row group, up to the last row asked of it
    assert sorted(reads) == [(0, 6), (4, 3), (9, 6)]
    cached = {i for i in range(10) if (reader.path, "rg", i, "tokens", "token_ids") in blocks}
    assert cached == {0, 4, 9}
    reader.fetch(np.array([1, 94, 40]), None, None)
    assert len(reads) == 3  # within the cached prefixes
    assert_payloads_equal(reader.fetch(np.array([99, 2]), None, None), [rows[99], rows[2]])
    assert reads[3:] == [(9, 10)]  # beyond the prefix: the whole group, once
    reader.fetch(np.array([97, 98]), None, None)
    assert len(reads) == 4
    reader.close()


@pytest.mark.parametrize("kind", ["token_ids", "text"])
def test_parquet_prefix_reads_return_every_row(tmp_path, kind):
    table, rows = _token_table(300)
    texts = [f"row {i} " * (i % 5) for i in range(300)]
    table = table.append_column("text", pa.array(texts))
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=64, data_page_size=256)
    column, expected = ("tokens", rows) if kind == "token_ids" else ("text", texts)
    blocks = LRU(max_bytes=1 << 20)
    reader = reader_for("parquet", tmp_path / "t.parquet", kind, column, blocks)
    reader._room = lambda i: False
    for order in (np.arange(300), shuffled_with_repeats(300, seed=3), np.arange(300)[::-1]):
        blocks.clear()
        got = [reader.fetch(np.array([r]), None, None)[0] for r in order.tolist()]
        assert_payloads_equal(got, [expected[r] for r in order.tolist()])
    reader.close()


def test_parquet_payload_is_a_copy_of_the_cached_block(tmp_path):
    table, _ = _token_table(20)
    pq.write_table(table, tmp_path / "t.parquet")
    reader = reader_for("parquet", tmp_path / "t.parquet", "token_ids", "tokens")
    first = reader.fetch(np.array([6]), None, None)[0]
    first[:] = -1
    assert reader.fetch(np.array([6]), None, None)[0].tolist() == list(range(6, 12))
    reader.close()


def test_parquet_empty_file_and_empty_request(tmp_path):
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "e.parquet")
    reader = reader_for("parquet", tmp_path / "e.parquet")
    assert reader.fetch(np.array([], dtype=np.int64), None, None) == []
    with pytest.raises(SourceDataError, match="row 0 is beyond the file's 0 rows"):
        reader.fetch(np.array([0]), None, None)
    reader.close()


def test_parquet_errors(tmp_path):
    table = pa.table(
        {
            "tokens": pa.array([[1, 2], None, [3, None]], pa.list_(pa.int32())),
            "text": ["a", None, "c"],
            "score": [1.0, 2.0, 3.0],
        }
    )
    path = tmp_path / "web/part-00000.parquet"
    path.parent.mkdir()
    pq.write_table(table, path)
    shown = "web/part-00000.parquet"

    def open_(kind, column):
        return reader_for("parquet", path, kind, column, display=shown)

    tokens = open_("token_ids", "tokens")
    with pytest.raises(
        SourceDataError, match=r"^web/part-00000\.parquet row 1: column 'tokens' is null$"
    ):
        tokens.fetch(np.array([0, 1]), None, None)
    with pytest.raises(SourceDataError, match=r"row 2: column 'tokens' holds a null token id$"):
        tokens.fetch(np.array([2]), None, None)
    with pytest.raises(
        SourceDataError,
        match=r"^web/part-00000\.parquet row 900 is beyond the file's 3 rows \(file changed since indexing\?\)$",
    ):
        tokens.fetch(np.array([0, 900]), None, None)
    with pytest.raises(SourceDataError, match=r"row -1 is beyond"):
        tokens.fetch(np.array([-1]), None, None)
    tokens.close()
    with pytest.raises(SourceDataError, match=r"row 1: column 'text' is null$"):
        open_("text", "text").fetch(np.array([1]), None, None)
    with pytest.raises(
        SourceDataError,
        match=r"^web/part-00000\.parquet has no column 'input_ids' \(columns: tokens, text, score\)$",
    ):
        open_("token_ids", "input_ids")
    with pytest.raises(
        SourceDataError, match=r": column 'score' is double, not a list of integer token ids$"
    ):
        open_("token_ids", "score")
    with pytest.raises(SourceDataError, match=r": column 'tokens' is list<.*>, not text$"):
        open_("text", "tokens")


def test_parquet_float_lists_are_not_token_ids(tmp_path):
    pq.write_table(pa.table({"tokens": [[1.5, 2.0]]}), tmp_path / "f.parquet")
    with pytest.raises(
        SourceDataError, match="'tokens' is list<element: double>, not a list of integer"
    ):
        reader_for("parquet", tmp_path / "f.parquet", "token_ids", "tokens")


def test_parquet_footer_is_parsed_once_across_reopens(tmp_path, monkeypatch):
    table, rows = _token_table(50)
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=10)
    parses = count_calls(monkeypatch, parquet_reader, "_ParquetMeta")
    blocks = LRU(max_bytes=1 << 20)
    got = reopen_fetch(
        lambda: reader_for("parquet", path, "token_ids", "tokens", blocks),
        (np.array([49, 3]), None, None),
    )
    assert len(parses) == 1
    for payloads in got:
        assert_payloads_equal(payloads, [rows[49], rows[3]])
    # A rewritten file is a new version: its footer is parsed afresh.
    pq.write_table(table.slice(0, 20), path, row_group_size=5)
    reader = reader_for("parquet", path, "token_ids", "tokens", blocks)
    assert len(parses) == 2 and int(reader.starts[-1]) == 20
    reader.close()


def test_parquet_footer_read_from_the_tail_matches_pyarrow(tmp_path, monkeypatch):
    wide = pa.table({f"c{i:03d}": pa.array([i], pa.int64()) for i in range(300)})
    for name, table in [("small", _token_table(50)[0]), ("wide", wide)]:
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table, path, row_group_size=10)
        source = pa.OSFile(str(path))
        footer = parquet_reader._footer(source)
        source.close()
        assert footer is not None and footer.equals(pq.read_metadata(path))
    # The wide footer is longer than the first read of the tail: it is read again whole.
    assert pq.read_metadata(tmp_path / "wide.parquet").serialized_size > parquet_reader._FOOTER_TAIL

    path = tmp_path / "small.parquet"
    data = path.read_bytes()
    for damaged in [data[:-1] + b"X", data[:-8] + (10**6).to_bytes(4, "little") + b"PAR1", b"PAR1"]:
        path.write_bytes(damaged)
        with pa.OSFile(str(path)) as source:
            assert parquet_reader._footer(source) is None  # pq.ParquetFile parses it and says why
        with pytest.raises(SourceDataError, match="not a readable Parquet file"):
            reader_for("parquet", path, "token_ids", "tokens", LRU(max_bytes=1 << 20))
    # A pyarrow without the footer parser: ParquetFile parses it, with the same rows.
    path.write_bytes(data)
    monkeypatch.delattr(parquet_reader._pq, "_reconstruct_filemetadata")
    with pa.OSFile(str(path)) as source:
        assert parquet_reader._footer(source) is None
    reader = reader_for("parquet", path, "token_ids", "tokens", LRU(max_bytes=1 << 20))
    assert_payloads_equal(reader.fetch(np.array([7]), None, None), [_token_table(50)[1][7]])
    reader.close()


@pytest.fixture
def small_metacache():
    """Let a test set the metadata cache's bound; restores the bound and empties it after."""
    before = metacache.max_bytes()
    metacache.clear()
    yield metacache
    metacache.configure(before)
    metacache.clear()


def test_metadata_cache_stays_within_its_bytes(tmp_path, monkeypatch, small_metacache):
    table, rows = _token_table(40)
    paths = []
    for i in range(6):
        paths.append(tmp_path / f"t{i}.parquet")
        pq.write_table(table, paths[-1], row_group_size=10)
    parses = count_calls(monkeypatch, parquet_reader, "_ParquetMeta")
    reader = reader_for("parquet", paths[0], "token_ids", "tokens")
    reader.close()
    footer = metacache.nbytes()
    small_metacache.configure(2 * footer)  # room for two footers
    blocks = LRU(max_bytes=1 << 20)
    for _ in range(2):
        for path in paths:
            reader = reader_for("parquet", path, "token_ids", "tokens", blocks)
            assert_payloads_equal(reader.fetch(np.array([7]), None, None), [rows[7]])
            reader.close()
            assert metacache.nbytes() <= metacache.max_bytes()
    # six files cycling through room for two: every open parses but the first, of t0
    assert len(parses) == 12
    assert not any(k[1] == "parquet-footer" for k in blocks._entries)  # never in the blocks


def test_metadata_survives_block_churn(tmp_path, monkeypatch, small_metacache):
    """Decoded row groups pushing each other out of a small block cache leave the footers."""
    table, rows = _token_table(40)
    paths = [tmp_path / f"t{i}.parquet" for i in range(4)]
    for path in paths:
        pq.write_table(table, path, row_group_size=40)
    parses = count_calls(monkeypatch, parquet_reader, "_ParquetMeta")
    blocks = LRU(max_bytes=1)  # no row group fits
    for _ in range(3):
        for path in paths:
            reader = reader_for("parquet", path, "token_ids", "tokens", blocks)
            assert_payloads_equal(reader.fetch(np.array([39, 0]), None, None), [rows[39], rows[0]])
            reader.close()
    assert len(parses) == 4


def test_a_file_changing_while_opened_is_parsed_afresh_and_not_cached(tmp_path, monkeypatch):
    table, rows = _token_table(30)
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=10)
    reader_for("parquet", path, "token_ids", "tokens").close()  # footer cached
    parses = count_calls(monkeypatch, parquet_reader, "_ParquetMeta")
    real = parquet_reader._version
    calls = []

    def moving(kind, p, display):  # the second stat of each open sees another version
        calls.append(kind)
        key = real(kind, p, display)
        return key if len(calls) % 2 else (*key[:-1], key[-1] + 1)

    monkeypatch.setattr(parquet_reader, "_version", moving)
    for _ in range(2):
        reader = reader_for("parquet", path, "token_ids", "tokens")
        assert_payloads_equal(reader.fetch(np.array([29]), None, None), [rows[29]])
        reader.close()
    assert len(parses) == 2  # the cached footer was not trusted, the fresh one not kept


def test_parquet_block_holds_only_its_own_numpy_arrays(tmp_path):
    table, rows = _token_table(50, pa.int32())
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=25)
    blocks = LRU(max_bytes=1 << 20)
    reader = reader_for("parquet", tmp_path / "t.parquet", "token_ids", "tokens", blocks)
    reader._room = lambda i: False
    assert_payloads_equal(reader.fetch(np.array([49]), None, None), [rows[49]])
    block = blocks.get((reader.path, "rg", 1, "tokens", "token_ids"))
    assert block.values.flags.owndata and block.offsets.flags.owndata
    assert block.values.nbytes == 4 * sum(len(r) for r in rows[25:])
    assert block.nbytes == block.values.nbytes + block.offsets.nbytes == blocks.nbytes
    reader.close()


def test_parquet_room_is_judged_by_the_payload_column_alone(tmp_path):
    table, rows = _token_table(100)
    table = table.append_column("wide", pa.array(["x" * 2000] * 100))
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=50, compression="none")
    group = pq.read_metadata(tmp_path / "t.parquet").row_group(0)
    tokens = group.column(0).total_uncompressed_size
    assert group.total_byte_size > 10 * tokens
    blocks = LRU(max_bytes=4 * tokens)
    reader = reader_for("parquet", tmp_path / "t.parquet", "token_ids", "tokens", blocks)
    assert reader._room(0)  # the wide text column does not count
    assert_payloads_equal(reader.fetch(np.array([3]), None, None), [rows[3]])
    assert blocks.get((reader.path, "rg", 0, "tokens", "token_ids")).rows == 50
    reader.close()


@pytest.mark.parametrize("kind", ["token_ids", "text"])
def test_parquet_rows_not_to_be_asked_again_are_read_without_caching(tmp_path, kind):
    table, rows = _token_table(100)
    texts = [f"row {i}" for i in range(100)]
    table = table.append_column("text", pa.array(texts))
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=25)
    column, expected = ("tokens", rows) if kind == "token_ids" else ("text", texts)
    blocks = LRU(max_bytes=1 << 20)
    reader = reader_for("parquet", tmp_path / "t.parquet", kind, column, blocks)
    order = shuffled_with_repeats(100, seed=5)
    got = reader.fetch(order, None, None, keep=False)
    assert_payloads_equal(got, [expected[r] for r in order.tolist()])
    assert len(blocks) == 0
    if kind == "token_ids":  # each row a copy of its own, not a view of the decoded group
        assert all(p.base is None for p in got)
    reader.fetch(np.array([3]), None, None)  # cached as before
    got = reader.fetch(np.array([3, 60]), None, None, keep=False)
    assert_payloads_equal(got, [expected[3], expected[60]])
    assert len(blocks) == 1  # the cached group serves; the other is read and not kept
    reader.close()


def _located(path: Path, rows: list) -> tuple[np.ndarray, np.ndarray]:
    """Each row's first value in its row group and its length, as the index records them."""
    meta = pq.read_metadata(path)
    groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    return group_offsets(lengths, groups), lengths


def _located_file(path: Path, n: int, row_group_size: int, seed: int):
    """A Parquet file of `n` random token lists; its rows, their offsets and lengths as the
    index records them, and a reader of it."""
    rng = np.random.default_rng(seed)
    rows = [rng.integers(0, 900, k).tolist() for k in rng.integers(1, 60, n)]
    table = pa.table({"tokens": pa.array(rows, pa.list_(pa.int32()))})
    pq.write_table(table, path, row_group_size=row_group_size)
    reader = reader_for("parquet", path, "token_ids", "tokens", LRU(max_bytes=1 << 20))
    return rows, *_located(path, rows), reader


def test_parquet_rows_located_by_values_are_read_from_pages_where_sparse(tmp_path, monkeypatch):
    """A few rows of a group are read from its pages; a quarter or more of its values, or a
    group already cached, go through whole decodes; the payloads are the same either way."""
    monkeypatch.setenv("MDS_PAGE_READS", "on")  # what is read from pages, not just the payloads
    rows, offsets, lengths, reader = _located_file(tmp_path / "t.parquet", 200, 50, 3)
    whole: list[int] = []
    paged: list[int] = []
    inner, inner_pages = reader._read, parquet_pages.read_rows
    reader._read = lambda i, need, n, row, own=True: whole.append(i) or inner(i, need, n, row, own)
    monkeypatch.setattr(
        parquet_pages,
        "read_rows",
        lambda fd, lay, i, *a: paged.append(i) or inner_pages(fd, lay, i, *a),
    )
    ask = np.array([3, 120, 7, *range(150, 190)])  # sparse in groups 0 and 2, dense in group 3
    got = reader.fetch(ask, offsets[ask], lengths[ask])
    assert_payloads_equal(got, [rows[i] for i in ask])
    assert got[0].dtype == np.int32
    assert sorted(paged) == [0, 2] and whole == [3]
    assert reader.page_groups(ask, offsets[ask], lengths[ask])
    again = np.array([160, 4])  # group 3 is cached now: taken from there
    assert_payloads_equal(reader.fetch(again, offsets[again], lengths[again]), [rows[160], rows[4]])
    assert sorted(paged) == [0, 0, 2] and whole == [3]
    assert not reader.page_groups(np.array([160]), offsets[[160]], lengths[[160]])
    assert not reader.page_groups(ask)  # no offsets: a plan that does not locate by values
    # Group 0 was read from its pages twice: asked again, it is decoded whole and cached.
    third = np.array([9])
    assert not reader.page_groups(third, offsets[third], lengths[third])
    assert_payloads_equal(reader.fetch(third, offsets[third], lengths[third]), [rows[9]])
    assert sorted(paged) == [0, 0, 2] and whole == [3, 0]
    reader.close()


def test_parquet_rows_read_narrow_come_as_one_array_of_uint16(tmp_path, monkeypatch):
    """With `narrow` (a read that takes rows ahead) rows read from pages come as one
    RowSlices, uint16 where every value fits (here all, under 900), rows decoded whole
    copied in beside them; the values are a wide read's."""
    monkeypatch.setenv("MDS_PAGE_READS", "on")
    rows, offsets, lengths, reader = _located_file(tmp_path / "t.parquet", 200, 50, 3)
    ask = np.array([3, 120, 7, *range(150, 190), 3])  # pages of groups 0 and 2; 3 decoded
    got = reader.fetch(ask, offsets[ask], lengths[ask], narrow=True)
    assert isinstance(got, RowSlices) and got.values.dtype == np.uint16
    assert_payloads_equal(list(got), [rows[i] for i in ask])
    assert_payloads_equal(got[2:], [rows[i] for i in ask[2:]])
    one = np.array([9, 5, 40, 5])  # one group's rows, all from pages, in the order asked
    for narrow in (True, False):
        got = reader.fetch(one, offsets[one], lengths[one], rent=True, narrow=narrow)
        assert isinstance(got, RowSlices)
        assert got.values.dtype == (np.uint16 if narrow else np.int32)
        assert_payloads_equal(list(got), [rows[i] for i in one])
    reader.close()


def test_parquet_rows_from_pages_stay_from_pages_when_the_cache_has_no_room(tmp_path, monkeypatch):
    monkeypatch.setenv("MDS_PAGE_READS", "on")
    rows, offsets, lengths, reader = _located_file(tmp_path / "t.parquet", 100, 100, 4)
    rng = np.random.default_rng(4)
    reader._room = lambda i: False
    for _ in range(4):
        ask = rng.choice(100, 3, replace=False)
        assert reader.page_groups(ask, offsets[ask], lengths[ask])
        assert_payloads_equal(reader.fetch(ask, offsets[ask], lengths[ask]), [rows[i] for i in ask])
    reader.close()


def test_parquet_rented_rows_stay_from_pages_and_cache_nothing(tmp_path, monkeypatch):
    """Rows asked with later samples' rows (`rent`) are read from pages however often the
    group is asked, with room in the cache: nothing is decoded whole or cached. Without
    `rent` the same reads switch to a whole decode after `_PAGED_READS`."""
    monkeypatch.setenv("MDS_PAGE_READS", "on")
    for rent in (True, False):
        rows, offsets, lengths, reader = _located_file(tmp_path / f"t{rent}.parquet", 100, 100, 5)
        whole: list[int] = []
        inner = reader._read
        reader._read = lambda i, need, n, row, own=True, w=whole, f=inner: (
            w.append(i) or f(i, need, n, row, own)
        )
        for k in range(parquet_reader._PAGED_READS + 2):
            ask = np.array([k, 50 + k])
            got = reader.fetch(ask, offsets[ask], lengths[ask], rent=rent)
            assert_payloads_equal(got, [rows[i] for i in ask])
        if rent:
            assert whole == [] and reader._blocks.nbytes == 0
        else:
            assert whole == [0] and reader._blocks.nbytes > 0
        reader.close()


def test_parquet_located_rows_with_empty_lists_are_decoded_whole(tmp_path):
    table, rows = _token_table(100)  # every 7th row is an empty list
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=50)
    offsets, lengths = _located(path, rows)
    ask = np.array([0, 14, 22, 71])
    reader = reader_for("parquet", path, "token_ids", "tokens")
    assert_payloads_equal(reader.fetch(ask, offsets[ask], lengths[ask]), [rows[i] for i in ask])
    reader.close()


def test_uncached_decodes_of_several_groups_hold_one_reservation_at_a_time(tmp_path):
    """Rows of several row groups read once (keep=False) under a budget with room for one
    group's decode at a time: each group's reservation is let go before the next is made,
    so the read neither waits on itself nor goes over the room."""
    from mds.core.memory_budget import BudgetCache, MemoryBudget

    rows, _offsets, _lengths, _ = _located_file(tmp_path / "t.parquet", 200, 50, 3)
    budget = MemoryBudget(1 << 20)
    cache = BudgetCache(0, budget)
    reader = reader_for("parquet", tmp_path / "t.parquet", "token_ids", "tokens", cache)
    per_group = int(reader._meta.decode_sizes("tokens").max())
    budget.room = per_group + per_group // 2  # one group's decode fits, two do not
    ask = np.array([3, 70, 120, 190])
    got = reader.fetch(ask, keep=False)
    assert [g.tolist() for g in got] == [rows[r] for r in ask]
    assert budget.reserved == 0 and 0 < budget.peak <= budget.room


@pytest.mark.parametrize("page_reads", ["on", "off"])
def test_a_read_the_budget_can_never_hold_names_the_file_row_and_budget(
    tmp_path, monkeypatch, page_reads
):
    from mds.core.memory_budget import BudgetCache, MemoryBudget
    from mds.errors import ConfigError

    monkeypatch.setenv("MDS_PAGE_READS", page_reads)
    _rows, offsets, lengths, _ = _located_file(tmp_path / "t.parquet", 200, 200, 3)
    budget = MemoryBudget(4096, fixed=1024)
    reader = reader_for(
        "parquet", tmp_path / "t.parquet", "token_ids", "tokens", BudgetCache(0, budget)
    )
    ask = np.array([5])
    with pytest.raises(ConfigError) as info:
        reader.fetch(ask, offsets[ask], lengths[ask])
    text = str(info.value)
    unit = "a page and the rows asked of row group 0" if page_reads == "on" else "row group 0"
    assert text.startswith("t.parquet row 5: reading it decodes " + unit) or unit in text
    assert "memory_bytes=4096" in text and text.endswith("raise memory_bytes")


@pytest.fixture(scope="module")
def s3():
    from s3_store import s3_server

    with pytest.MonkeyPatch.context() as patch, s3_server(patch) as server:
        yield server


def _object_texts(s3, key: str, texts: list[str]) -> str:
    """A Parquet file of `texts` put at `key`; its URL."""
    import io

    out = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), out, row_group_size=2)
    s3.put(key, out.getvalue())
    return s3.url(key)


def test_an_objects_first_open_is_one_metadata_and_one_footer_request(s3, monkeypatch):
    """Opening an object's reader costs one HEAD (size and version, which key the footer
    cache and are what the catalog re-checks) and one suffix-range GET for the footer; a
    second open (footer cached) only the HEAD, and a rewritten object is parsed afresh."""
    from fault_proxy import fault_proxy

    url = _object_texts(s3, "first_open/a.parquet", ["a", "b", "c"])
    metacache.clear()
    with fault_proxy(s3, monkeypatch) as proxy:

        def opened() -> tuple[list, list]:
            before = len(proxy.log)
            reader = parquet_reader.ParquetReader(url, "text", "text", LRU(max_items=8), url)
            reader.close()
            methods = [m for m, *_ in proxy.log[before:]]
            return [m for m in methods if m == "HEAD"], [m for m in methods if m == "GET"]

        assert opened() == (["HEAD"], ["GET"])
        assert opened() == (["HEAD"], [])  # the footer came from the cache
        pins = parquet_reader.ParquetReader(url, "text", "text", LRU(max_items=8), url)
        pinned = pins.object.version
        pins.close()
        _object_texts(s3, "first_open/a.parquet", ["a", "b", "c", "d", "e"])
        assert opened() == (["HEAD"], ["GET"])  # another version: its own footer
        reader = parquet_reader.ParquetReader(url, "text", "text", LRU(max_items=8), url)
        assert reader.object.version != pinned  # what the catalog compares with its pin
        assert reader.starts[-1] == 5
        reader.close()
        before = len(proxy.log)
        assert parquet_reader.footer_meta(url, url)[1].starts[-1] == 5
        assert [m for m, *_ in proxy.log[before:]] == ["HEAD"]  # shared with the reader's
    metacache.clear()


def _large_object(s3, tmp_path: Path, key: str, seed: int):
    """One row group of 3,000 token lists in pages of about 4 KB, as a file and an object;
    the rows, their offsets and lengths, and the object's URL."""
    rng = np.random.default_rng(seed)
    rows = [rng.integers(0, 900, k).tolist() for k in rng.integers(1, 60, 3000)]
    path = tmp_path / f"{seed}.parquet"
    table = pa.table({"tokens": pa.array(rows, pa.list_(pa.int32()))})
    pq.write_table(table, path, row_group_size=3000, data_page_size=4096)
    offsets, lengths = _located(path, rows)
    s3.put(key, path.read_bytes())
    return rows, offsets, lengths, s3.url(key)


@pytest.fixture
def large_groups(monkeypatch):
    """Every row group counts as too large to fetch whole (read from its pages), a 16 KB
    reading buffer (chunks larger than it read page by page), pieces of 2 KB: the
    ReadAhead objects made are collected."""
    monkeypatch.setenv("MDS_PAGE_READS", "on")
    monkeypatch.setattr(parquet_reader.ParquetReader, "_large", lambda self, i: True)
    monkeypatch.setattr(parquet_pages, "WHOLE_CHUNK", 16 << 10)
    monkeypatch.setattr(parquet_reader, "_MIN_PIECE", 2048)
    made: list = []
    real = parquet_reader.ReadAhead

    def collected(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(parquet_reader, "ReadAhead", collected)
    return made


@pytest.mark.parametrize("seed", [1, 2])
def test_an_objects_large_row_group_is_read_with_its_pages_asked_ahead(
    s3, tmp_path, monkeypatch, large_groups, seed
):
    """Rows of an object's row group too large to fetch whole come from its pages, asked
    for ahead by several requests in flight (within the reading buffer) instead of one
    request per header and page: the same rows as pyarrow's, and as the serial reads', on a
    first read (pages found as read) and a second (pages the first one found)."""
    rows, offsets, lengths, url = _large_object(s3, tmp_path, f"large/{seed}.parquet", seed)
    rng = np.random.default_rng(seed)
    asks = [np.sort(rng.choice(3000, k, replace=False)) for k in (40, 7, 300)]
    metacache.clear()
    for serial in (False, True):
        if serial:  # one request per header and page read, in turn
            monkeypatch.setattr(parquet_reader.ParquetReader, "_read_ahead", lambda *a: None)
        reader = parquet_reader.ParquetReader(url, "token_ids", "tokens", LRU(1 << 20), url)
        for ask in asks:
            got = reader.fetch(ask, offsets[ask], lengths[ask], rent=True)
            assert_payloads_equal(got, [rows[i] for i in ask])
        reader.close()
    assert len(large_groups) == len(asks)
    assert all(0 < a.requests and a.peak <= 16 << 10 for a in large_groups)


def test_an_object_gone_while_its_pages_are_read_is_one_line_naming_it(
    s3, tmp_path, large_groups
):
    rows, offsets, lengths, url = _large_object(s3, tmp_path, "large/gone.parquet", 3)
    metacache.clear()
    reader = parquet_reader.ParquetReader(url, "token_ids", "tokens", LRU(1 << 20), url)
    s3.delete("large/gone.parquet")
    ask = np.array([5, 1500, 2900])
    with pytest.raises(SourceDataError, match=r"^s3://mds-test/large/gone\.parquet: ") as info:
        reader.fetch(ask, offsets[ask], lengths[ask])
    assert "\n" not in str(info.value) and large_groups
    reader.close()


def test_files_of_one_schema_share_its_facts(tmp_path):
    """Footers parsed one after another with the same schema and key-value metadata share
    what the schema decides (Arrow schema, checks, page layout); another schema, or the same
    columns with other metadata, gets its own, and rows read from each are their file's."""
    table, rows = _token_table(40)
    wide = table.cast(pa.schema([("tokens", pa.list_(pa.int64())), ("id", pa.int64())]))
    tagged = table.replace_schema_metadata({"tag": "x"})
    for name, t in [("a", table), ("b", table), ("c", wide), ("d", tagged), ("e", tagged)]:
        pq.write_table(t, tmp_path / f"{name}.parquet")
    metas = {
        name: parquet_reader._ParquetMeta(pq.read_metadata(tmp_path / f"{name}.parquet"))
        for name in "abcde"
    }
    assert metas["a"].schema is metas["b"].schema and metas["d"].schema is metas["e"].schema
    assert len({id(metas[n].schema) for n in "acd"}) == 3
    assert metas["a"].layout("tokens").dtype == np.int32
    assert metas["c"].layout("tokens").dtype == np.int64
    assert metas["d"].arrow_schema().metadata[b"tag"] == b"x"
    assert metas["a"].layout("tokens").meta is metas["a"].metadata  # chunks are per file
    assert metas["b"].layout("tokens").meta is metas["b"].metadata
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])[:-1]])
    picks = np.array([3, 17, 29])
    for name in "abcde":
        reader = reader_for("parquet", tmp_path / f"{name}.parquet", "token_ids", "tokens")
        lengths = np.array([len(rows[i]) for i in picks])
        got = reader.fetch(picks, offsets[picks], lengths)
        assert [list(g) for g in got] == [rows[i] for i in picks]
