"""What the scanners of image-text sources share (docs/vision.md): the images' sizes from
their headers, bad images as errors or dropped samples, the text counted piece by piece
between image markers, and the table columns.

A scanner collects one `Sample` per sample it keeps (`bad` ones are counted, not kept),
then `image_frame` measures the texts and builds the rows: `file_row`, (`offset`,
`length`), `n_tokens`, `n_images`, `image_width`, `image_height` and kept columns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from mds.core import storage
from mds.core.vision import split_segments
from mds.errors import SourceDataError
from mds.formats.image_header import ImageHeaderError, image_size, read_image_size
from mds.planner.index.discover import DataFile
from mds.planner.index.lengths import checked_lengths, load_tokenizer, token_counts
from mds.planner.index.scan import ScanContext

__all__ = [
    "IMAGE_COLUMNS",
    "BadImage",
    "ImageRows",
    "ImageScan",
    "data_root",
    "image_frame",
    "read_file_size",
    "size_of",
]

IMAGE_COLUMNS = ("n_images", "image_width", "image_height")


class BadImage(Exception):
    """An image whose size cannot be read (or that is missing): `reason` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class ImageScan:
    """A file's rows and how many of its samples were left out for a bad image."""

    frame: pl.DataFrame
    dropped: int = 0


def size_of(data: bytes | memoryview, name: str) -> tuple[int, int]:
    """(width, height) of an image held in memory (all of it: a cut-off header is bad);
    BadImage naming it if unreadable."""
    try:
        return image_size(data)
    except ImageHeaderError as exc:
        raise BadImage(f"image {name}: {exc}") from None


def data_root(file: DataFile) -> str | Path:
    """The data root `file` was found under (its path without its relative name)."""
    path = str(file.path)
    depth = len(PurePosixPath(file.rel).parts)
    if storage.is_url(path):
        return path[: len(path) - len(file.rel)].rstrip("/")
    return Path(file.path).parents[depth - 1]


def read_file_size(root: str | Path, ref: str) -> tuple[int, int]:
    """(width, height) of the image file `ref`: relative to the data root `root`, an
    absolute path or an s3:// / gs:// URL. Only the header's bytes are read."""
    if storage.is_url(ref) or storage.is_url(root):
        url = ref if storage.is_url(ref) else str(storage.join(root, ref))
        try:
            with storage.open_input(url) as f:
                total = f.size()
                return _sized(lambda n: storage.read_exact(f, url, total, 0, min(n, total)), ref)
        except SourceDataError as exc:
            raise BadImage(f"image {ref}: {exc}") from None
        except OSError as exc:
            raise BadImage(f"image {ref}: cannot read ({exc})") from None
    path = Path(ref) if Path(ref).is_absolute() else Path(root) / ref
    try:
        with open(path, "rb") as f:
            return _sized(lambda n: (f.seek(0), f.read(n))[1], ref)
    except FileNotFoundError:
        raise BadImage(f"image {ref}: missing ({path} not found)") from None
    except OSError as exc:
        raise BadImage(f"image {ref}: cannot read ({exc.strerror or exc})") from None


def _sized(read: Callable[[int], bytes], name: str) -> tuple[int, int]:
    try:
        return read_image_size(read)
    except ImageHeaderError as exc:
        raise BadImage(f"image {name}: {exc}") from None


@dataclass
class ImageRows:
    """The kept samples of one file, as a scanner finds them."""

    rows: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)  # the `count` column, if that is the rule
    widths: list[list[int]] = field(default_factory=list)
    heights: list[list[int]] = field(default_factory=list)
    keep: dict[str, list[Any]] = field(default_factory=dict)
    dropped: int = 0

    def add(
        self, row: int, text: str, sizes: list[tuple[int, int]], offset: int = 0, length: int = 0
    ) -> None:
        self.rows.append(row)
        self.offsets.append(offset)
        self.lengths.append(length)
        self.texts.append(text)
        self.widths.append([w for w, _ in sizes])
        self.heights.append([h for _, h in sizes])


def bad_image(file: DataFile, where: str, exc: BadImage, ctx: ScanContext, rows: ImageRows) -> None:
    """A bad image: an error naming the file and sample, or (on_bad_image = "drop") counted."""
    assert ctx.spec.images is not None
    if ctx.spec.images.on_bad == "error":
        raise SourceDataError(
            f'{file.rel} {where}: {exc.reason} (set on_bad_image = "drop" to leave such samples out)'
        )
    rows.dropped += 1


def _piece_counts(
    texts: list[str], marker: str, ctx: ScanContext, where: Callable[[int], str], images: list[int]
) -> list[list[str]]:
    """Each text cut at its markers; a text with markers must hold one per image."""
    out = []
    for i, text in enumerate(texts):
        pieces = split_segments(text, marker)
        if len(pieces) > 1 and len(pieces) - 1 != images[i]:
            raise SourceDataError(
                f"{where(i)}: the text has {len(pieces) - 1} image marker(s) {marker!r} but the "
                f"sample has {images[i]} image(s); a text with markers needs one per image"
            )
        out.append(pieces)
    return out


def _count(pieces: list[list[str]], ctx: ScanContext) -> np.ndarray:
    """Tokens of each sample's text, summed over its pieces, each counted alone."""
    length = ctx.spec.length
    if length.kind == "estimate":
        assert length.estimate is not None
        bytes_ = length.estimate.unit == "bytes"
        div = length.estimate.divisor
        return np.array(
            [
                sum(math.ceil((len(p.encode()) if bytes_ else len(p)) / div) for p in ps)
                for ps in pieces
            ],
            dtype=np.int64,
        )
    assert length.kind == "tokenizer" and ctx.tokenizer is not None
    tok = load_tokenizer(str(ctx.tokenizer))
    flat: list[str | None] = [p for ps in pieces for p in ps if p]
    it = iter(token_counts(tok, flat, ctx.check_stop))
    return np.array([sum(next(it) for p in ps if p) for ps in pieces], dtype=np.int64)


def _lists(name: str, values: list[list[int]], lengths: list[int]) -> pl.Series:
    """A list<u32> column from its rows, built from offsets and one flat array (Polars'
    construction from nested Python lists costs ~100x more)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter((v for row in values for v in row), dtype=np.uint32, count=int(offsets[-1]))
    array = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=pa.uint32()))
    return pl.Series(name, pl.from_arrow(array), dtype=pl.List(pl.UInt32))


def image_frame(
    rows: ImageRows, ctx: ScanContext, where: Callable[[int], str], located: bool
) -> ImageScan:
    """The file's table rows from its kept samples (`located`: with `offset` and `length`).
    `where(i)` names kept sample i in errors."""
    spec = ctx.spec
    assert spec.images is not None
    n_images = [len(w) for w in rows.widths]
    pieces = _piece_counts(rows.texts, spec.images.marker, ctx, where, n_images)
    if spec.length.kind == "count":
        raw = pl.Series("n", rows.counts, dtype=pl.Int64, strict=False)
    else:
        raw = pl.Series("n", _count(pieces, ctx), dtype=pl.Int64)
    n_tokens = checked_lengths(raw, where)
    columns: dict[str, pl.Series] = {"file_row": pl.Series(rows.rows, dtype=pl.Int64)}
    if located:
        columns["offset"] = pl.Series(rows.offsets, dtype=pl.Int64)
        columns["length"] = pl.Series(rows.lengths, dtype=pl.Int64)
    columns["n_tokens"] = n_tokens
    columns["n_images"] = pl.Series(n_images, dtype=pl.UInt32)
    columns["image_width"] = _lists("image_width", rows.widths, n_images)
    columns["image_height"] = _lists("image_height", rows.heights, n_images)
    frame = pl.DataFrame(columns)
    if spec.keep:
        frame = frame.hstack(
            pl.DataFrame({c: rows.keep.get(c, []) for c in spec.keep}, strict=False)
        )
    return ImageScan(frame, rows.dropped)
