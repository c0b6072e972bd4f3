"""Readers of image-text samples: WebDataset tar shards by byte range, Parquet rows of a text
and an image column (struct or list of structs), JSONL lines naming image files."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mds.core.lru import LRU
from mds.errors import SourceDataError
from mds.executor.readers import ImageText, open_reader
from mds.formats import tar as tarfmt


def image_bytes(tag: int) -> bytes:
    return b"\x89PNG fake image " + bytes([tag]) * (50 + tag)


def write_tar(path: Path, samples: list[dict[str, bytes]], fmt=tarfile.PAX_FORMAT) -> None:
    with tarfile.open(path, "w", format=fmt) as tf:
        for members in samples:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def sample_ranges(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, offset, length) of every sample, as the index records them."""
    data = path.read_bytes()

    def read(pos, size):
        return data[pos : pos + size]

    found = list(tarfmt.samples(tarfmt.members(read, 0, None, path.name)))
    rows = np.arange(len(found), dtype=np.int64)
    starts = np.array([s.start for s in found], dtype=np.int64)
    ends = np.array([s.end for s in found], dtype=np.int64)
    return rows, starts, ends - starts


def wds_reader(path, text="txt", images="jpg;png", blocks=None):
    return open_reader(
        "webdataset",
        path,
        payload_kind="image_text",
        column=text,
        companion=None,
        blocks=blocks or LRU(max_bytes=1 << 20),
        display=path.name,
        images=images,
    )


@pytest.fixture
def shard(tmp_path) -> Path:
    long_key = "deep/" + "d" * 120 + "/s2"  # a long name: a pax header before the member
    samples = [
        {"s0.txt": b"a cat", "s0.jpg": image_bytes(0)},
        {"s1.png": image_bytes(1), "s1.txt": b"x <image> y", "s1.seg.png": image_bytes(2)},
        {f"{long_key}.txt": b"only text"},
        {"s3.json": json.dumps({"caption": "from json"}).encode(), "s3.JPG": image_bytes(3)},
    ]
    path = tmp_path / "shard-0.tar"
    write_tar(path, samples)
    return path


def test_webdataset_samples_by_byte_range(shard):
    rows, offsets, lengths = sample_ranges(shard)
    assert len(rows) == 4
    reader = wds_reader(shard)
    order = np.array([3, 1, 0, 2, 1])
    got = reader.fetch(rows[order], offsets[order], lengths[order])
    reader.close()
    assert all(isinstance(p, ImageText) for p in got)
    assert [p.text for p in got] == ["", "x <image> y", "a cat", "only text", "x <image> y"]
    # archive order; "seg.png" counts (last dot-part png); "JPG" is matched case-blind
    assert got[1].images == [image_bytes(1), image_bytes(2)]
    assert got[0].images == [image_bytes(3)]
    assert got[3].images == []
    assert "shard-0.tar sample 's1'" in got[1].names[0]


def test_webdataset_json_text(shard):
    rows, offsets, lengths = sample_ranges(shard)
    reader = wds_reader(shard, text="json:caption", images="jpg")
    got = reader.fetch(rows[3:], offsets[3:], lengths[3:])
    assert got[0].text == "from json" and got[0].images == [image_bytes(3)]
    with pytest.raises(SourceDataError, match="no text at key 'title'"):
        wds_reader(shard, text="json:title", images="jpg").fetch(rows[3:], offsets[3:], lengths[3:])


def test_webdataset_gnu_long_names(tmp_path):
    path = tmp_path / "gnu.tar"
    key = "x" * 150
    write_tar(path, [{f"{key}.txt": b"t", f"{key}.png": image_bytes(5)}], fmt=tarfile.GNU_FORMAT)
    rows, offsets, lengths = sample_ranges(path)
    got = wds_reader(path).fetch(rows, offsets, lengths)
    assert got[0].text == "t" and got[0].images == [image_bytes(5)]


def test_webdataset_wrong_ranges(shard):
    rows, offsets, lengths = sample_ranges(shard)
    reader = wds_reader(shard)
    with pytest.raises(SourceDataError, match=r"^shard-0.tar sample 1 .*beyond the end"):
        reader.fetch(rows[1:2], offsets[1:2] + 10**6, lengths[1:2])
    with pytest.raises(SourceDataError, match=r"^shard-0.tar sample 0 .*not a tar header"):
        reader.fetch(rows[:1], offsets[:1] + 512, lengths[:1])
    with pytest.raises(SourceDataError, match="holds members of another sample"):
        reader.fetch(rows[:1], offsets[:1], lengths[:1] + lengths[1])
    with pytest.raises(SourceDataError, match="cut off"):
        reader.fetch(rows[:1], offsets[:1], lengths[:1] - 512)


def test_webdataset_object(shard, monkeypatch):
    """An object is read by byte ranges through the block cache (`spans` say which)."""
    from mds.core import object_ranges

    data = shard.read_bytes()

    class FakeRange:
        def __init__(self, url, blocks):
            self.size = len(data)

        def missing(self, starts, sizes):
            return [(s, s + n) for s, n in zip(starts, sizes, strict=True)]

        def read_ranges(self, starts, sizes):
            return [data[int(s) : int(s) + int(n)] for s, n in zip(starts, sizes, strict=True)]

        def close(self):
            pass

    monkeypatch.setattr(object_ranges, "RangeFile", FakeRange)
    rows, offsets, lengths = sample_ranges(shard)
    reader = open_reader(
        "webdataset",
        "s3://bucket/shard-0.tar",
        payload_kind="image_text",
        column="txt",
        companion=None,
        blocks=LRU(max_bytes=1 << 20),
        display="s3://bucket/shard-0.tar",
        images="jpg;png",
    )
    assert reader.spans(rows, offsets, lengths) == [
        (int(o), int(o + n)) for o, n in zip(offsets, lengths, strict=True)
    ]
    assert [p.text for p in reader.fetch(rows, offsets, lengths)][:2] == ["a cat", "x <image> y"]


def parquet_reader(path, root=None, images="image", blocks=None):
    return open_reader(
        "parquet",
        path,
        payload_kind="image_text",
        column="text",
        companion=None,
        blocks=blocks or LRU(max_bytes=1 << 20),
        display=path.name,
        images=images,
        root=root,
    )


@pytest.mark.parametrize("cache", [1 << 20, 1])
def test_parquet_struct_and_list(tmp_path, cache):
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "on-disk.png").write_bytes(image_bytes(9))
    table = pa.table(
        {
            "text": ["one", "<image> two <image>", "three", "four"],
            "image": pa.array(
                [
                    {"bytes": image_bytes(1), "path": "a.png"},
                    {"bytes": image_bytes(2), "path": None},
                    None,
                    {"bytes": None, "path": "pics/on-disk.png"},
                ],
                type=struct,
            ),
            "gallery": pa.array(
                [
                    [],
                    [
                        {"bytes": image_bytes(3), "path": None},
                        {"bytes": image_bytes(4), "path": ""},
                    ],
                    [{"bytes": image_bytes(5), "path": None}],
                    None,
                ],
                type=pa.list_(struct),
            ),
        }
    )
    path = tmp_path / "img.parquet"
    pq.write_table(table, path, row_group_size=2)
    blocks = LRU(max_bytes=cache)
    got = parquet_reader(path, root=tmp_path, blocks=blocks).fetch(np.array([3, 0, 1, 2]))
    assert [p.text for p in got] == ["four", "one", "<image> two <image>", "three"]
    assert [p.images for p in got] == [[image_bytes(9)], [image_bytes(1)], [image_bytes(2)], []]
    got = parquet_reader(path, images="gallery", blocks=blocks).fetch(np.array([1, 2, 0, 3]))
    assert [p.images for p in got] == [[image_bytes(3), image_bytes(4)], [image_bytes(5)], [], []]
    assert got[0].names[1] == "img.parquet row 1: column 'gallery'[1]"


def test_parquet_refusals(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": ["a"], "image": [b"raw"], "n": [None]}), path)
    with pytest.raises(SourceDataError, match="column 'image' is binary, not images"):
        parquet_reader(path)
    with pytest.raises(SourceDataError, match="has no column 'pics'"):
        parquet_reader(path, images="pics")
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    path = tmp_path / "nothing.parquet"
    image = pa.array([{"bytes": None, "path": None}], type=struct)
    pq.write_table(pa.table({"text": ["a"], "image": image}), path)
    with pytest.raises(SourceDataError, match=r"row 0: column 'image'\[0\]: .*neither bytes nor"):
        parquet_reader(path).fetch(np.array([0]))
    path = tmp_path / "escape.parquet"
    image = pa.array([{"bytes": None, "path": "../outside.png"}], type=struct)
    pq.write_table(pa.table({"text": ["a"], "image": image}), path)
    with pytest.raises(SourceDataError, match="escapes the index root"):
        parquet_reader(path, root=tmp_path).fetch(np.array([0]))


def jsonl_reader(path, root, fmt="jsonl"):
    return open_reader(
        fmt,
        path,
        payload_kind="image_text",
        column="caption",
        companion=None,
        blocks=LRU(max_bytes=1 << 20),
        display=path.name,
        images="images",
        root=root,
    )


def test_jsonl_image_paths(tmp_path):
    (tmp_path / "img").mkdir()
    for k in range(3):
        (tmp_path / "img" / f"{k}.png").write_bytes(image_bytes(k))
    lines = [
        {"caption": "no images"},
        {"caption": "one", "images": "img/0.png"},
        {"caption": "<image> a <image> b", "images": ["img/1.png", "img/2.png"]},
        {"caption": "null", "images": None},
    ]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    path = tmp_path / "data" / "caps.jsonl"
    path.parent.mkdir()
    path.write_bytes(data)
    offsets = np.cumsum([0] + [len(json.dumps(x)) + 1 for x in lines[:-1]])
    lengths = np.array([len(json.dumps(x)) for x in lines])
    rows = np.arange(4)
    got = jsonl_reader(path, tmp_path).fetch(rows, offsets, lengths)
    assert [p.text for p in got] == [x["caption"] for x in lines]
    assert [p.images for p in got] == [[], [image_bytes(0)], [image_bytes(1), image_bytes(2)], []]

    bad = [{"caption": "x", "images": "img/9.png"}, {"caption": "x", "images": "/etc/passwd"}]
    bad += [{"caption": "x", "images": [3]}]
    messages = ["'img/9.png' cannot be read", "escapes the index root", "not an image path"]
    for line, message in zip(bad, messages, strict=True):
        raw = json.dumps(line).encode()
        path.write_bytes(raw + b"\n")
        with pytest.raises(SourceDataError, match=rf"caps.jsonl line 1 \(byte 0\).*{message}"):
            jsonl_reader(path, tmp_path).fetch(np.array([0]), np.array([0]), np.array([len(raw)]))


def test_parquet_images_column_checked_per_reader(tmp_path):
    """The schema check of an image-text reader covers its images column: a reader naming a
    column the file lacks is refused even after another reader of the same file (whose footer
    and checks are kept) was opened with one it has."""
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"text": ["a"], "image": pa.array([None], type=struct)})
    pq.write_table(table, tmp_path / "t.parquet")
    parquet_reader(tmp_path / "t.parquet").close()
    with pytest.raises(SourceDataError, match="has no column 'pictures'"):
        parquet_reader(tmp_path / "t.parquet", images="pictures")
