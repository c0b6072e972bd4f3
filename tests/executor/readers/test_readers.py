"""Payload readers: every sample file read at random equals a plain sequential read, each format's
grouping and caching, and one test per user-data error message."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from mds.core import metacache
from mds.core.lru import LRU
from mds.errors import SourceDataError
from mds.executor.readers import open_reader
from mds.formats.megatron import write_dataset
from mds.formats.parquet import pages as parquet_pages
from mds.planner.index.parquet import group_offsets

SAMPLE = Path(__file__).resolve().parents[3] / "sample_data"


def line_spans(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(line number, byte offset, byte length) of every non-blank line, as the index has them."""
    rows, offsets, lengths = [], [], []
    position = 0
    for number, line in enumerate(data.split(b"\n")):
        if line.strip():
            rows.append(number)
            offsets.append(position)
            lengths.append(len(line))
        position += len(line) + 1
    return (np.array(x, dtype=np.int64) for x in (rows, offsets, lengths))  # type: ignore[return-value]


def unzstd(data: bytes) -> bytes:
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    return reader.read()


def reader_for(fmt, path, kind="text", column="text", blocks=None, companion=None, display=None):
    return open_reader(
        fmt,
        Path(path),
        payload_kind=kind,
        column=column,
        companion=companion,
        blocks=LRU(max_bytes=64 << 20) if blocks is None else blocks,
        display=display or Path(path).name,
    )


def shuffled_with_repeats(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.permutation(n), rng.integers(0, n, n // 3 + 1)]).astype(np.int64)


def assert_payloads_equal(got: list, expected: list) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        if isinstance(e, str):
            assert g == e
        else:
            assert isinstance(g, np.ndarray) and g.ndim == 1 and g.dtype.kind in "iu"
            assert g.tolist() == list(e)


def fetch_all(reader, order, offsets=None, lengths=None):
    try:
        if offsets is None:
            return reader.fetch(order, None, None)
        return reader.fetch(order, offsets, lengths)
    finally:
        reader.close()


# --- oracle: the real sample files ----------------------------------------------------------

CACHES = {"warm": lambda: LRU(max_bytes=64 << 20), "tiny": lambda: LRU(max_bytes=1)}


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


@pytest.mark.parametrize("kind, column", [("token_ids", "input_ids"), ("text", "text")])
def test_sample_arrow_stream_matches_read_all(kind, column):
    path = SAMPLE / "wiki/data-00000-of-00001.arrow"
    with pa.memory_map(str(path)) as source:
        expected = pa.ipc.open_stream(source).read_all().column(column).to_pylist()
    order = shuffled_with_repeats(len(expected))
    got = fetch_all(reader_for("arrow", path, kind, column), order)
    assert_payloads_equal(got, [expected[i] for i in order])


def test_sample_jsonl_matches_json_lines():
    path = SAMPLE / "forum/forum.jsonl"
    data = path.read_bytes()
    rows, offsets, lengths = line_spans(data)
    lines = data.split(b"\n")
    order = shuffled_with_repeats(len(rows))
    got = fetch_all(reader_for("jsonl", path), rows[order], offsets[order], lengths[order])
    assert_payloads_equal(got, [json.loads(lines[rows[i]])["text"] for i in order])


@pytest.mark.parametrize("cache", sorted(CACHES))
@pytest.mark.parametrize("name", ["code-00000.jsonl.zst", "code-00001.jsonl.zst"])
def test_sample_jsonl_zst_matches_full_decompression(name, cache):
    path = SAMPLE / "code" / name
    data = unzstd(path.read_bytes())
    rows, offsets, lengths = line_spans(data)
    lines = data.split(b"\n")
    order = shuffled_with_repeats(len(rows))
    reader = reader_for("jsonl.zst", path, "text", "content", CACHES[cache]())
    assert len(reader.frames) == (1 if name == "code-00000.jsonl.zst" else 3)
    got = fetch_all(reader, rows[order], offsets[order], lengths[order])
    assert_payloads_equal(got, [json.loads(lines[rows[i]])["content"] for i in order])


def test_sample_megatron_matches_the_bin():
    prefix = SAMPLE / "math/math_text_document"
    idx = prefix.with_suffix(".idx").read_bytes()
    n = int.from_bytes(idx[18:26], "little")
    sizes = np.frombuffer(idx, dtype="<i4", count=n, offset=34)
    tokens = np.fromfile(prefix.with_suffix(".bin"), dtype="<u2")
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    expected = [tokens[bounds[i] : bounds[i + 1]] for i in range(n)]
    order = shuffled_with_repeats(n)
    reader = reader_for(
        "megatron",
        prefix.with_suffix(".bin"),
        "token_ids",
        "",
        companion=prefix.with_suffix(".idx"),
    )
    assert_payloads_equal(fetch_all(reader, order), [expected[i].tolist() for i in order])


# --- Parquet --------------------------------------------------------------------------------


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


def test_missing_and_unreadable_files(tmp_path):
    for fmt in ("parquet", "arrow", "jsonl", "jsonl.zst"):
        with pytest.raises(
            SourceDataError, match=r"^data/gone: cannot open \(No such file or directory\)$"
        ):
            reader_for(fmt, tmp_path / "gone", display="data/gone")
    junk = tmp_path / "junk"
    junk.write_bytes(b"this is not a columnar file at all\n")
    with pytest.raises(SourceDataError, match=r"^junk: not a readable Parquet file \("):
        reader_for("parquet", junk)
    with pytest.raises(SourceDataError, match=r"^junk: not a readable Arrow IPC file or stream \("):
        reader_for("arrow", junk)


def test_bad_arguments_are_programming_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown source format 'csv'"):
        reader_for("csv", tmp_path / "x")
    with pytest.raises(ValueError, match="unknown payload kind"):
        reader_for("parquet", tmp_path / "x", kind="image")
    with pytest.raises(ValueError, match="needs the payload column"):
        reader_for("parquet", tmp_path / "x", column="")
    with pytest.raises(ValueError, match="companion"):
        reader_for("megatron", tmp_path / "x.bin", "token_ids", "")


# --- Arrow ----------------------------------------------------------------------------------


def _batches(n: int, per_batch: int) -> tuple[pa.Schema, list[pa.RecordBatch], list]:
    rows = [list(range(i % 11)) for i in range(n)]
    table = pa.table(
        {"text": [f"row {i}" for i in range(n)], "input_ids": pa.array(rows, pa.list_(pa.int64()))}
    )
    return table.schema, table.to_batches(max_chunksize=per_batch), rows


@pytest.mark.parametrize("layout", ["file", "stream"])
def test_arrow_file_and_stream_random_access(tmp_path, layout):
    schema, batches, rows = _batches(95, 10)
    path = tmp_path / f"x.{layout}.arrow"
    opener = pa.ipc.new_file if layout == "file" else pa.ipc.new_stream
    with pa.OSFile(str(path), "wb") as sink, opener(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    order = shuffled_with_repeats(95)
    reader = reader_for("arrow", path, "token_ids", "input_ids")
    assert reader.starts.tolist() == list(range(0, 91, 10)) + [95]
    assert_payloads_equal(reader.fetch(order, None, None), [rows[i] for i in order])
    got = reader_for("arrow", path).fetch(np.array([94, 0]), None, None)
    assert got == ["row 94", "row 0"]
    with pytest.raises(SourceDataError, match=r"row 95 is beyond the file's 95 rows"):
        reader.fetch(np.array([95]), None, None)
    reader.close()


def test_arrow_token_payloads_are_read_only_views(tmp_path):
    schema, batches, _ = _batches(20, 20)
    path = tmp_path / "x.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(batches[0])
    reader = reader_for("arrow", path, "token_ids", "input_ids")
    payload = reader.fetch(np.array([5]), None, None)[0]
    assert not payload.flags.writeable
    reader.close()


def test_arrow_errors(tmp_path):
    table = pa.table({"input_ids": pa.array([[1], None], pa.list_(pa.int32())), "n": [1.0, 2.0]})
    path = tmp_path / "wiki/data.arrow"
    path.parent.mkdir()
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    reader = reader_for("arrow", path, "token_ids", "input_ids", display="wiki/data.arrow")
    with pytest.raises(
        SourceDataError, match=r"^wiki/data\.arrow row 1: column 'input_ids' is null$"
    ):
        reader.fetch(np.array([1]), None, None)
    with pytest.raises(SourceDataError, match=r"^wiki/data\.arrow has no column 'tokens'"):
        reader_for("arrow", path, "token_ids", "tokens", display="wiki/data.arrow")
    with pytest.raises(SourceDataError, match=r"column 'n' is double, not text"):
        reader_for("arrow", path, "text", "n")


# --- JSONL ----------------------------------------------------------------------------------


def _jsonl(tmp_path: Path, lines: list[str], name="forum/forum.jsonl") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(("\n".join(lines) + "\n").encode())
    return path


def _line(path: Path, number: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Location of 1-based line `number` of the file (blank or not)."""
    data = path.read_bytes()
    offset = sum(len(x) + 1 for x in data.split(b"\n")[: number - 1])
    length = len(data.split(b"\n")[number - 1])
    return np.array([number - 1]), np.array([offset]), np.array([length])


def test_jsonl_blank_lines_keep_their_numbers_and_requests_keep_order(tmp_path):
    path = _jsonl(
        tmp_path, ['{"text": "a"}', "", "  ", '{"text": "b", "x": 1}', '{"text": "\\u00e9\\n"}']
    )
    rows, offsets, lengths = line_spans(path.read_bytes())
    assert rows.tolist() == [0, 3, 4]
    order = np.array([2, 0, 1, 2, 2])
    got = fetch_all(reader_for("jsonl", path), rows[order], offsets[order], lengths[order])
    assert got == ["é\n", "a", "b", "é\n", "é\n"]


def test_jsonl_token_ids(tmp_path):
    path = _jsonl(tmp_path, ['{"tokens": [1, 2, 300000]}', '{"tokens": []}'])
    rows, offsets, lengths = line_spans(path.read_bytes())
    got = fetch_all(reader_for("jsonl", path, "token_ids", "tokens"), rows, offsets, lengths)
    assert [g.tolist() for g in got] == [[1, 2, 300000], []]
    assert all(g.dtype.kind in "iu" for g in got)


JSONL_ERRORS = [
    (
        '{"text": "unterminated',
        "text",
        "text",
        r"invalid JSON \(Unterminated string starting at column 10\)",
    ),
    ("[1, 2]", "text", "text", r"expected a JSON object, got a list"),
    ('{"body": "x"}', "text", "text", r"has no field 'text'"),
    ('{"text": null}', "text", "text", r"field 'text' is null"),
    ('{"text": 5}', "text", "text", r"field 'text' is an integer, not text"),
    (
        '{"tokens": [1, 2.5]}',
        "token_ids",
        "tokens",
        r"field 'tokens' is not a list of integer token ids \(holds a number \(2\.5\)\)",
    ),
    (
        '{"tokens": [1, "a"]}',
        "token_ids",
        "tokens",
        r"field 'tokens' is not a list of integer token ids \(holds a string \(\"a\"\)\)",
    ),
    (
        '{"tokens": [[1], [2]]}',
        "token_ids",
        "tokens",
        r"field 'tokens' is not a list of integer token ids \(holds a list \(\[1\]\)\)",
    ),
    (
        '{"tokens": [true, false]}',
        "token_ids",
        "tokens",
        r"field 'tokens' is not a list of integer token ids \(holds a boolean \(true\)\)",
    ),
    (
        '{"tokens": "1 2 3"}',
        "token_ids",
        "tokens",
        r"field 'tokens' is a string, not a list of integer token ids",
    ),
    (
        '{"tokens": [99999999999999999999999]}',
        "token_ids",
        "tokens",
        r"field 'tokens' is not a list of integer token ids \(holds an integer that does not fit int64\)",
    ),
]


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.zst"])
@pytest.mark.parametrize("bad, kind, column, message", JSONL_ERRORS)
def test_jsonl_line_errors_name_file_line_and_byte(tmp_path, fmt, bad, kind, column, message):
    lines = ['{"text": "ok", "tokens": [1]}'] * 11 + [bad]
    path = _jsonl(tmp_path, lines)
    if fmt == "jsonl.zst":
        data = path.read_bytes()
        path = tmp_path / "forum/forum.jsonl.zst"
        cctx = zstandard.ZstdCompressor()
        path.write_bytes(cctx.compress(data[:100]) + cctx.compress(data[100:]))
    rows, offsets, lengths = _line(tmp_path / "forum/forum.jsonl", 12)
    shown = f"forum/{path.name}"
    reader = reader_for(fmt, path, kind, column, display=shown)
    with pytest.raises(
        SourceDataError,
        match=rf"^{shown.replace('.', '[.]')} line 12 \(byte {offsets[0]}\): {message}",
    ):
        reader.fetch(rows, offsets, lengths)
    reader.close()


def test_jsonl_invalid_utf8(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n')
    with pytest.raises(
        SourceDataError,
        match=r"^x\.jsonl line 2 \(byte 15\): invalid UTF-8 at byte 10 of the line$",
    ):
        reader_for("jsonl", path).fetch(np.array([1]), np.array([15]), np.array([14]))


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.zst"])
def test_jsonl_locations_that_no_longer_fit(tmp_path, fmt):
    data = b'{"text": "first"}\n{"text": "second"}\n'
    path = tmp_path / f"x.{fmt}"
    path.write_bytes(zstandard.ZstdCompressor().compress(data) if fmt == "jsonl.zst" else data)
    reader = reader_for(fmt, path)
    what = "decompressed stream" if fmt == "jsonl.zst" else "file"
    with pytest.raises(
        SourceDataError,
        match=rf"line 3 \(byte 36\) is beyond the end of the {what} \(37 bytes; file changed since indexing\?\)$",
    ):
        reader.fetch(np.array([0, 2]), np.array([0, 36]), np.array([17, 5]))
    with pytest.raises(SourceDataError, match=r"line 2 \(byte 17\): no line starts and ends there"):
        reader.fetch(np.array([1]), np.array([17]), np.array([19]))  # off by one: starts at \n
    with pytest.raises(SourceDataError, match=r"line 1 \(byte 0\): no line starts and ends there"):
        reader.fetch(np.array([0]), np.array([0]), np.array([16]))  # too short: ends at "}"
    reader.close()


def test_jsonl_file_shrunk_after_open(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"text": "first"}\n{"text": "second"}\n')
    reader = reader_for("jsonl", path)
    path.write_bytes(b'{"text": "first"}\n{"text": "se')
    with pytest.raises(SourceDataError, match=r"^x\.jsonl line 2 \(byte 18\): no line starts"):
        reader.fetch(np.array([1]), np.array([18]), np.array([18]))
    reader.close()


def test_jsonl_needs_offsets(tmp_path):
    path = _jsonl(tmp_path, ['{"text": "a"}'])
    with pytest.raises(ValueError, match="offsets and lengths"):
        reader_for("jsonl", path).fetch(np.array([0]), None, None)


# --- JSONL.zst ------------------------------------------------------------------------------


@pytest.mark.parametrize("max_bytes", [1 << 20, 1, 300])
def test_jsonl_zst_lines_spanning_frames(tmp_path, max_bytes):
    rng = np.random.default_rng(3)
    lines = [
        json.dumps({"content": "w" * int(n), "i": i})
        for i, n in enumerate(rng.integers(0, 400, 60))
    ]
    data = ("\n".join(lines) + "\n").encode()
    cuts = sorted(rng.integers(0, len(data), 12).tolist())
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    blob = b"".join(
        zstandard.ZstdCompressor(write_content_size=bool(i % 2)).compress(p)
        for i, p in enumerate(pieces)
    )
    path = tmp_path / "x.jsonl.zst"
    path.write_bytes(blob)
    rows, offsets, lengths = line_spans(data)
    order = shuffled_with_repeats(len(rows), seed=4)
    reader = reader_for("jsonl.zst", path, "text", "content", LRU(max_bytes=max_bytes))
    got = reader.fetch(rows[order], offsets[order], lengths[order])
    assert got == [json.loads(lines[i])["content"] for i in order]
    reader.close()


def test_jsonl_zst_truncated_file(tmp_path):
    blob = zstandard.ZstdCompressor().compress(b'{"text": "a"}\n' * 1000)
    path = tmp_path / "code/x.jsonl.zst"
    path.parent.mkdir()
    path.write_bytes(blob[:-3])
    with pytest.raises(SourceDataError, match=r"^code/x\.jsonl\.zst: truncated zstd file"):
        reader_for("jsonl.zst", path, display="code/x.jsonl.zst")


# --- Megatron -------------------------------------------------------------------------------


def test_megatron_round_trip_and_errors(tmp_path):
    sequences = [np.arange(i, dtype=np.int64) * 3 for i in range(30)]
    (tmp_path / "math").mkdir()
    bin_path, idx_path = write_dataset(tmp_path / "math/m", sequences, dtype=np.int32)
    reader = reader_for(
        "megatron", bin_path, "token_ids", "", companion=idx_path, display="math/m.bin"
    )
    order = np.array([29, 0, 7, 7])
    assert_payloads_equal(reader.fetch(order, None, None), [sequences[i] for i in order])
    with pytest.raises(
        SourceDataError,
        match=r"^math/m\.bin sequence 30 is beyond the file's 30 sequences \(file changed since indexing\?\)$",
    ):
        reader.fetch(np.array([30]), None, None)
    reader.close()
    bin_path.write_bytes(bin_path.read_bytes()[:-4])
    with pytest.raises(
        SourceDataError, match=r"^math/m\.bin: Megatron \.bin is \d+ bytes but m\.idx implies"
    ):
        reader_for("megatron", bin_path, "token_ids", "", companion=idx_path, display="math/m.bin")
    idx_path.write_bytes(b"garbage" * 10)
    with pytest.raises(SourceDataError, match=r"^math/m\.idx: not a Megatron \.idx file"):
        reader_for("megatron", bin_path, "token_ids", "", companion=idx_path, display="math/m.bin")
    idx_path.unlink()
    with pytest.raises(
        SourceDataError, match=r"^math/m\.idx: cannot open \(No such file or directory\)$"
    ):
        reader_for("megatron", bin_path, "token_ids", "", companion=idx_path, display="math/m.bin")


def test_megatron_float_data_is_not_token_ids(tmp_path):
    bin_path, idx_path = write_dataset(tmp_path / "f", [np.ones(3)], dtype=np.float32)
    with pytest.raises(
        SourceDataError, match=r"^f\.bin: Megatron dtype is float32, not integer token ids$"
    ):
        reader_for("megatron", bin_path, "token_ids", "", companion=idx_path, display="f.bin")


# --- file metadata kept apart from open handles -----------------------------------------------


def _count_calls(monkeypatch, owner, name: str, counted=lambda *a, **kw: True) -> list:
    calls: list = []
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        if counted(*args, **kwargs):
            calls.append(args)
        return inner(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return calls


def _reopen_fetch(open_one, fetch_args, times: int = 3) -> list:
    """Open, fetch and close the same file `times` times, as an evicted handle would be."""
    out = []
    for _ in range(times):
        reader = open_one()
        out.append(reader.fetch(*fetch_args))
        reader.close()
    return out


def test_parquet_footer_is_parsed_once_across_reopens(tmp_path, monkeypatch):
    import mds.executor.readers as readers

    table, rows = _token_table(50)
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=10)
    parses = _count_calls(monkeypatch, readers, "_ParquetMeta")
    blocks = LRU(max_bytes=1 << 20)
    got = _reopen_fetch(
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
    import mds.executor.readers as readers

    wide = pa.table({f"c{i:03d}": pa.array([i], pa.int64()) for i in range(300)})
    for name, table in [("small", _token_table(50)[0]), ("wide", wide)]:
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table, path, row_group_size=10)
        source = pa.OSFile(str(path))
        footer = readers._footer(source)
        source.close()
        assert footer is not None and footer.equals(pq.read_metadata(path))
    # The wide footer is longer than the first read of the tail: it is read again whole.
    assert pq.read_metadata(tmp_path / "wide.parquet").serialized_size > readers._FOOTER_TAIL

    path = tmp_path / "small.parquet"
    data = path.read_bytes()
    for damaged in [data[:-1] + b"X", data[:-8] + (10**6).to_bytes(4, "little") + b"PAR1", b"PAR1"]:
        path.write_bytes(damaged)
        with pa.OSFile(str(path)) as source:
            assert readers._footer(source) is None  # pq.ParquetFile parses it and says why
        with pytest.raises(SourceDataError, match="not a readable Parquet file"):
            reader_for("parquet", path, "token_ids", "tokens", LRU(max_bytes=1 << 20))
    # A pyarrow without the footer parser: ParquetFile parses it, with the same rows.
    path.write_bytes(data)
    monkeypatch.delattr(readers._pq, "_reconstruct_filemetadata")
    with pa.OSFile(str(path)) as source:
        assert readers._footer(source) is None
    reader = reader_for("parquet", path, "token_ids", "tokens", LRU(max_bytes=1 << 20))
    assert_payloads_equal(reader.fetch(np.array([7]), None, None), [_token_table(50)[1][7]])
    reader.close()


def test_zstd_frame_table_is_walked_once_across_reopens(tmp_path, monkeypatch):
    import mds.formats.zstd_frames as zstd_seek

    data = b"".join(b'{"text": "line %d"}\n' % i for i in range(100))
    path = tmp_path / "x.jsonl.zst"
    compressor = zstandard.ZstdCompressor()
    path.write_bytes(compressor.compress(data[:700]) + compressor.compress(data[700:]))
    rows, offsets, lengths = line_spans(data)
    walks = _count_calls(monkeypatch, zstd_seek, "_walk")
    blocks = LRU(max_bytes=1 << 20)
    got = _reopen_fetch(
        lambda: reader_for("jsonl.zst", path, blocks=blocks), (rows, offsets, lengths)
    )
    assert len(walks) == 1
    assert got[-1] == [f"line {i}" for i in range(100)]


def test_megatron_open_reads_a_constant_part_of_the_index(tmp_path, monkeypatch):
    """Opening reads the header and two entries; a fetch 12 .idx bytes per sequence: the
    cost follows what is read, not the number of sequences."""
    import os as os_module

    reads: list[tuple[int, int]] = []
    real = os_module.pread

    def counting(fd, size, offset):
        reads.append((size, offset))
        return real(fd, size, offset)

    for count in (10, 5000):
        sequences = [np.full(1 + i % 7, i, dtype=np.int64) for i in range(count)]
        bin_path, idx_path = write_dataset(tmp_path / f"m{count}", sequences, dtype=np.int32)
        monkeypatch.setattr(os_module, "pread", counting)
        reads.clear()
        reader = reader_for("megatron", bin_path, "token_ids", "", companion=idx_path)
        opened = list(reads)
        got = reader.fetch(np.array([count - 1, 0, 3]), None, None)
        reader.close()
        monkeypatch.undo()
        assert_payloads_equal(got, [sequences[count - 1], sequences[0], sequences[3]])
        assert len(opened) == 2 and sum(size for size, _ in opened) == 12
        assert len(reads) == 2 + 3 * 3  # per sequence: size, pointer, data


def test_megatron_bad_entry_of_a_read_sequence(tmp_path):
    """An index damaged after indexing: the sequence read names the .idx and the problem."""
    sequences = [np.arange(i + 1, dtype=np.int64) for i in range(20)]
    bin_path, idx_path = write_dataset(tmp_path / "m", sequences, dtype=np.int32)
    raw = bytearray(idx_path.read_bytes())
    raw[34 + 4 * 5 : 34 + 4 * 6] = (-3).to_bytes(4, "little", signed=True)  # size of 5
    raw[34 + 4 * 20 + 8 * 7 : 34 + 4 * 20 + 8 * 8] = (10**9).to_bytes(8, "little")  # pointer of 7
    idx_path.write_bytes(bytes(raw))
    reader = reader_for("megatron", bin_path, "token_ids", "", companion=idx_path)
    assert_payloads_equal(reader.fetch(np.array([4]), None, None), [sequences[4]])
    with pytest.raises(SourceDataError, match=r"^m\.idx: sequence 5 has negative size -3$"):
        reader.fetch(np.array([5]), None, None)
    with pytest.raises(SourceDataError, match=r"^m\.idx: sequence 7: pointer 1000000000 .* leave"):
        reader.fetch(np.array([7]), None, None)
    reader.close()


@pytest.fixture
def small_metacache():
    """Let a test set the metadata cache's bound; restores the bound and empties it after."""
    before = metacache.max_bytes()
    metacache.clear()
    yield metacache
    metacache.configure(before)
    metacache.clear()


def test_a_rewritten_megatron_index_is_read_afresh(tmp_path):
    """Nothing of a Megatron file is cached across opens: a rewrite is seen at once."""
    sequences = [np.arange(i + 1, dtype=np.int64) for i in range(20)]
    bin_path, idx_path = write_dataset(tmp_path / "m", sequences, dtype=np.int32)
    blocks = LRU(max_bytes=1 << 20)
    reader_for("megatron", bin_path, "token_ids", "", blocks, companion=idx_path).close()
    shorter = [s + 1 for s in sequences[:5]]
    write_dataset(tmp_path / "m", shorter, dtype=np.int32)
    reader = reader_for("megatron", bin_path, "token_ids", "", blocks, companion=idx_path)
    assert_payloads_equal(reader.fetch(np.array([4]), None, None), [shorter[4]])
    with pytest.raises(SourceDataError, match="sequence 5 is beyond"):
        reader.fetch(np.array([5]), None, None)
    reader.close()


def test_metadata_cache_stays_within_its_bytes(tmp_path, monkeypatch, small_metacache):
    import mds.executor.readers as readers

    table, rows = _token_table(40)
    paths = []
    for i in range(6):
        paths.append(tmp_path / f"t{i}.parquet")
        pq.write_table(table, paths[-1], row_group_size=10)
    parses = _count_calls(monkeypatch, readers, "_ParquetMeta")
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
    import mds.executor.readers as readers

    table, rows = _token_table(40)
    paths = [tmp_path / f"t{i}.parquet" for i in range(4)]
    for path in paths:
        pq.write_table(table, path, row_group_size=40)
    parses = _count_calls(monkeypatch, readers, "_ParquetMeta")
    blocks = LRU(max_bytes=1)  # no row group fits
    for _ in range(3):
        for path in paths:
            reader = reader_for("parquet", path, "token_ids", "tokens", blocks)
            assert_payloads_equal(reader.fetch(np.array([39, 0]), None, None), [rows[39], rows[0]])
            reader.close()
    assert len(parses) == 4


def test_a_file_changing_while_opened_is_parsed_afresh_and_not_cached(tmp_path, monkeypatch):
    import mds.executor.readers as readers

    table, rows = _token_table(30)
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=10)
    reader_for("parquet", path, "token_ids", "tokens").close()  # footer cached
    parses = _count_calls(monkeypatch, readers, "_ParquetMeta")
    real = readers._version
    calls = []

    def moving(kind, p, display):  # the second stat of each open sees another version
        calls.append(kind)
        key = real(kind, p, display)
        return key if len(calls) % 2 else (*key[:-1], key[-1] + 1)

    monkeypatch.setattr(readers, "_version", moving)
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


def test_parquet_located_rows_with_empty_lists_are_decoded_whole(tmp_path):
    table, rows = _token_table(100)  # every 7th row is an empty list
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=50)
    offsets, lengths = _located(path, rows)
    ask = np.array([0, 14, 22, 71])
    reader = reader_for("parquet", path, "token_ids", "tokens")
    assert_payloads_equal(reader.fetch(ask, offsets[ask], lengths[ask]), [rows[i] for i in ask])
    reader.close()
