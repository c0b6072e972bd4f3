"""src/mds/planner/index/jsonl_lines.py: LF positions, line spans, blank lines, pieces that
end on a newline, and zstd frames read whole or refused when truncated."""

from __future__ import annotations

import io

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from mds.errors import SourceDataError
from mds.planner.index import jsonl_lines
from mds.planner.index.jsonl_lines import ZstdFrames, blank_lines, line_spans, newline_chunks


@settings(max_examples=200, deadline=None)
@given(
    runs=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 3)), max_size=60),
    block=st.sampled_from([8, 13, 64, 1 << 20]),
)
def test_newlines_finds_every_lf(runs: list, block: int) -> None:
    """Sparse and dense LFs, across block ends and words of 8 bytes, in blocks of any size."""
    data = b"".join(b"x" * gap + b"\n" * count for gap, count in runs)
    arr = np.frombuffer(data, dtype=np.uint8)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jsonl_lines, "_NEWLINE_BLOCK", block)
        got = jsonl_lines.newlines(arr)
    assert got.dtype == np.int64
    assert got.tolist() == [i for i, byte in enumerate(data) if byte == 10]


def test_line_spans_and_blank_lines():
    data = b'{"a": 1}\n\n  \t\n {"b": 2}\nlast'
    starts, lengths = line_spans(data)
    assert [data[a : a + n] for a, n in zip(starts, lengths, strict=True)] == [
        b'{"a": 1}',
        b"",
        b"  \t",
        b' {"b": 2}',
        b"last",
    ]
    assert blank_lines(data, starts, lengths).tolist() == [False, True, True, False, False]


@pytest.mark.parametrize("chunk_bytes", [1, 4, 7, 100])
def test_pieces_end_on_a_newline_and_cover_the_stream(chunk_bytes):
    data = b"ab\ncdefgh\n\nij\nklm"
    pieces = list(newline_chunks(io.BytesIO(data), chunk_bytes))
    assert b"".join(p for _, p in pieces) == data
    assert all(p.endswith(b"\n") for _, p in pieces[:-1])
    assert [at for at, _ in pieces] == [
        sum(len(p) for _, p in pieces[:i]) for i in range(len(pieces))
    ]


def test_zstd_frames_are_read_in_turn_and_a_cut_one_is_refused():
    c = zstandard.ZstdCompressor()
    data = c.compress(b"one\n") + c.compress(b"two\n")
    frames = ZstdFrames(io.BytesIO(data), "f.jsonl.zst")
    out = b""
    while piece := frames.read():
        out += piece
    assert out == b"one\ntwo\n"
    cut = ZstdFrames(io.BytesIO(data[:-3]), "f.jsonl.zst")
    with pytest.raises(SourceDataError, match="f.jsonl.zst: truncated zstd frame"):
        while cut.read():
            pass
