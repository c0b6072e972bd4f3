"""src/mds/planner/index/jsonl_batch.py: many small files in one parse give exactly the rows
of each file scanned alone, or decline (None) and leave them to the file-by-file scan."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from builders import JSONL_RECORDS, ctx, data_file, jsonl_bytes, source, write_jsonl, write_zst

from mds.planner.index.jsonl import scan_jsonl
from mds.planner.index.jsonl_batch import scan_jsonl_batch


def _batch(paths: list[Path], fmt: str | None = None, **table):
    """(joint scan, per-file scans concatenated, rows per file) of `paths`."""
    table.setdefault("count", "n")
    files = [data_file(p, root=p.parent, fmt=fmt) for p in paths]
    c = ctx(source(**table), files[0].format)
    got = scan_jsonl_batch(files, c)
    alone = [scan_jsonl(f, c) for f in files]
    return got, alone


def _joint_equals_alone(paths: list[Path], **table) -> None:
    got, alone = _batch(paths, **table)
    assert got is not None
    frame, rows = got
    assert rows.tolist() == [a.height for a in alone]
    keep = table.get("keep", [])
    for col in ["file_row", "offset", "length", "n_tokens", *keep]:
        joint = frame[col]
        per_file = pl.concat([a[col].cast(joint.dtype) for a in alone])
        assert joint.dtype == next(
            (a[col].dtype for a in alone if a.height and a[col].dtype != pl.Null), joint.dtype
        )
        assert joint.to_list() == per_file.to_list(), col


def test_batch_equals_each_file_alone(tmp_path: Path) -> None:
    paths = []
    for i, records in enumerate(
        [JSONL_RECORDS, JSONL_RECORDS[:2], [], JSONL_RECORDS[2:], [{"n": 5}]]
    ):
        paths.append(tmp_path / f"f{i}.jsonl")
        write_jsonl(paths[-1], records, trailing_newline=i != 1)
    (tmp_path / "blank.jsonl").write_bytes(b'\n  \n{"n": 2, "lang": "xx"}\r\n\n')
    paths.append(tmp_path / "blank.jsonl")
    _joint_equals_alone(paths, keep=["lang"])
    _joint_equals_alone(paths[:4], count=None, estimate="bytes/4", text="text")


def test_batch_of_zstd_files(tmp_path: Path) -> None:
    paths = [
        write_zst(tmp_path / f"z{i}.jsonl.zst", jsonl_bytes(JSONL_RECORDS[i:]), frames=2)
        for i in range(3)
    ]
    _joint_equals_alone(paths, keep=["lang"])


def test_token_lists(tmp_path: Path) -> None:
    paths = [tmp_path / f"t{i}.jsonl" for i in range(3)]
    for i, p in enumerate(paths):
        write_jsonl(p, [{"tokens": list(range(i + j))} for j in range(3)])
    _joint_equals_alone(paths, count=None, tokens="tokens")


@pytest.mark.parametrize(
    ("first", "second", "table"),
    [
        # Whole numbers alone are Int64: the source's type check must see that file's own type.
        ({"n": 1, "q": 1}, {"n": 1, "q": 0.5}, {"keep": ["q"]}),
        # Only empty token lists: List(Null) alone, which is not a token column.
        ({"tokens": []}, {"tokens": [1, 2]}, {"count": None, "tokens": "tokens"}),
        # No length field at all in one file.
        ({"x": 1}, {"n": 1}, {}),
        # The measured text is a number throughout one file: an error for that file alone.
        ({"t": 5}, {"t": "abc"}, {"count": None, "estimate": "bytes/4", "text": "t"}),
        # A key missing from one file's structs.
        ({"n": 1, "s": {"a": 1}}, {"n": 1, "s": {"b": 2}}, {"keep": ["s"]}),
        # A negative length.
        ({"n": -1}, {"n": 1}, {}),
    ],
)
def test_batch_declines_where_a_file_alone_could_differ(
    tmp_path: Path, first: dict, second: dict, table: dict
) -> None:
    write_jsonl(tmp_path / "a.jsonl", [first])
    write_jsonl(tmp_path / "b.jsonl", [second])
    files = [data_file(tmp_path / n) for n in ("a.jsonl", "b.jsonl")]
    table = {"count": "n", **table}
    assert scan_jsonl_batch(files, ctx(source(**table), "jsonl")) is None


def test_batch_declines_bad_lines_and_large_files(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", JSONL_RECORDS)
    (tmp_path / "b.jsonl").write_bytes(b'{"n": 1}\n{"n": \n')
    (tmp_path / "c.jsonl").write_bytes(b'{"n": 1}\r{"n": 2}\r')
    for other in ("b.jsonl", "c.jsonl"):
        files = [data_file(tmp_path / n) for n in ("a.jsonl", other)]
        assert scan_jsonl_batch(files, ctx(source(count="n"), "jsonl")) is None
    files = [data_file(tmp_path / "a.jsonl")] * 2
    small = ctx(source(count="n"), "jsonl", chunk_bytes=64)
    assert scan_jsonl_batch(files, small) is None
