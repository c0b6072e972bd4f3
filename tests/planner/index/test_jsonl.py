"""The JSONL scanner: byte offsets that address each line exactly, line numbers that survive
blank lines and chunking, zstd streams, and errors that name the file and the 1-based line."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import zstandard
from builders import (
    JSONL_RECORDS,
    ctx,
    data_file,
    jsonl_bytes,
    source,
    write_jsonl,
    write_zst,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from literal_names import IDS, NAMES, write_with_decoy
from polars.testing import assert_frame_equal

from mds.errors import SourceDataError
from mds.planner.index import jsonl_lines
from mds.planner.index.jsonl import scan_jsonl
from mds.planner.index.jsonl_batch import scan_jsonl_batch


def _scan(path: Path, *, fmt: str | None = None, chunk_bytes: int | None = None, **table):
    table.setdefault("count", "n")
    extra = {"chunk_bytes": chunk_bytes} if chunk_bytes else {}
    file = data_file(path, fmt=fmt)
    return scan_jsonl(file, ctx(source(**table), file.format, **extra))


def _error(path: Path, **kwargs) -> str:
    with pytest.raises(SourceDataError) as info:
        _scan(path, **kwargs)
    message = str(info.value)
    assert message.startswith(path.name), message
    assert "\n" not in message
    return message


def _lines_at(data: bytes, frame: pl.DataFrame) -> list:
    """Decode each row's bytes [offset, offset + length) as one JSON document."""
    return [
        json.loads(data[off : off + length])
        for off, length in zip(frame["offset"], frame["length"], strict=True)
    ]


def test_offsets_and_lengths_address_each_line(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", JSONL_RECORDS)
    frame = _scan(tmp_path / "a.jsonl", keep=["lang"])
    assert frame.columns == ["file_row", "offset", "length", "n_tokens", "lang"]
    assert _lines_at(data, frame) == JSONL_RECORDS
    assert frame["file_row"].to_list() == [0, 1, 2, 3, 4]
    assert frame["n_tokens"].to_list() == [r["n"] for r in JSONL_RECORDS]
    assert frame["lang"].to_list() == [r.get("lang") for r in JSONL_RECORDS]
    # `length` excludes the newline: every line ends right before one.
    assert all(
        data[o + n : o + n + 1] == b"\n"
        for o, n in zip(frame["offset"], frame["length"], strict=True)
    )


def test_blank_and_whitespace_lines_are_skipped_but_keep_line_numbers(tmp_path: Path) -> None:
    records = [JSONL_RECORDS[0], "", "   ", JSONL_RECORDS[1], "\t \r", " " * 30 + "\t" * 5, "", JSONL_RECORDS[2]]
    data = write_jsonl(tmp_path / "b.jsonl", records)
    frame = _scan(tmp_path / "b.jsonl")
    assert frame["file_row"].to_list() == [0, 3, 7]
    assert _lines_at(data, frame) == [JSONL_RECORDS[0], JSONL_RECORDS[1], JSONL_RECORDS[2]]


def test_leading_whitespace_on_a_record_line_is_not_blank(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "b.jsonl", ['   {"n": 4}', "\t" + json.dumps(JSONL_RECORDS[0])])
    frame = _scan(tmp_path / "b.jsonl")
    assert frame["n_tokens"].to_list() == [4, 3]
    assert _lines_at(data, frame) == [{"n": 4}, JSONL_RECORDS[0]]


def test_last_line_without_a_trailing_newline(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "c.jsonl", JSONL_RECORDS, trailing_newline=False)
    assert not data.endswith(b"\n")
    frame = _scan(tmp_path / "c.jsonl")
    assert _lines_at(data, frame) == JSONL_RECORDS
    last = frame.row(-1, named=True)
    assert last["offset"] + last["length"] == len(data)


def test_crlf_line_endings(tmp_path: Path) -> None:
    path = tmp_path / "crlf.jsonl"
    path.write_bytes(b'{"n": 1}\r\n\r\n{"n": 2}\r\n')
    frame = _scan(path)
    assert frame["file_row"].to_list() == [0, 2]
    assert frame["n_tokens"].to_list() == [1, 2]


@pytest.mark.parametrize("chunk_bytes", [16, 64, 100])
def test_chunk_boundaries_inside_lines(tmp_path: Path, chunk_bytes: int) -> None:
    records = [{"n": i, "pad": "y" * (i * 37 % 150)} for i in range(40)]
    lines = []
    for i, rec in enumerate(records):
        lines.append(rec)
        if i % 7 == 3:
            lines.append("")
    data = write_jsonl(tmp_path / "d.jsonl", lines)
    frame = _scan(tmp_path / "d.jsonl", chunk_bytes=chunk_bytes, keep=["pad"])
    assert _lines_at(data, frame) == records
    assert frame["n_tokens"].to_list() == list(range(40))
    assert frame["pad"].to_list() == [r["pad"] for r in records]
    assert_frame_equal(frame, _scan(tmp_path / "d.jsonl", keep=["pad"]))


def test_lines_longer_than_the_chunk(tmp_path: Path) -> None:
    records = [{"n": 1, "text": "a" * 500}, {"n": 2}, {"n": 3, "text": "b" * 1000}]
    data = write_jsonl(tmp_path / "e.jsonl", records)
    frame = _scan(tmp_path / "e.jsonl", chunk_bytes=64)
    assert _lines_at(data, frame) == records
    assert frame["file_row"].to_list() == [0, 1, 2]


def test_text_with_estimate(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "t.jsonl", JSONL_RECORDS)
    frame = _scan(tmp_path / "t.jsonl", count=None, text="text", estimate="chars/4")
    assert frame["n_tokens"].to_list() == [-(-len(r["text"]) // 4) for r in JSONL_RECORDS]


def test_token_list_field(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "t.jsonl", [{"ids": [1, 2, 3]}, {"ids": []}, {"ids": [4]}])
    frame = _scan(tmp_path / "t.jsonl", count=None, tokens="ids")
    assert frame["n_tokens"].to_list() == [3, 0, 1]


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"], ids=["empty", "blank-lines"])
def test_file_without_samples_has_zero_rows(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    frame = _scan(path, keep=["lang"])
    assert frame.height == 0
    assert frame.columns == ["file_row", "offset", "length", "n_tokens", "lang"]


# --- zstd ------------------------------------------------------------------------------------


@pytest.mark.parametrize("frames", [1, 3, 5])
def test_zstd_matches_the_plain_file(tmp_path: Path, frames: int) -> None:
    records = JSONL_RECORDS * 6
    data = write_jsonl(tmp_path / "p.jsonl", records)
    plain = _scan(tmp_path / "p.jsonl", keep=["lang"])
    path = write_zst(tmp_path / "z.jsonl.zst", data, frames=frames)
    with path.open("rb") as f:
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
        decompressed = reader.read()
    assert decompressed == data
    assert _count_frames(path.read_bytes()) == frames
    for chunk_bytes in (None, 64):
        zst = _scan(path, keep=["lang"], chunk_bytes=chunk_bytes)
        assert_frame_equal(zst, plain)
        # Offsets address the decompressed stream.
        assert _lines_at(decompressed, zst) == records


def _count_frames(data: bytes) -> int:
    count = 0
    while data:
        size = zstandard.frame_content_size(data)
        assert size > 0
        obj = zstandard.ZstdDecompressor().decompressobj()
        obj.decompress(data)
        data = obj.unused_data
        count += 1
    return count


def test_zstd_truncated_frame(tmp_path: Path) -> None:
    data = jsonl_bytes(JSONL_RECORDS * 20)
    full = write_zst(tmp_path / "full.jsonl.zst", data).read_bytes()
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(full[: len(full) - 10])
    assert _error(path) == "cut.jsonl.zst: truncated zstd frame"


def test_zstd_truncated_second_frame(tmp_path: Path) -> None:
    full = write_zst(tmp_path / "full.jsonl.zst", jsonl_bytes(JSONL_RECORDS * 20), frames=2).read_bytes()
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(full[:-5])
    assert _error(path) == "cut.jsonl.zst: truncated zstd frame"


def test_not_zstd(tmp_path: Path) -> None:
    path = tmp_path / "garbage.jsonl.zst"
    path.write_bytes(jsonl_bytes(JSONL_RECORDS))  # plain text under a .zst name
    assert _error(path).startswith("garbage.jsonl.zst: corrupt zstd data (")


# --- errors naming the line ------------------------------------------------------------------


@pytest.mark.parametrize("chunk_bytes", [None, 32])
def test_malformed_json(tmp_path: Path, chunk_bytes: int | None) -> None:
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, [{"n": 1}, "", {"n": 2}, '{"n": 3, "lang": "en"', {"n": 4}])
    message = _error(path, chunk_bytes=chunk_bytes)
    assert message.startswith("bad.jsonl line 4: malformed JSON (")


def test_two_objects_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "two.jsonl"
    write_jsonl(path, [{"n": 1}, '{"n": 2}{"n": 3}'])
    assert _error(path).startswith("two.jsonl line 2: malformed JSON (Extra data")


def test_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "utf.jsonl"
    path.write_bytes(b'{"n": 1}\n\n{"n": 2, "text": "caf\xe9"}\n')
    assert _error(path).startswith("utf.jsonl line 3: invalid UTF-8")


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("[1, 2]", "list"),
        ('[{"n": 1}]', "list"),
        ("null", "null"),
        ("5", "integer"),
        ('"s"', "string"),
    ],
)
def test_line_that_is_not_an_object(tmp_path: Path, line: str, kind: str) -> None:
    path = tmp_path / "arr.jsonl"
    write_jsonl(path, [{"n": 1}, {"n": 2}, line])
    assert _error(path) == f"arr.jsonl line 3: expected a JSON object, got {kind}"


def test_missing_count_field_is_a_null_length(tmp_path: Path) -> None:
    path = tmp_path / "miss.jsonl"
    write_jsonl(path, [{"n": 1}, "", {"lang": "en"}, {"n": 2}])
    assert _error(path) == "miss.jsonl line 3: length is null"


def test_null_token_list(tmp_path: Path) -> None:
    path = tmp_path / "miss.jsonl"
    write_jsonl(path, [{"ids": [1]}, {"ids": None}])
    assert _error(path, count=None, tokens="ids") == "miss.jsonl line 2: length is null"


@pytest.mark.parametrize("chunk_bytes", [None, 16])
def test_negative_count(tmp_path: Path, chunk_bytes: int | None) -> None:
    path = tmp_path / "neg.jsonl"
    write_jsonl(path, [{"n": 1}, {"n": 2}, "", "", {"n": -5}])
    assert _error(path, chunk_bytes=chunk_bytes) == "neg.jsonl line 5: length is negative (-5)"


def test_length_field_missing_from_every_line(tmp_path: Path) -> None:
    path = tmp_path / "none.jsonl"
    write_jsonl(path, [{"m": 1}, {"m": 2}])
    assert _error(path) == "none.jsonl: field `n` is missing from every line"


@pytest.mark.parametrize(
    ("values", "line", "message"),
    [
        (["en", "fr", 5], 3, "field `lang` is a number here but a string on line 1"),
        ([1, 2, "x"], 3, "field `lang` is a string here but a number on line 1"),
        ([None, "en", True], 3, "field `lang` is a boolean here but a string on line 2"),
        (["en", ["a"]], 2, "field `lang` is a list here but a string on line 1"),
        (["en", {"a": 1}], 2, "field `lang` is an object here but a string on line 1"),
    ],
    ids=["str-int", "int-str", "str-bool", "str-list", "str-object"],
)
@pytest.mark.parametrize("chunk_bytes", [None, 16])
def test_field_type_change_is_a_clear_error(
    tmp_path: Path, values: list, line: int, message: str, chunk_bytes: int | None
) -> None:
    path = tmp_path / "drift.jsonl"
    write_jsonl(path, [{"n": 1, "lang": v} for v in values])
    assert _error(path, keep=["lang"], chunk_bytes=chunk_bytes).startswith(
        f"drift.jsonl line {line}: {message}"
    )


def test_type_change_after_many_lines(tmp_path: Path) -> None:
    path = tmp_path / "drift.jsonl"
    write_jsonl(path, [{"n": 1, "lang": "en"}] * 50 + [{"n": 1, "lang": 7}])
    for chunk_bytes in (None, 64):
        message = _error(path, keep=["lang"], chunk_bytes=chunk_bytes)
        assert message.startswith("drift.jsonl line 51: field `lang` is a number here")


@pytest.mark.parametrize("chunk_bytes", [None, 16])
def test_integers_and_floats_mix(tmp_path: Path, chunk_bytes: int | None) -> None:
    write_jsonl(tmp_path / "num.jsonl", [{"n": 1, "q": 1}, {"n": 1, "q": 0.5}, {"n": 1, "q": 2}])
    frame = _scan(tmp_path / "num.jsonl", keep=["q"], chunk_bytes=chunk_bytes)
    assert frame.schema["q"] == pl.Float64
    assert frame["q"].to_list() == [1.0, 0.5, 2.0]


@pytest.mark.parametrize("chunk_bytes", [None, 16])
def test_field_absent_at_first_takes_its_later_type(tmp_path: Path, chunk_bytes) -> None:
    write_jsonl(tmp_path / "late.jsonl", [{"n": 1}, {"n": 2}, {"n": 3, "year": 2020}])
    frame = _scan(tmp_path / "late.jsonl", keep=["year"], chunk_bytes=chunk_bytes)
    assert frame.schema["year"] == pl.Int64
    assert frame["year"].to_list() == [None, None, 2020]


def test_count_field_of_the_wrong_type(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    write_jsonl(path, [{"n": 1.5}, {"n": 2.5}])
    assert "`n` has type Float64, expected an integer token count" in _error(path)


def test_missing_file(tmp_path: Path) -> None:
    file = data_file(tmp_path / "gone.jsonl")
    with pytest.raises(SourceDataError, match="gone.jsonl: cannot open"):
        scan_jsonl(file, ctx(source(count="n"), "jsonl"))


# --- property: offsets always round-trip -----------------------------------------------------

_values = st.one_of(st.integers(-5, 5), st.text(max_size=12), st.booleans(), st.none())
_records = st.fixed_dictionaries(
    {"n": st.integers(0, 10_000)}, optional={"meta": st.text(max_size=40), "v": _values}
)
_blank_lines = st.sampled_from(["", " ", "\t", "   \t  ", " " * 20])


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    items=st.lists(st.one_of(_records, _blank_lines), min_size=1, max_size=40),
    chunk_bytes=st.integers(16, 4096),
    trailing=st.booleans(),
)
def test_offsets_round_trip(tmp_path: Path, items: list, chunk_bytes: int, trailing: bool) -> None:
    # Values of `v` are of mixed types across records, so it is not kept.
    path = tmp_path / "prop.jsonl"
    data = write_jsonl(path, items, trailing_newline=trailing)
    expected = [(i, rec) for i, rec in enumerate(items) if isinstance(rec, dict)]
    if not expected:
        assert _scan(path, chunk_bytes=chunk_bytes).height == 0
        return
    frame = _scan(path, chunk_bytes=chunk_bytes, keep=["meta"])
    assert frame["file_row"].to_list() == [i for i, _ in expected]
    assert _lines_at(data, frame) == [rec for _, rec in expected]
    assert frame["n_tokens"].to_list() == [rec["n"] for _, rec in expected]
    assert frame["meta"].to_list() == [rec.get("meta") for _, rec in expected]


@pytest.mark.parametrize("chunk_bytes", [None, 16])
def test_float_token_ids_name_the_line(tmp_path: Path, chunk_bytes: int | None) -> None:
    path = tmp_path / "f.jsonl"
    write_jsonl(path, [{"ids": [1, 2]}, {"ids": [3]}, {"ids": [4, 5.5]}, {"ids": [6]}])
    message = _error(path, tokens="ids", count=None, chunk_bytes=chunk_bytes)
    assert message == (
        "f.jsonl line 3: token id 5.5 is not an integer; token ids are integers that fit int64"
    )


def test_float_count_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    write_jsonl(path, [{"n": 1}, {"n": 2.5}])
    assert _error(path).startswith("f.jsonl line 2: column `n` has type Float64")


@pytest.mark.parametrize("chunk_bytes", [None, 16])
def test_cr_only_line_endings_are_refused(tmp_path: Path, chunk_bytes: int | None) -> None:
    path = tmp_path / "mac.jsonl"
    path.write_bytes(b'{"n": 1}\r{"n": 2}\r{"n": 3}\r')
    assert _error(path, chunk_bytes=chunk_bytes) == (
        "mac.jsonl: lines end in a bare CR (classic Mac OS line endings), which JSONL does not "
        "support; convert them to LF (or CRLF)"
    )


def test_crlf_and_a_single_line_ending_in_cr_are_read(tmp_path: Path) -> None:
    (tmp_path / "dos.jsonl").write_bytes(b'{"n": 1}\r\n{"n": 2}\r\n')
    assert _scan(tmp_path / "dos.jsonl")["n_tokens"].to_list() == [1, 2]
    (tmp_path / "one.jsonl").write_bytes(b'{"n": 4}\r')
    assert _scan(tmp_path / "one.jsonl")["n_tokens"].to_list() == [4]


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.zst"])
def test_progress_moves_chunk_by_chunk(tmp_path: Path, fmt: str, monkeypatch) -> None:
    """A large file reports its bytes (compressed ones for .zst) as its chunks are scanned,
    not only when it is done: in several steps that add up to the file's size."""
    monkeypatch.setattr(jsonl_lines, "_RAW_READ", 2048)  # compressed bytes read at a time
    data = jsonl_bytes([{"n": i % 50, "text": "w" * (i % 300)} for i in range(3000)])
    path = tmp_path / "big.jsonl"
    if fmt == "jsonl":
        path.write_bytes(data)
    else:
        path = write_zst(tmp_path / "big.jsonl.zst", data, frames=8)
    reported: list[int] = []
    file = data_file(path)
    spec = source(count="n")
    scan_jsonl(file, ctx(spec, file.format, chunk_bytes=16 << 10, progress=reported.append))
    assert len(reported) >= 4
    assert all(n > 0 for n in reported)
    assert sum(reported) == path.stat().st_size


@pytest.mark.parametrize(("stem", "decoy"), NAMES, ids=IDS)
def test_a_file_name_with_glob_characters_is_read_as_it_is(
    tmp_path: Path, stem: str, decoy: str | None
) -> None:
    def write(path: Path, n: int) -> None:
        write_jsonl(path, [{"n": n, "text": "a" * n, "ids": [1] * n}] * 2)

    path = write_with_decoy(tmp_path, stem, decoy, ".jsonl", write)
    assert _scan(path)["n_tokens"].to_list() == [2, 2]  # the one-pass scan
    assert _scan(path, count=None, tokens="ids")["n_tokens"].to_list() == [2, 2]
    estimate = _scan(path, count=None, text="text", estimate="chars/1")
    assert estimate["n_tokens"].to_list() == [2, 2]


@pytest.mark.parametrize(
    ("item", "shown"),
    [
        ("true", "token id true is not an integer"),
        ("null", "token id null is not an integer"),
        ("9223372036854775808", "token id 9223372036854775808 is outside int64"),
        ("18446744073709551616", "token id 18446744073709551616 is outside int64"),
    ],
)
@pytest.mark.parametrize("chunk_bytes", [None, 16], ids=["one-chunk", "many-chunks"])
def test_token_ids_that_are_not_int64_integers_are_refused(
    tmp_path: Path, item: str, shown: str, chunk_bytes: int | None
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"ids": [1, 2]}\n{"ids": [3]}\n{"ids": [4, %s, 5]}\n' % item.encode())
    message = _error(path, count=None, tokens="ids", chunk_bytes=chunk_bytes)
    assert message.startswith("t.jsonl line 3: "), message
    assert shown in message, message
    spec = source(tokens="ids")
    assert scan_jsonl_batch([data_file(path)], ctx(spec, "jsonl")) is None  # left to the scan


@pytest.mark.parametrize("keep", [[], ["meta"]], ids=["dropped", "kept"])
def test_json_nested_100000_deep_is_one_error_naming_the_line(tmp_path: Path, keep) -> None:
    path = tmp_path / "deep.jsonl"
    deep = b"[" * 100_000 + b"]" * 100_000
    path.write_bytes(b'{"ids": [1, 2]}\n{"ids": [3], "meta": %s}\n' % deep)
    message = _error(path, count=None, tokens="ids", keep=keep)
    assert message == "deep.jsonl line 2: JSON nested too deeply to read"
