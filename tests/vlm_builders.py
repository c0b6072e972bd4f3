"""Builders of small image-text data for the tests: images drawn with Pillow, WebDataset
tars, Hugging Face style Parquet image columns and JSONL with image paths.

A plain module (tests/conftest.py puts tests/ on sys.path): `from vlm_builders import ...`.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def image_bytes(size: tuple[int, int], fmt: str = "JPEG", color=(120, 30, 200)) -> bytes:
    """An image of `size` (width, height) pixels encoded as `fmt`."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format=fmt)
    return out.getvalue()


def write_tar(path: Path, samples: Sequence[tuple[str, dict[str, bytes]]]) -> Path:
    """A WebDataset shard: each (key, {extension: data}) as members `key.extension`, in
    the order given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                info.mtime = 0
                tar.addfile(info, io.BytesIO(data))
    return path


def tar_members(path: Path) -> dict[str, tuple[int, int]]:
    """name -> (header offset, end of padded data) of every member, by Python's tarfile."""
    out = {}
    with tarfile.open(path) as tar:
        for info in tar.getmembers():
            out[info.name] = (info.offset, info.offset_data + -(-info.size // 512) * 512)
    return out


def image_struct(data: bytes | None, path: str | None = None) -> dict:
    return {"bytes": data, "path": path}


def write_image_parquet(path: Path, columns: dict, image_type: pa.DataType = IMAGE_STRUCT) -> Path:
    """A Parquet file whose `image` column (if given) has the datasets.Image layout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {
        name: pa.array(values, type=image_type if name.startswith("image") else None)
        for name, values in columns.items()
    }
    pq.write_table(pa.table(arrays), path)
    return path
