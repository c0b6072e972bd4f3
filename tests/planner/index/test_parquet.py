"""The Parquet scanner: exact lengths from list columns and count columns, text lengths, kept
metadata, and one-line errors naming the file and row."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from builders import ctx, data_file, source, write_parquet, write_tokenizer
from literal_names import IDS, NAMES, write_with_decoy

from mds.errors import SourceDataError
from mds.formats.parquet.levels import list_lengths
from mds.planner.index import lengths
from mds.planner.index.parquet import group_offsets, scan_parquet

TOKENS = [[5, 6, 7], [], [1] * 40, [9], list(range(300))]


def _scan(path: Path, tok_path: Path | None = None, **table) -> pl.DataFrame:
    return scan_parquet(data_file(path), ctx(source(**table), "parquet", tok_path))


def _error(path: Path, **table) -> str:
    with pytest.raises(SourceDataError) as info:
        _scan(path, **table)
    message = str(info.value)
    assert message.startswith(f"{path.name}"), message
    return message


@pytest.mark.parametrize(
    "list_type",
    [pa.list_(pa.int32()), pa.large_list(pa.int64()), pa.list_(pa.uint16())],
    ids=str,
)
def test_token_lists_give_exact_lengths(tmp_path: Path, list_type: pa.DataType) -> None:
    path = write_parquet(tmp_path / "a.parquet", {"tokens": pa.array(TOKENS, list_type)})
    frame = _scan(path, tokens="tokens")
    assert frame.columns == ["file_row", "n_tokens", "offset"]
    assert frame.schema["n_tokens"] == pl.UInt32
    assert frame["n_tokens"].to_list() == [len(t) for t in TOKENS]
    assert frame["file_row"].to_list() == list(range(len(TOKENS)))


@pytest.mark.parametrize(
    "options",
    [
        {"row_group_size": 7, "data_page_size": 256},
        {"use_dictionary": False, "compression": "none"},
        {"data_page_version": "2.0", "compression": "snappy"},
    ],
    ids=["many-pages", "plain", "v2-pages"],
)
def test_token_lengths_across_row_groups_and_pages(tmp_path: Path, options: dict) -> None:
    tokens = [list(range(i % 23)) + [None] * (i % 3) for i in range(200)]
    path = write_parquet(
        tmp_path / "a.parquet", {"tokens": pa.array(tokens, pa.list_(pa.int32()))}, **options
    )
    # the levels count null ids too; the scan then refuses the first row holding one
    assert list_lengths(path, "tokens").tolist() == [len(t) for t in tokens]
    with pytest.raises(SourceDataError, match="^a.parquet row 1: token id null is not"):
        _scan(path, tokens="tokens")
    tokens = [list(range(i % 23)) for i in range(200)]
    path = write_parquet(
        tmp_path / "a.parquet", {"tokens": pa.array(tokens, pa.list_(pa.int32()))}, **options
    )
    assert _scan(path, tokens="tokens")["n_tokens"].to_list() == [len(t) for t in tokens]


def test_count_column(tmp_path: Path) -> None:
    counts = [3, 0, 2**31, 17]
    path = write_parquet(
        tmp_path / "b.parquet", {"n": pa.array(counts, pa.int64()), "t": list("abcd")}
    )
    frame = _scan(path, count="n", text="t")
    assert frame["n_tokens"].to_list() == counts
    assert frame.columns == ["file_row", "n_tokens"]


@pytest.mark.parametrize("int_type", [pa.int8(), pa.uint32(), pa.int32()], ids=str)
def test_count_column_any_integer_type(tmp_path: Path, int_type: pa.DataType) -> None:
    path = write_parquet(tmp_path / "b.parquet", {"n": pa.array([1, 2, 3], int_type)})
    assert _scan(path, count="n")["n_tokens"].to_list() == [1, 2, 3]


def test_count_above_uint32_is_an_error(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "b.parquet", {"n": pa.array([1, 2**32], pa.int64())})
    assert "b.parquet row 1: length 4294967296 exceeds 4294967295" in _error(path, count="n")


def test_estimate_bytes_rounds_up(tmp_path: Path) -> None:
    texts = ["", "a", "abcd", "abcde", "héllo"]  # é is two bytes: 6 bytes
    path = write_parquet(tmp_path / "t.parquet", {"text": texts})
    frame = _scan(path, text="text", estimate="bytes/4")
    assert frame["n_tokens"].to_list() == [0, 1, 1, 2, 2]
    assert frame["n_tokens"].to_list() == [math.ceil(len(t.encode()) / 4) for t in texts]


def test_estimate_chars_on_non_ascii_text(tmp_path: Path) -> None:
    texts = ["日本語のテキスト", "ümlaut", "😀😀😀😀😀", "abc"]
    path = write_parquet(tmp_path / "t.parquet", {"text": texts})
    chars = _scan(path, text="text", estimate="chars/4")["n_tokens"].to_list()
    assert chars == [math.ceil(len(t) / 4) for t in texts] == [2, 2, 2, 1]
    fractional = _scan(path, text="text", estimate="chars/2.5")["n_tokens"].to_list()
    assert fractional == [math.ceil(len(t) / 2.5) for t in texts]
    nbytes = _scan(path, text="text", estimate="bytes/4")["n_tokens"].to_list()
    assert nbytes == [math.ceil(len(t.encode()) / 4) for t in texts] == [6, 2, 5, 1]


def test_text_with_a_tokenizer(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    tok = write_tokenizer(tmp_path / "tokenizer.json", ["the", "cat", "sat"])
    texts = ["the cat sat", "", "cat", "unknown words here too"]
    path = write_parquet(tmp_path / "t.parquet", {"text": texts})
    frame = _scan(path, tok, text="text", tokenizer="tokenizer.json")
    assert frame["n_tokens"].to_list() == [3, 0, 1, 4]


def test_kept_columns_are_preserved_in_order(tmp_path: Path) -> None:
    path = write_parquet(
        tmp_path / "k.parquet",
        {
            "tokens": pa.array([[1], [1, 2]], pa.list_(pa.int32())),
            "lang": ["en", None],
            "quality": [0.5, 0.25],
            "domain": pa.array(["a.com", "b.org"], pa.large_string()),
            "year": pa.array([2020, 2021], pa.int16()),
        },
    )
    frame = _scan(path, tokens="tokens", keep=["year", "lang", "quality", "domain"])
    assert frame.columns == ["file_row", "n_tokens", "offset", "year", "lang", "quality", "domain"]
    assert frame.to_dicts() == [
        {
            "file_row": 0,
            "n_tokens": 1,
            "offset": 0,
            "year": 2020,
            "lang": "en",
            "quality": 0.5,
            "domain": "a.com",
        },
        {
            "file_row": 1,
            "n_tokens": 2,
            "offset": 1,
            "year": 2021,
            "lang": None,
            "quality": 0.25,
            "domain": "b.org",
        },
    ]
    assert frame.schema["year"] == pl.Int16


def test_text_column_may_also_be_kept(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "k.parquet", {"n": [1, 2], "text": ["a", "b"]})
    frame = _scan(path, count="n", text="text", keep=["text"])
    assert frame["text"].to_list() == ["a", "b"]


@pytest.mark.parametrize("row_group_size", [1, 3, 1000])
def test_token_list_offsets_restart_at_each_row_group(tmp_path: Path, row_group_size) -> None:
    """`offset` is where a row's values start in its row group's leaf column: what the
    executor reads the row's pages with."""
    rows = [[1, 2], [], [3], [4, 5, 6], [7], [8, 9], [10]]
    path = tmp_path / "g.parquet"
    pq.write_table(
        pa.table({"t": pa.array(rows, pa.list_(pa.int32()))}), path, row_group_size=row_group_size
    )
    frame = _scan(path, tokens="t")
    want, values = [], 0
    for i, row in enumerate(rows):
        values = 0 if i % row_group_size == 0 else values
        want.append(values)
        values += len(row)
    assert frame["offset"].to_list() == want


def test_group_offsets_refuses_row_groups_that_disagree_with_the_column() -> None:
    assert group_offsets(np.array([2, 0, 3]), [2, 1]).tolist() == [0, 2, 0]
    assert group_offsets(np.array([], dtype=np.int64), [0, 0]).tolist() == []
    with pytest.raises(ValueError, match="row groups hold 2 rows"):
        group_offsets(np.array([2, 0, 3]), [2])


def test_zero_rows(tmp_path: Path) -> None:
    table = pa.table(
        {"tokens": pa.array([], pa.list_(pa.int32())), "lang": pa.array([], pa.string())}
    )
    path = write_parquet(tmp_path / "e.parquet", table)
    frame = _scan(path, tokens="tokens", keep=["lang"])
    assert frame.height == 0
    assert frame.columns == ["file_row", "n_tokens", "offset", "lang"]


# --- errors ----------------------------------------------------------------------------------


def test_missing_column_lists_the_available_columns(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "a.parquet", {"ids": [[1]], "lang": ["en"]})
    message = _error(path, tokens="tokens")
    assert message == "a.parquet: column `tokens` not found; columns are ids, lang"
    assert "column `region` not found; columns are ids, lang" in _error(
        path, tokens="ids", keep=["region"]
    )


@pytest.mark.parametrize(
    ("data", "table", "expected"),
    [
        ({"n": [1.0, 2.0]}, {"count": "n"}, "column `n` has type Float64, expected an integer"),
        ({"t": ["a b"]}, {"tokens": "t"}, "column `t` has type String, expected a list of integer"),
        ({"t": [[0.5]]}, {"tokens": "t"}, "has type List(Float64), expected a list of integer"),
        (
            {"x": [7]},
            {"text": "x", "estimate": "bytes/4"},
            "column `x` has type Int64, expected a string",
        ),
        (
            {"n": [1], "x": [7]},
            {"count": "n", "text": "x"},
            "column `x` has type Int64, expected a string",
        ),
    ],
    ids=["float-count", "string-tokens", "float-tokens", "int-text", "int-payload"],
)
def test_wrong_column_type(tmp_path: Path, data: dict, table: dict, expected: str) -> None:
    path = write_parquet(tmp_path / "w.parquet", data)
    assert expected in _error(path, **table)


def test_null_in_count_column_names_the_row(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "n.parquet", {"n": pa.array([4, 5, None, 6], pa.int64())})
    assert _error(path, count="n") == "n.parquet row 2: length is null"


def test_null_token_list_names_the_row(tmp_path: Path) -> None:
    tokens = pa.array([[1], [2, 3], [], None], pa.list_(pa.int32()))
    path = write_parquet(tmp_path / "n.parquet", {"tokens": tokens})
    assert _error(path, tokens="tokens") == "n.parquet row 3: length is null"


def test_null_text_names_the_row(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "n.parquet", {"text": ["a", None]})
    assert _error(path, text="text", estimate="bytes/4") == "n.parquet row 1: length is null"


def test_negative_count_names_the_row(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "n.parquet", {"n": [1, 2, 3, -7]})
    assert _error(path, count="n") == "n.parquet row 3: length is negative (-7)"


@pytest.fixture
def good(tmp_path: Path) -> bytes:
    path = write_parquet(
        tmp_path / "good.parquet", {"tokens": pa.array(TOKENS, pa.list_(pa.int32()))}
    )
    return path.read_bytes()


def test_corrupt_footer(tmp_path: Path, good: bytes) -> None:
    path = tmp_path / "bad.parquet"
    path.write_bytes(good[:-8] + b"\x00" * 8)
    assert "bad.parquet: cannot read Parquet file" in _error(path, tokens="tokens")


def test_corrupt_footer_length(tmp_path: Path, good: bytes) -> None:
    path = tmp_path / "bad.parquet"
    path.write_bytes(good[:-8] + (2**31 - 1).to_bytes(4, "little") + b"PAR1")
    assert "bad.parquet: cannot read Parquet file" in _error(path, tokens="tokens")


def test_truncated_file(tmp_path: Path, good: bytes) -> None:
    path = tmp_path / "cut.parquet"
    path.write_bytes(good[: len(good) // 2])
    assert "cut.parquet: cannot read Parquet file" in _error(path, tokens="tokens")


@pytest.mark.parametrize(
    "content", [b"", b"not a parquet file at all\n" * 4], ids=["empty", "text"]
)
def test_not_a_parquet_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "text.parquet"
    path.write_bytes(content)
    message = _error(path, tokens="tokens")
    assert message.startswith("text.parquet: cannot read Parquet file (")
    assert "\n" not in message


def test_tokenizing_reports_progress_batch_by_batch(tmp_path: Path, monkeypatch) -> None:
    """A text column counted with a tokenizer moves the progress bar as its batches are
    tokenized, up to the file's size at most (the build adds any rest)."""
    pytest.importorskip("tokenizers")
    monkeypatch.setattr(lengths, "TOKENIZE_BATCH", 10)
    tok = write_tokenizer(tmp_path / "tokenizer.json", ["the", "cat", "sat"])
    path = write_parquet(tmp_path / "t.parquet", {"text": ["the cat sat"] * 95})
    reported: list[int] = []
    spec = source(text="text", tokenizer="tokenizer.json")
    scan_parquet(data_file(path), ctx(spec, "parquet", tok, progress=reported.append))
    assert len(reported) >= 9 and all(n > 0 for n in reported)
    assert sum(reported) == path.stat().st_size


@pytest.mark.parametrize(("stem", "decoy"), NAMES, ids=IDS)
def test_a_file_name_with_glob_characters_is_read_as_it_is(
    tmp_path: Path, stem: str, decoy: str | None
) -> None:
    def write(path: Path, n: int) -> None:
        write_parquet(path, {"tokens": [[7] * n] * 2, "n": [n] * 2})

    path = write_with_decoy(tmp_path, stem, decoy, ".parquet", write)
    assert _scan(path, tokens="tokens")["n_tokens"].to_list() == [2, 2]
    assert _scan(path, count="n")["n_tokens"].to_list() == [2, 2]


@pytest.mark.parametrize("fast", [True, False], ids=["levels", "decoded"])
@pytest.mark.parametrize("statistics", [True, False], ids=["stats", "no-stats"])
@pytest.mark.parametrize(
    ("ids", "list_type", "shown"),
    [
        ([[1, 2], [3], [4, 2**63 + 5]], pa.list_(pa.uint64()), "9223372036854775813 is outside"),
        ([[1, 2], [3], [4, None]], pa.list_(pa.int64()), "null is not an integer"),
        ([[1, 2], [3], [4, None]], pa.list_(pa.uint64()), "null is not an integer"),
    ],
    ids=["uint64-2^63", "null-int64", "null-uint64"],
)
def test_token_ids_that_are_not_int64_integers_are_refused(
    tmp_path: Path, monkeypatch, fast: bool, statistics: bool, ids, list_type, shown
) -> None:
    if not fast:
        monkeypatch.setattr("mds.formats.parquet.levels.list_lengths", lambda *a, **k: None)
    table = {"ids": pa.array([[7]] * 5 + ids, list_type)}
    path = write_parquet(
        tmp_path / "u.parquet", table, row_group_size=4, write_statistics=statistics
    )
    message = _error(path, tokens="ids")
    assert message.startswith("u.parquet row 7: token id "), message
    assert shown in message, message


def test_uint64_token_ids_below_2_63_are_fine(tmp_path: Path) -> None:
    ids = pa.array([[1, 2**63 - 1], [], [3]], pa.list_(pa.uint64()))
    path = write_parquet(tmp_path / "u.parquet", {"ids": ids})
    assert _scan(path, tokens="ids")["n_tokens"].to_list() == [2, 0, 1]


@pytest.mark.parametrize("setting", ["off", "check"])
def test_page_reads_setting_gives_the_same_scan(tmp_path: Path, monkeypatch, setting) -> None:
    tokens = [list(range(i % 23)) for i in range(200)]
    path = write_parquet(
        tmp_path / "a.parquet",
        {"tokens": pa.array(tokens, pa.list_(pa.int32()))},
        row_group_size=7,
        data_page_size=256,
    )
    monkeypatch.setenv("MDS_PAGE_READS", "on")
    want = _scan(path, tokens="tokens")
    monkeypatch.setenv("MDS_PAGE_READS", setting)
    assert _scan(path, tokens="tokens").equals(want)


def test_page_reads_check_names_the_file_and_row(tmp_path: Path, monkeypatch) -> None:
    from mds.formats.parquet import levels

    path = write_parquet(tmp_path / "a.parquet", {"tokens": pa.array(TOKENS * 4)}, row_group_size=6)
    real = levels.list_lengths

    def wrong(*args):
        got = real(*args).copy()
        got[13] += 1
        return got

    monkeypatch.setattr(levels, "list_lengths", wrong)
    monkeypatch.setenv("MDS_PAGE_READS", "check")
    message = _error(path, tokens="tokens")
    assert message.startswith("a.parquet: row group 2, column 'tokens', row 13: ")
