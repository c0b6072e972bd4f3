"""JSONL and JSONL.zst readers: sample files read at random equal a plain read of their
lines, lines across zstd frames, the frame table walked once across reopens, and one test
per user-data error message (naming file, line and byte)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zstandard
from reader_helpers import (
    CACHES,
    SAMPLE,
    assert_payloads_equal,
    count_calls,
    fetch_all,
    line_spans,
    reader_for,
    reopen_fetch,
    shuffled_with_repeats,
    unzstd,
)

from mds.core.lru import LRU
from mds.errors import SourceDataError


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


def test_zstd_frame_table_is_walked_once_across_reopens(tmp_path, monkeypatch):
    import mds.formats.zstd_frames as zstd_seek

    data = b"".join(b'{"text": "line %d"}\n' % i for i in range(100))
    path = tmp_path / "x.jsonl.zst"
    compressor = zstandard.ZstdCompressor()
    path.write_bytes(compressor.compress(data[:700]) + compressor.compress(data[700:]))
    rows, offsets, lengths = line_spans(data)
    walks = count_calls(monkeypatch, zstd_seek, "_walk")
    blocks = LRU(max_bytes=1 << 20)
    got = reopen_fetch(
        lambda: reader_for("jsonl.zst", path, blocks=blocks), (rows, offsets, lengths)
    )
    assert len(walks) == 1
    assert got[-1] == [f"line {i}" for i in range(100)]
