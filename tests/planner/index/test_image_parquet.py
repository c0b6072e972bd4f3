"""Parquet image columns in the Hugging Face layout: a struct of bytes and path, or a list
of them; sizes from the bytes' headers or, for path-only images, the files under the data
root; errors naming the file and row; kept columns; `count`."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from builders import ctx, data_file, source, write_tokenizer
from vlm_builders import IMAGE_STRUCT, image_bytes, image_struct, write_image_parquet

from mds.errors import SourceDataError
from mds.planner.index.image_parquet import scan_parquet_images

pytest.importorskip("PIL")
WORDS = ["a", "chart", "of", "sales"]


def _scan(path: Path, root: Path | None = None, **table):
    table.setdefault("images", "image")
    table.setdefault("text", "text")
    if "count" not in table and "estimate" not in table:
        table.setdefault("tokenizer", "tok.json")
    tok = (root or path.parent) / "tok.json" if "tokenizer" in table else None
    spec = source(**table)
    return scan_parquet_images(data_file(path, root), ctx(spec, "parquet", tok))


def test_struct_column_bytes_and_paths(tmp_path: Path) -> None:
    write_tokenizer(tmp_path / "tok.json", WORDS)
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "p.png").write_bytes(image_bytes((33, 44), "PNG"))
    path = write_image_parquet(
        tmp_path / "data" / "c.parquet",
        {
            "image": [
                image_struct(image_bytes((100, 50))),
                image_struct(None, "img/p.png"),  # bytes null: the path, under the data root
                None,  # a text-only row
            ],
            "text": ["a chart", "<image> chart of sales", "a"],
            "lang": ["en", "de", "fr"],
        },
    )
    got = _scan(path, tmp_path, keep=["lang"])
    frame = got.frame
    assert frame.columns == [
        "file_row", "n_tokens", "n_images", "image_width", "image_height", "lang",
    ]  # fmt: skip
    assert frame["image_width"].to_list() == [[100], [33], []]
    assert frame["image_height"].to_list() == [[50], [44], []]
    assert frame["n_tokens"].to_list() == [2, 3, 1]
    assert frame["lang"].to_list() == ["en", "de", "fr"]


def test_list_column_and_count(tmp_path: Path) -> None:
    path = write_image_parquet(
        tmp_path / "l.parquet",
        {
            "images": [
                [image_struct(image_bytes((8, 9), "PNG")), image_struct(image_bytes((10, 11)))],
                [],
            ],
            "text": ["x <image> y <image>", "z"],
            "n": [7, 3],
        },
        image_type=pa.list_(IMAGE_STRUCT),
    )
    frame = _scan(path, images="images", count="n").frame
    assert frame["n_images"].to_list() == [2, 0]
    assert frame["image_width"].to_list() == [[8, 10], []]
    assert frame["n_tokens"].to_list() == [7, 3]


def test_errors_and_drops(tmp_path: Path) -> None:
    write_tokenizer(tmp_path / "tok.json", WORDS)
    path = write_image_parquet(
        tmp_path / "e.parquet",
        {
            "image": [
                image_struct(image_bytes((4, 4))),
                image_struct(b"junk"),
                image_struct(None, "missing.png"),
                image_struct(None, None),
            ],
            "text": ["a", "a", "a", "a"],
        },
    )
    with pytest.raises(SourceDataError, match=r"e.parquet row 1: image 0: not a JPEG"):
        _scan(path)
    got = _scan(path, on_bad_image="drop")
    assert got.dropped == 3
    assert got.frame["file_row"].to_list() == [0]


def test_marker_mismatch_and_wrong_types(tmp_path: Path) -> None:
    write_tokenizer(tmp_path / "tok.json", WORDS)
    path = write_image_parquet(
        tmp_path / "m.parquet",
        {"image": [image_struct(image_bytes((4, 4)))], "text": ["<image> a <image>"]},
    )
    with pytest.raises(SourceDataError, match="m.parquet row 0: the text has 2 image marker"):
        _scan(path)
    plain = write_image_parquet(tmp_path / "p.parquet", {"text": ["a"], "other": [1]})
    with pytest.raises(SourceDataError, match="column `image` not found"):
        _scan(plain)
    with pytest.raises(SourceDataError, match="column `other` has type int64, expected an image"):
        _scan(plain, images="other")
