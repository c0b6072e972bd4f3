"""Where a Parquet column's pages are, from the file's footer (pyarrow's parse of it): the
leaves of a top-level column, each row group's column chunk (its byte span, codec and
counts), and where the footer itself starts. What both page readers (`pages`, `levels`)
need before they read a page.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pyarrow.parquet as pq

__all__ = ["CODECS", "Chunk", "chunk", "chunk_span", "data_end", "leaves"]

# ColumnChunkMetaData.compression -> pyarrow.decompress codec (None: stored as is). pyarrow
# names the Thrift codec LZ4_RAW "LZ4" and the deprecated Hadoop-framed LZ4 "UNKNOWN" (like
# LZO, it falls back); "LZ4_RAW" is listed in case a later pyarrow spells it out.
CODECS = {
    "UNCOMPRESSED": None,
    "SNAPPY": "snappy",
    "GZIP": "gzip",
    "ZSTD": "zstd",
    "LZ4": "lz4_raw",
    "LZ4_RAW": "lz4_raw",
    "BROTLI": "brotli",
}


@dataclass(frozen=True)
class Chunk:
    """One row group's column chunk of a leaf column."""

    row_group: int
    start: int  # file offset of the chunk's first page (the dictionary's, if any)
    size: int  # bytes of all its pages, headers included
    codec: str | None  # as pyarrow.decompress names it
    num_values: int  # levels (values, where every definition level is the maximum)
    num_rows: int  # of the row group


def leaves(meta: pq.FileMetaData, column: str) -> list[int]:
    """Indices of the leaf columns of top-level `column`."""
    paths = [meta.schema.column(j).path for j in range(meta.num_columns)]
    return [j for j, p in enumerate(paths) if p == column or p.startswith(column + ".")]


def chunk_span(col: pq.ColumnChunkMetaData) -> tuple[int, int]:
    """Byte span [lo, hi) of a column chunk in its file, dictionary page first, if any."""
    lo = col.data_page_offset
    if col.has_dictionary_page and 0 < col.dictionary_page_offset < lo:
        lo = col.dictionary_page_offset
    return int(lo), int(lo + col.total_compressed_size)


def chunk(meta: pq.FileMetaData, group: int, leaf: int) -> Chunk | None:
    """Row group `group`'s chunk of leaf column `leaf`, or None where its pages are not read
    here: stored in another file, or compressed with a codec not in CODECS."""
    rg = meta.row_group(group)
    col = rg.column(leaf)
    if col.file_path or col.compression not in CODECS:
        return None
    start, end = chunk_span(col)
    return Chunk(
        row_group=group,
        start=start,
        size=end - start,
        codec=CODECS[col.compression],
        num_values=int(col.num_values),
        num_rows=int(rg.num_rows),
    )


def data_end(fd: int) -> int | None:
    """Offset where the footer of the Parquet file open as `fd` starts (its column chunks
    must end before it), or None if it does not end as a Parquet file does."""
    size = os.fstat(fd).st_size
    tail = os.pread(fd, 8, size - 8) if size >= 12 else b""
    if len(tail) != 8 or tail[4:] != b"PAR1":
        return None
    return size - 8 - int.from_bytes(tail[:4], "little")
