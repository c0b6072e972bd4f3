"""open_reader: what every format shares at open (a missing or unreadable file names its
display path) and the arguments no source of the index would give."""

from __future__ import annotations

import pytest
from reader_helpers import reader_for

from mds.errors import SourceDataError


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
