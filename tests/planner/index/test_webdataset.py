"""WebDataset tar shards as image-text sources: each sample's byte range in the tar, its
images' sizes in the documented order, its text counted between markers, bad images as
errors or dropped samples, and whole builds (manifest, reuse, an s3:// data root)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from builders import config_file, ctx, data_file, source, write_tokenizer
from vlm_builders import image_bytes, tar_members, write_tar

from mds.errors import ConfigError, SourceDataError
from mds.formats.tar import members, samples
from mds.planner.index.build import build_index
from mds.planner.index.config import load_config
from mds.planner.index.tables import read_manifest, source_frame
from mds.planner.index.webdataset import Window, image_members, scan_webdataset

pytest.importorskip("PIL")
WORDS = ["a", "cat", "dog", "on", "the", "mat", "red"]
SAMPLES = [
    ("s/k0", {"jpg": image_bytes((40, 30)), "txt": b"a cat on the mat"}),
    (
        "s/k1",
        {
            "1.png": image_bytes((10, 20), "PNG"),
            "0.png": image_bytes((11, 21), "PNG"),
            "txt": b"a <image> red dog <image>",
        },
    ),
    ("s/k2", {"txt": b"the dog"}),  # text only
    ("s/k3", {"webp": image_bytes((64, 48), "WEBP"), "jpg": image_bytes((7, 9)), "txt": b"cat"}),
]


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    write_tokenizer(tmp_path / "tok.json", WORDS)
    return write_tar(tmp_path / "shard-0.tar", SAMPLES)


def _scan(path: Path, **table):
    table.setdefault("images", "jpg;png;webp")
    table.setdefault("text", "txt")
    if "estimate" not in table:
        table.setdefault("tokenizer", "tok.json")
    spec = source(**table)
    tok = path.parent / "tok.json" if "tokenizer" in table else None
    return scan_webdataset(data_file(path), ctx(spec, "webdataset", tok, chunk_bytes=4096))


def test_rows_ranges_sizes_and_tokens(shard: Path) -> None:
    got = _scan(shard)
    frame = got.frame
    assert got.dropped == 0
    assert frame.columns == [
        "file_row", "offset", "length", "n_tokens", "n_images", "image_width", "image_height",
    ]  # fmt: skip
    assert frame.schema["image_width"] == pl.List(pl.UInt32)
    assert frame.schema["n_images"] == pl.UInt32
    assert frame["file_row"].to_list() == [0, 1, 2, 3]
    assert frame["n_tokens"].to_list() == [5, 3, 2, 1]  # markers are not text
    assert frame["n_images"].to_list() == [1, 2, 0, 2]
    # images by the extension's place in `images`, then by the extension as a string
    assert frame["image_width"].to_list() == [[40], [11, 10], [], [7, 64]]
    assert frame["image_height"].to_list() == [[30], [21, 20], [], [9, 48]]
    spans = tar_members(shard)
    for (key, exts), off, length in zip(
        SAMPLES, frame["offset"].to_list(), frame["length"].to_list(), strict=True
    ):
        names = [f"{key}.{e}" for e in exts]
        assert off == min(spans[n][0] for n in names)
        assert off + length == max(spans[n][1] for n in names)


def test_small_window_reads_like_a_large_one(shard: Path) -> None:
    data = shard.read_bytes()
    big = Window(lambda o, n: data[o : o + n], len(data), 1 << 20)
    small = Window(lambda o, n: data[o : o + n], len(data), 512)
    a = list(samples(members(big.read, 0, None, "x")))
    b = list(samples(members(small.read, 0, None, "x")))
    assert a == b
    assert [e for e, _ in image_members(a[3], ("jpg", "png", "webp"))] == ["jpg", "webp"]


def test_json_text_and_estimate(tmp_path: Path) -> None:
    path = write_tar(
        tmp_path / "j.tar",
        [
            ("a", {"json": json.dumps({"caption": "x" * 9}).encode(), "jpg": image_bytes((5, 5))}),
            ("b", {"json": b'{"caption": "ab<image>cd"}', "png": image_bytes((6, 5), "PNG")}),
        ],
    )
    frame = _scan(path, text="json:caption", estimate="chars/4").frame
    assert frame["n_tokens"].to_list() == [3, 2]  # each piece rounded up on its own


@pytest.mark.parametrize(
    ("samples_", "table", "message"),
    [
        ([("k", {"jpg": image_bytes((4, 4))})], {}, "x.tar sample 'k': no .txt member"),
        (
            [("k", {"txt": b"\xff\xfe", "jpg": image_bytes((4, 4))})],
            {},
            "x.tar sample 'k': .txt member is not UTF-8",
        ),
        (
            [("k", {"json": b"{}", "jpg": image_bytes((4, 4))})],
            {"text": "json:caption"},
            "x.tar sample 'k': .json member has no string at key 'caption'",
        ),
        (
            [("k", {"txt": b"a <image> b <image>", "jpg": image_bytes((4, 4))})],
            {},
            "x.tar sample 'k': the text has 2 image marker(s) '<image>' but the sample has 1",
        ),
        (
            [("ok", {"txt": b"a"}), ("bad", {"txt": b"a", "jpg": b"\xff\xd8\xff\xd9junk"})],
            {},
            "x.tar sample 'bad': image bad.jpg: JPEG: no frame header",
        ),
    ],
)
def test_errors_name_file_and_sample(tmp_path: Path, samples_, table, message) -> None:
    write_tokenizer(tmp_path / "tok.json", WORDS)
    path = write_tar(tmp_path / "x.tar", samples_)
    with pytest.raises(SourceDataError) as info:
        _scan(path, **table)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_bad_images_dropped_and_counted(tmp_path: Path) -> None:
    write_tokenizer(tmp_path / "tok.json", WORDS)
    path = write_tar(
        tmp_path / "x.tar",
        [
            ("a", {"txt": b"cat", "jpg": image_bytes((4, 4))}),
            ("b", {"txt": b"dog", "jpg": b"GIF89a"}),  # cut off
            ("c", {"txt": b"red", "png": b"not a png"}),
            ("d", {"txt": b"mat", "png": image_bytes((3, 2), "PNG")}),
        ],
    )
    got = _scan(path, on_bad_image="drop")
    assert got.dropped == 2
    assert got.frame["file_row"].to_list() == [0, 3]  # sample numbers in the file


def test_a_cut_off_tar_is_an_error(shard: Path) -> None:
    shard.write_bytes(shard.read_bytes()[:3000])
    with pytest.raises(SourceDataError, match="shard-0.tar"):
        _scan(shard)


VLM_TOML = """
[index]
output = "index"

[[source]]
name = "caps"
path = "shards/*.tar"
images = "jpg;png;webp"
text = "txt"
tokenizer = "tok.json"
{extra}

[vision]
marker = "{marker}"
patch_size = 14
"""


def _config(root: Path, extra: str = "", marker: str = "<image>") -> Path:
    return config_file(root, VLM_TOML.format(extra=extra, marker=marker))


def test_build_manifest_payload_reuse_and_spec_key(tmp_path: Path) -> None:
    root = tmp_path
    write_tokenizer(root / "tok.json", WORDS)
    write_tar(root / "shards" / "a.tar", SAMPLES)
    write_tar(
        root / "shards" / "b.tar",
        [
            ("z", {"txt": b"cat", "jpg": b"garbage"}),
            ("y", {"txt": b"dog <image>", "png": image_bytes((8, 8), "PNG")}),
        ],
    )
    summary = build_index(load_config(_config(root, 'on_bad_image = "drop"')))
    assert summary.sources[0].rows == 5
    manifest = read_manifest(root / "index")
    entry = manifest.source("caps")
    assert entry["format"] == "webdataset"
    assert entry["payload"] == {
        "kind": "image_text",
        "layout": "webdataset",
        "text": "txt",
        "images": "jpg;png;webp",
    }
    assert entry["dropped_bad_images"] == 1
    assert [f["dropped_bad_images"] for f in entry["files"]] == [0, 1]
    table = source_frame(manifest, "caps").collect()
    assert table.columns[:3] == ["file_id", "file_row", "offset"]
    assert table["n_images"].to_list() == [1, 2, 0, 2, 1]
    assert table["file_row"].to_list() == [0, 1, 2, 3, 1]

    # a re-run reuses every file, and keeps the drop counts
    again = build_index(load_config(_config(root, 'on_bad_image = "drop"')))
    assert again.sources[0].files_scanned == 0
    assert read_manifest(root / "index").source("caps")["dropped_bad_images"] == 1
    # another marker changes the spec key: every file is scanned again
    third = build_index(load_config(_config(root, 'on_bad_image = "drop"', marker="<img>")))
    assert third.sources[0].files_scanned == 2
    # as does failing on bad images instead (and the bad one fails the build)
    with pytest.raises(SourceDataError, match="shards/b.tar sample 'z': image z.jpg"):
        build_index(load_config(_config(root)))


def test_webdataset_needs_images(tmp_path: Path) -> None:
    write_tar(tmp_path / "a.tar", SAMPLES)
    config_file(
        tmp_path, '[[source]]\nname = "t"\npath = "a.tar"\ntext = "txt"\nestimate = "bytes/4"\n'
    )
    with pytest.raises(ConfigError, match='format "webdataset" needs `images`'):
        build_index(load_config(tmp_path / "mds.toml"))


def test_tar_source_in_object_storage(tmp_path: Path, monkeypatch) -> None:
    from s3_store import s3_server

    local = tmp_path / "data"
    write_tokenizer(tmp_path / "tok.json", WORDS)
    write_tar(local / "shards" / "a.tar", SAMPLES)
    with s3_server(monkeypatch) as store:
        url = store.upload(local, "vlm")
        config_file(
            tmp_path,
            f'[index]\nroot = "{url}"\n\n[[source]]\nname = "caps"\npath = "shards"\n'
            f'images = "jpg;png;webp"\ntext = "txt"\ntokenizer = "{tmp_path / "tok.json"}"\n',
        )
        build_index(load_config(tmp_path / "mds.toml"), tmp_path / "index")
    table = source_frame(read_manifest(tmp_path / "index"), "caps").collect()
    local_frame = _scan(write_tar(tmp_path / "x.tar", SAMPLES)).frame
    assert table.drop("file_id").equals(local_frame)
