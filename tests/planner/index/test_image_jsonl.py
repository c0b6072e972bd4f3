"""JSONL lines with image paths: sizes read from the image files under the data root (or
URLs), lines located as for text sources, errors naming the file and the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import ctx, data_file, source, write_jsonl, write_tokenizer, write_zst
from vlm_builders import image_bytes

from mds.errors import SourceDataError
from mds.planner.index.image_jsonl import scan_jsonl_images

pytest.importorskip("PIL")
WORDS = ["a", "photo", "of", "two", "cats"]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    write_tokenizer(tmp_path / "tok.json", WORDS)
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.jpg").write_bytes(image_bytes((64, 32)))
    (tmp_path / "img" / "b.png").write_bytes(image_bytes((5, 7), "PNG"))
    return tmp_path


RECORDS = [
    {"text": "a photo", "image": "img/a.jpg", "n": 2},
    {"text": "two <image> cats <image>", "image": ["img/b.png", "img/a.jpg"], "n": 2},
    {"text": "of", "n": 1},
]


def _scan(path: Path, root: Path, **table):
    table.setdefault("images", "image")
    table.setdefault("text", "text")
    if "count" not in table:
        table.setdefault("tokenizer", "tok.json")
    spec = source(**table)
    file = data_file(path, root)
    return scan_jsonl_images(file, ctx(spec, file.format, root / "tok.json"))


def test_lines_sizes_and_tokens(root: Path) -> None:
    data = write_jsonl(root / "d" / "x.jsonl", [RECORDS[0], {}, RECORDS[1], RECORDS[2]])
    # an empty object is still a line; a blank line is not a sample
    path = root / "d" / "x.jsonl"
    data = data.replace(b"{}\n", b"  \n")
    path.write_bytes(data)
    frame = _scan(path, root).frame
    assert frame["file_row"].to_list() == [0, 2, 3]
    assert frame["n_tokens"].to_list() == [2, 2, 1]
    assert frame["image_width"].to_list() == [[64], [5, 64], []]
    assert frame["image_height"].to_list() == [[32], [7, 32], []]
    for off, length, rec in zip(
        frame["offset"].to_list(), frame["length"].to_list(), [0, 2, 3], strict=True
    ):
        assert json.loads(data[off : off + length]) == [RECORDS[0], {}, RECORDS[1], RECORDS[2]][rec]


def test_zstd_and_count(root: Path) -> None:
    data = b"".join(json.dumps(r).encode() + b"\n" for r in RECORDS)
    path = write_zst(root / "z.jsonl.zst", data, frames=2)
    frame = _scan(path, root, count="n").frame
    assert frame["n_tokens"].to_list() == [2, 2, 1]
    assert frame["n_images"].to_list() == [1, 2, 0]


def test_missing_image_error_and_drop(root: Path) -> None:
    write_jsonl(root / "m.jsonl", [RECORDS[0], {"text": "a", "image": "img/nope.jpg"}, RECORDS[2]])
    with pytest.raises(SourceDataError, match=r"m.jsonl line 2: image img/nope.jpg: missing"):
        _scan(root / "m.jsonl", root)
    got = _scan(root / "m.jsonl", root, on_bad_image="drop")
    assert got.dropped == 1
    assert got.frame["file_row"].to_list() == [0, 2]


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"text": "a", "image": 3}, "line 1: field `image` must be an image path"),
        ({"text": 3, "image": "img/a.jpg"}, "line 1: field `text` must be a string"),
        ({"text": "a", "image": "img/a.jpg", "n": "x"}, "line 1: field `n` must be an integer"),
        (
            {"text": "a <image> b <image>", "image": "img/a.jpg"},
            "line 1: the text has 2 image marker(s)",
        ),
    ],
)
def test_errors_name_the_line(root: Path, record, message) -> None:
    write_jsonl(root / "e.jsonl", [record])
    table = {"count": "n"} if "n" in record else {}
    with pytest.raises(SourceDataError) as info:
        _scan(root / "e.jsonl", root, **table)
    assert str(info.value).startswith("e.jsonl ")
    assert message in str(info.value)


def test_not_json(root: Path) -> None:
    (root / "bad.jsonl").write_bytes(b'{"text": "a"}\n{oops\n')
    with pytest.raises(SourceDataError, match="bad.jsonl line 2: not valid JSON"):
        _scan(root / "bad.jsonl", root)
