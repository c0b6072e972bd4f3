"""src/mds/planner/index/jsonl_parse.py: a chunk parsed in one Polars call where that is
safe, else line by line with errors that name the line; schemas settled by first values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from builders import data_file

from mds.errors import SourceDataError
from mds.planner.index.jsonl_lines import blank_lines, line_spans
from mds.planner.index.jsonl_parse import merge_schema, parse_chunk, slow_rows

CHUNK = b'{"n": 1, "lang": "en"}\n\n{"n": 2}\n{"n": 3.5, "lang": "de"}\n'


def _slow(chunk: bytes, tmp_path: Path, line0: int = 0, seen: dict | None = None, **kw):
    starts, lengths = line_spans(chunk)
    keep = ~blank_lines(chunk, starts, lengths)
    (tmp_path / "f.jsonl").write_bytes(chunk)
    file = data_file(tmp_path / "f.jsonl")
    return slow_rows(
        chunk, starts, lengths, keep, ["n", "lang"], line0, file, {} if seen is None else seen, **kw
    )


def test_one_call_and_line_by_line_give_the_same_rows(tmp_path: Path):
    fast = parse_chunk(CHUNK, None, ["n", "lang"], 3, None)
    assert fast is not None
    slow = _slow(CHUNK, tmp_path)
    assert fast.to_dicts() == slow.to_dicts()
    assert merge_schema({"n": pl.Int64}, fast, ["n", "lang"]) == {
        "n": pl.Float64,
        "lang": pl.String,
    }


def test_a_chunk_polars_cannot_take_is_left_to_the_line_by_line_parse():
    assert parse_chunk(b'{"n": 1}\n{"n": \n', None, ["n"], 2, None) is None
    # a strict String schema refuses a number where the first chunk had text
    assert parse_chunk(b'{"lang": 7}\n', {"lang": pl.String}, ["lang"], 1, None) is None


def test_line_by_line_names_the_line_and_the_reason(tmp_path: Path):
    seen: dict = {}
    _slow(b'{"lang": "en"}\n', tmp_path, seen=seen)
    assert seen == {"lang": ("string", 1)}
    with pytest.raises(
        SourceDataError,
        match=r"^f.jsonl line 12: field `lang` is a list here but a string on line 1",
    ):
        _slow(b'\n{"lang": ["x"]}\n', tmp_path, line0=10, seen=seen)
    with pytest.raises(SourceDataError, match=r"^f.jsonl line 1: token id true is not an integer"):
        _slow(b'{"n": [1, true]}\n', tmp_path, tokens="n")
    with pytest.raises(SourceDataError, match="f.jsonl line 2: expected a JSON object, got list"):
        _slow(b'{"n": 1}\n[1]\n', tmp_path)
    assert np.array_equal(_slow(b'{"n": 1}\n', tmp_path)["n"].to_numpy(), [1])
