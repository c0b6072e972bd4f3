"""What the readers of every format share: the reader base classes, the checks of rows and
payload columns, a block of decoded Arrow data (token lists or text) and gathering rows
from blocks in request order.

The format modules (`parquet`, `arrow`, `jsonl`, `megatron`) import these names under
underscore aliases, which keeps them module-private there.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from mds.core import object_ranges as ranges
from mds.core import storage
from mds.core.datacheck import safe_path
from mds.core.lru import version_key
from mds.errors import ConfigError, SourceDataError

__all__ = [
    "BaseReader",
    "ColumnReader",
    "Handle",
    "ImageText",
    "Payload",
    "TextBlock",
    "TokenBlock",
    "cannot_open",
    "check_column_type",
    "check_rows",
    "decoded_block",
    "file_version",
    "first_line",
    "gather",
    "image_files",
    "missing_column",
    "row_starts",
    "too_large",
]

Handle = int | ranges.RangeFile | Path


@dataclass(slots=True)
class ImageText:
    """The payload of an image-text sample: its text and its images' encoded bytes, in the
    sample's order, each named (`names`: where it came from, for errors) and the sample
    itself (`where`: file and sample)."""

    text: str
    images: list[bytes]
    names: list[str]
    where: str


Payload = np.ndarray | str | ImageText


class BaseReader:
    """What every reader has: a file reader reads nothing ahead (`spans` is empty)."""

    object: ranges.RangeFile | None = None

    def spans(self, file_rows, offsets=None, lengths=None) -> list[tuple[int, int]]:
        return []

    def handles(self) -> list[tuple[int, Handle]]:
        """What the reader reads, for the catalog's re-checks that the data is still the
        version it pinned: (0 for the file, 1 for its companion, and an open descriptor, a
        RangeFile, or the path of a memory-mapped file, whose replacement the map hides)."""
        return []


# --- shared checks ----------------------------------------------------------------------


def cannot_open(display: str, exc: OSError) -> SourceDataError:
    # pyarrow's OSError carries its own long text as strerror; errno says it plainly.
    reason = os.strerror(exc.errno) if exc.errno else (exc.strerror or first_line(exc))
    return SourceDataError(f"{display}: cannot open ({reason})")


def file_version(kind: str, path: Path, display: str) -> tuple:
    """The `lru.version_key` of what is parsed (`kind`) from the file's current version;
    SourceDataError if the file cannot be stat'ed."""
    try:
        return version_key(kind, path, storage.stat(path))
    except OSError as exc:
        raise cannot_open(display, exc) from None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_rows(rows: np.ndarray, n: int, display: str, unit: str = "row") -> np.ndarray:
    """Rows as int64; SourceDataError naming the first one outside [0, n)."""
    rows = np.asarray(rows, dtype=np.int64)
    if not len(rows) or (rows.min() >= 0 and rows.max() < n):
        return rows
    bad = np.flatnonzero((rows < 0) | (rows >= n))
    if len(bad):
        r = int(rows[bad[0]])
        raise SourceDataError(
            f"{display} {unit} {r} is beyond the file's {n} {unit}s (file changed since indexing?)"
        )
    return rows


def check_column_type(type_: pa.DataType, kind: str, column: str, display: str) -> None:
    """The payload column must hold integer lists (token_ids) or strings (text)."""
    if kind == "token_ids":
        ok = (pa.types.is_list(type_) or pa.types.is_large_list(type_)) and pa.types.is_integer(
            type_.value_type
        )
        want = "a list of integer token ids"
    else:
        if pa.types.is_dictionary(type_):
            type_ = type_.value_type
        ok = pa.types.is_string(type_) or pa.types.is_large_string(type_)
        ok = ok or pa.types.is_string_view(type_)
        want = "text"
    if not ok:
        raise SourceDataError(f"{display}: column '{column}' is {type_}, not {want}")


def too_large(display: str, row: int, unit: str, exc: Any, budget: Any) -> ConfigError:
    """The error of a decode (of `unit`, for file row `row`) that the memory budget can
    never hold: `exc` is the budget's TooLarge."""
    mib = 1 << 20
    return ConfigError(
        f"{display} row {row}: reading it decodes {unit}, {exc.needed / mib:.1f} MiB, more "
        f"than memory_bytes={budget.total} leaves for decodes ({exc.room / mib:.1f} MiB); "
        "raise memory_bytes"
    )


def missing_column(display: str, column: str, names: list[str]) -> SourceDataError:
    shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
    return SourceDataError(f"{display} has no column '{column}' (columns: {shown})")


def image_files(root: Path | str | None, paths: list[str], where: str) -> list[bytes]:
    """The bytes of image files named by a sample: paths relative to the data root (which
    must stay inside it, as the plan's own files must), or s3:// / gs:// URLs. Objects are
    fetched side by side. SourceDataError naming `where` and the path for one that cannot
    be read."""
    targets: list[Path | str] = []
    for rel in paths:
        if storage.is_url(rel):
            targets.append(rel)
            continue
        if root is None:
            raise SourceDataError(f"{where}: image {rel!r}: no data root to find it under")
        try:
            targets.append(safe_path(root, rel, f"{where}: image"))
        except ValueError as exc:
            raise SourceDataError(str(exc)) from None

    def read(target: Path | str) -> bytes:
        try:
            if storage.is_url(target):
                return storage.get_bytes(str(target))
            with open(target, "rb") as f:
                return f.read()
        except SourceDataError as exc:
            raise SourceDataError(f"{where}: image {exc}") from None
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else first_line(exc)
            rel = paths[targets.index(target)]
            raise SourceDataError(f"{where}: image {rel!r} cannot be read ({reason})") from None

    if sum(storage.is_url(t) for t in targets) > 1:
        return ranges.parallel(read, targets)
    return [read(t) for t in targets]


# --- decoded blocks of Arrow data -------------------------------------------------------


class TokenBlock:
    """A list<int> column of one block as numpy offsets and values, so a row is a slice.

    `own`: copy the values out of Arrow's memory (a decoded Parquet row group kept in the
    block cache: the Arrow buffers are freed at once and `nbytes` is exactly what stays);
    otherwise keep views. `views`: rows are handed out as views (a memory-mapped Arrow
    file: nothing is copied); otherwise each row is a copy of its own, so a payload never
    holds on to a whole block (a Parquet row group read once and not cached).
    """

    def __init__(self, array: pa.Array, own: bool, views: bool = False):
        offsets = array.offsets.to_numpy()
        values = array.values  # the whole child; the offsets index into it
        if own:  # keep only the values the rows use, offsets relative to them
            lo, hi = int(offsets[0]), int(offsets[-1])
            offsets, values = offsets - lo, values.slice(lo, hi - lo)
        self.offsets = offsets
        self.bad_values = None
        if values.null_count:
            self.bad_values = values.is_null().to_numpy(zero_copy_only=False)
            values = values.fill_null(0)
        self.values = np.array(values.to_numpy(), copy=True) if own else values.to_numpy()
        self.nulls = array.is_null().to_numpy(zero_copy_only=False) if array.null_count else None
        self.rows = len(array)
        self.copy = not views
        self.nbytes = self.offsets.nbytes + self.values.nbytes
        for mask in (self.bad_values, self.nulls):
            self.nbytes += mask.nbytes if mask is not None else 0

    def take(self, local: np.ndarray, rows: np.ndarray, where: Callable[[int], str]) -> list:
        offsets, values = self.offsets, self.values
        if self.nulls is None and self.bad_values is None:  # nothing to check row by row
            starts, ends = offsets[local].tolist(), offsets[local + 1].tolist()
            if self.copy:
                return [values[a:b].copy() for a, b in zip(starts, ends, strict=True)]
            return [values[a:b] for a, b in zip(starts, ends, strict=True)]
        out = []
        for i, r in zip(local.tolist(), rows.tolist(), strict=True):
            if self.nulls is not None and self.nulls[i]:
                raise SourceDataError(f"{where(r)} is null")
            a, b = int(offsets[i]), int(offsets[i + 1])
            if self.bad_values is not None and self.bad_values[a:b].any():
                raise SourceDataError(f"{where(r)} holds a null token id")
            out.append(values[a:b].copy() if self.copy else values[a:b])
        return out


class TextBlock:
    """A string column of one block, kept as Arrow; only the requested rows become str."""

    def __init__(self, array: pa.Array):
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        self.array = array
        self.rows = len(array)
        self.nbytes = array.nbytes

    def take(self, local: np.ndarray, rows: np.ndarray, where: Callable[[int], str]) -> list:
        values = self.array.take(pa.array(local, type=pa.int64())).to_pylist()
        for value, r in zip(values, rows.tolist(), strict=True):
            if value is None:
                raise SourceDataError(f"{where(r)} is null")
        return values


def decoded_block(
    array: pa.Array | pa.ChunkedArray, kind: str, own: bool, views: bool = False
) -> TokenBlock | TextBlock:
    if isinstance(array, pa.ChunkedArray):
        array = array.chunk(0) if array.num_chunks == 1 else array.combine_chunks()
    return TokenBlock(array, own, views) if kind == "token_ids" else TextBlock(array)


def gather(
    rows: np.ndarray,
    starts: np.ndarray,
    load: Callable[[int, int, int], TokenBlock | TextBlock],
    where: Callable[[int], str],
) -> list[Payload]:
    """Group rows by block (`starts` = first row of each block, then the total), load each
    needed block once, at least up to the last row asked of it, and return the rows'
    payloads in request order."""
    if len(starts) == 2 and len(rows):  # one block (a file of one row group): no grouping
        block = load(0, int(rows.max()) + 1, int(rows[0]))
        return block.take(rows, rows, where)
    out: list = [None] * len(rows)
    blocks = np.searchsorted(starts, rows, side="right") - 1
    order = np.argsort(blocks, kind="stable")
    cuts = np.flatnonzero(np.diff(blocks[order])) + 1
    for group in np.split(order, cuts) if len(order) else []:
        b = int(blocks[group[0]])
        local = rows[group] - starts[b]
        block = load(b, int(local.max()) + 1, int(rows[group[0]]))
        for i, value in zip(group.tolist(), block.take(local, rows[group], where), strict=True):
            out[i] = value
    return out


def row_starts(counts: list[int]) -> np.ndarray:
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.asarray(counts, dtype=np.int64), out=starts[1:])
    return starts


# --- readers of a column in units of rows ---------------------------------------------


class ColumnReader(BaseReader):
    """A column read in units of rows (row groups, record batches) that start at `starts`."""

    display: str
    column: str
    starts: np.ndarray

    def fetch(self, file_rows, offsets=None, lengths=None, keep: bool = True) -> list[Payload]:
        """Payloads of `file_rows`; `keep=False`: the caller will not ask again for rows of
        the units these rows are in, so units decoded for them are not cached."""
        rows = check_rows(file_rows, int(self.starts[-1]), self.display)

        def unit(i: int, need: int, row: int) -> TokenBlock | TextBlock:
            return self._unit(i, need, row, keep)

        return gather(rows, self.starts, unit, self._where)

    def _where(self, row: int) -> str:
        return f"{self.display} row {row}: column '{self.column}'"

    def _unit(self, i: int, need: int, row: int, keep: bool = True) -> TokenBlock | TextBlock:
        """Unit `i`, holding at least its first `need` rows (`row`: one asked, for errors;
        `keep`: whether a decoded unit is worth caching)."""
        raise NotImplementedError
