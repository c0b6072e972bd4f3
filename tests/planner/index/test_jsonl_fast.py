"""src/mds/planner/index/jsonl_fast.py: the one-pass scan of a local file gives what the
chunked scan gives, or declines and leaves the file (and its errors) to it."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from builders import ctx, data_file, jsonl_bytes, source, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from mds.errors import SourceDataError
from mds.planner.index import jsonl
from mds.planner.index.jsonl import scan_jsonl
from mds.planner.index.jsonl_fast import scan_mapped

_texts = st.text(alphabet=st.sampled_from('ab \n\t"\\é✓\r'), max_size=30)
_odd_values = st.one_of(st.integers(-3, 3), st.floats(-2, 2), st.booleans(), st.none())
_clean = st.fixed_dictionaries(
    {"text": _texts, "n": st.integers(0, 9)},
    optional={"lang": st.sampled_from(["en", "de", None]), "other": st.integers(-3, 3)},
)
_odd = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "text": st.one_of(_texts, _odd_values),
            "n": _odd_values,
            "lang": _odd_values,
            "other": st.one_of(_odd_values, _texts),
        },
    ),
    st.sampled_from(
        ["", " ", "\t \r", '{"text": "x",', "[1, 2]", "7", '{"text": "a"} {"text": "b"}', "\r"]
    ),
)


@st.composite
def _content(draw) -> list:
    """Mostly clean records (the one pass's case), with a few odd lines anywhere."""
    items = draw(st.lists(_clean, max_size=30))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        items.insert(draw(st.integers(0, len(items))), draw(_odd))
    return items


def _outcome(scan, file, c) -> pl.DataFrame | str:
    try:
        return scan(file, c)
    except SourceDataError as exc:
        return str(exc)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    items=_content(),
    crlf=st.booleans(),
    trailing=st.booleans(),
    chunk_bytes=st.sampled_from([16, 64, 300, 16 << 20]),
    table=st.sampled_from(
        [
            {"count": None, "text": "text", "estimate": "bytes/4", "keep": ["lang"]},
            {"count": None, "text": "text", "estimate": "chars/3"},
            {"count": "n", "keep": ["lang", "other"]},
            {"count": "n", "text": "text"},
        ]
    ),
)
def test_one_pass_equals_the_chunked_scan(
    tmp_path: Path, items: list, crlf: bool, trailing: bool, chunk_bytes: int, table: dict
) -> None:
    data = jsonl_bytes(items, trailing_newline=trailing)
    if crlf:
        data = data.replace(b"\n", b"\r\n")
    path = tmp_path / "same.jsonl"
    path.write_bytes(data)
    file = data_file(path)
    c = ctx(source(**table), file.format, chunk_bytes=chunk_bytes)
    expected = _outcome(jsonl._scan_chunked, file, c)
    got = _outcome(scan_jsonl, file, c)
    if isinstance(expected, str):
        assert got == expected
    else:
        assert isinstance(got, pl.DataFrame), got
        assert_frame_equal(got, expected)


def test_a_measured_text_that_is_a_number_somewhere_is_left_to_the_chunked_scan(
    tmp_path: Path,
) -> None:
    """The one pass would read the number as its text; the chunked scan, going line by line
    (the last line's other field defeats its joint parse), refuses the type change."""
    items = [{"text": 0, "other": False}, {"text": "", "n": 0}, {"text": "", "other": 0}]
    path = tmp_path / "same.jsonl"
    path.write_bytes(jsonl_bytes(items, trailing_newline=False))
    file = data_file(path)
    c = ctx(source(count=None, text="text", estimate="chars/3"), file.format, chunk_bytes=300)
    assert scan_mapped(file, c, [0]) is None
    message = "line 2: field `text` is a string here but a number on line 1"
    with pytest.raises(SourceDataError, match=message):
        scan_jsonl(file, c)


@pytest.mark.parametrize(
    "table",
    [
        {"count": None, "text": "text", "estimate": "bytes/4", "keep": ["lang", "id", "ok"]},
        {"count": "n", "keep": ["lang"]},
    ],
)
def test_a_clean_local_file_is_scanned_in_one_pass(tmp_path: Path, table: dict) -> None:
    records = [
        {"id": i, "n": i % 7, "ok": i % 2 == 0, "lang": "en", "text": "t\n" * (i % 9)}
        for i in range(500)
    ]
    write_jsonl(tmp_path / "clean.jsonl", [*records[:3], "", *records[3:]])
    file = data_file(tmp_path / "clean.jsonl")
    c = ctx(source(**table), file.format, chunk_bytes=1024)
    frame = scan_mapped(file, c, [0])
    assert frame is not None
    assert_frame_equal(frame, jsonl._scan_chunked(file, c))
    assert frame["file_row"][3] == 4


@pytest.mark.parametrize(
    "late",
    [
        {"n": 1, "q": 0.5},  # an integer field turns float after the sample
        {"n": 1, "q": "x"},  # ... or string
        '{"n": 1, "q": ',  # a malformed line
    ],
)
def test_one_pass_gives_way_to_the_chunked_scan(tmp_path: Path, late) -> None:
    """A file the one pass declines late is scanned again in chunks; progress still adds up
    to the file's size."""
    records = [{"n": i % 5, "q": i} for i in range(3000)]
    path = tmp_path / "late.jsonl"
    data = write_jsonl(path, [*records, late, {"n": 2, "q": 3}])
    file = data_file(path)
    reported: list[int] = []
    c = ctx(source(count="n", keep=["q"]), "jsonl", chunk_bytes=4096, progress=reported.append)
    assert scan_mapped(file, ctx(source(count="n", keep=["q"]), "jsonl"), [0]) is None
    expected = _outcome(jsonl._scan_chunked, file, ctx(source(count="n", keep=["q"]), "jsonl"))
    got = _outcome(scan_jsonl, file, c)
    if isinstance(expected, str):
        assert got == expected
    else:
        assert_frame_equal(got, expected)
        assert sum(reported) == len(data)
