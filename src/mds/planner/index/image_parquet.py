"""Scan a Parquet file of image-text rows in the Hugging Face layout (docs/vision.md): the
image column is a struct of `bytes` and `path` (what `datasets.Image` writes) or a list of
them. An image's size comes from its bytes' header; one stored by `path` only (null bytes)
is read from that path, relative to the data root. Only the needed columns are read, a
batch of rows at a time.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from mds.core import storage
from mds.errors import SourceDataError
from mds.planner.index.discover import DataFile
from mds.planner.index.images import (
    BadImage,
    ImageRows,
    ImageScan,
    bad_image,
    data_root,
    image_frame,
    read_file_size,
    size_of,
)
from mds.planner.index.scan import ScanContext, missing_column, reading

__all__ = ["image_items", "scan_parquet_images"]

BATCH_ROWS = 256  # rows per batch: images are large


def _image_type(dtype: pa.DataType) -> bool:
    return (
        pa.types.is_struct(dtype)
        and dtype.get_field_index("bytes") >= 0
        and (
            pa.types.is_binary(dtype.field("bytes").type)
            or pa.types.is_large_binary(dtype.field("bytes").type)
        )
    )


def image_items(value) -> list[dict]:
    """A row's images: one struct, a list of them, or none (null)."""
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def scan_parquet_images(file: DataFile, ctx: ScanContext) -> ImageScan:
    spec = ctx.spec
    assert spec.images is not None and spec.text is not None
    column = spec.images.field
    count = spec.length.column if spec.length.kind == "count" else None
    wanted = list(dict.fromkeys([c for c in (spec.text, column, count, *spec.keep) if c]))
    rows = ImageRows(keep={c: [] for c in spec.keep})
    root = data_root(file)
    with reading(file, "Parquet file"), storage.open_input(file.path) as f, pq.ParquetFile(f) as pf:
        schema = pf.schema_arrow
        for name in wanted:
            if name not in schema.names:
                raise missing_column(file, name, schema.names)
        dtype = schema.field(column).type
        listed = pa.types.is_list(dtype) or pa.types.is_large_list(dtype)
        if not _image_type(dtype.value_type if listed else dtype):
            raise SourceDataError(
                f"{file.rel}: column `{column}` has type {dtype}, expected an image: a struct "
                "of bytes and path (datasets.Image), or a list of them"
            )
        text_type = schema.field(spec.text).type
        if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
            raise SourceDataError(
                f"{file.rel}: column `{spec.text}` has type {text_type}, expected a string"
            )
        if count and not pa.types.is_integer(schema.field(count).type):
            raise SourceDataError(
                f"{file.rel}: column `{count}` has type {schema.field(count).type}, expected an "
                "integer token count"
            )
        row = 0
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=wanted, use_threads=False):
            ctx.check_stop()
            images = batch.column(column).to_pylist()
            texts = batch.column(spec.text).to_pylist()
            counts = batch.column(count).to_pylist() if count else None
            kept = {c: batch.column(c).to_pylist() for c in spec.keep}
            for j in range(batch.num_rows):
                try:
                    sizes = [_size(item, root, k) for k, item in enumerate(image_items(images[j]))]
                except BadImage as exc:
                    bad_image(file, f"row {row + j}", exc, ctx, rows)
                    continue
                if texts[j] is None:
                    raise SourceDataError(f"{file.rel} row {row + j}: text `{spec.text}` is null")
                rows.add(row + j, texts[j], sizes)
                if counts is not None:
                    rows.counts.append(counts[j])
                for c in spec.keep:
                    rows.keep[c].append(kept[c][j])
            row += batch.num_rows
    return image_frame(rows, ctx, lambda i: f"{file.rel} row {rows.rows[i]}", located=False)


def _size(item: dict | None, root, k: int) -> tuple[int, int]:
    if item is None:
        raise BadImage(f"image {k} is null")
    data, path = item.get("bytes"), item.get("path")
    if data is not None:
        return size_of(data, f"{k}" + (f" ({path})" if path else ""))
    if path:
        return read_file_size(root, path)
    raise BadImage(f"image {k} has neither bytes nor path")
