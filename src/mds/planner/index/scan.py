"""Shared pieces of the per-format scanners: the scan context and error wrapping."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa

from mds.errors import MdsError, SourceDataError
from mds.planner.index.config import SourceSpec
from mds.planner.index.discover import DataFile

__all__ = [
    "MAX_NESTING",
    "ScanContext",
    "Stopped",
    "check_nesting",
    "nesting",
    "first_line",
    "missing_column",
    "reading",
]

# Kept metadata nested deeper than this is refused: Polars and Parquet handle nested types
# recursively, so a 100,000-deep JSON value would end in a RecursionError far from its line.
MAX_NESTING = 64


@dataclass(frozen=True)
class ScanContext:
    """What a scanner needs beyond the file: the source spec and resolved tokenizer path."""

    spec: SourceSpec
    tokenizer: Path | None = None
    chunk_bytes: int = 16 << 20
    # Set when the run is interrupted: a scanner checks it between chunks and stops.
    stop: threading.Event | None = None
    # Told the bytes of the file read so far, chunk by chunk, so a progress bar moves
    # during a large file and not only when it is done (called from the scanning thread).
    progress: Callable[[int], None] | None = None

    def check_stop(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise Stopped()

    def advance(self, nbytes: int) -> None:
        """Report `nbytes` more bytes of the file scanned."""
        if self.progress is not None and nbytes > 0:
            self.progress(nbytes)

    def fraction_of(self, file: DataFile) -> Callable[[float], None]:
        """A callback for work measured as a fraction of a file (tokenizing its text
        column): it reports the bytes that fraction stands for."""
        size = file.path.stat().st_size
        reported = 0

        def done(fraction: float) -> None:
            nonlocal reported
            now = int(size * min(max(fraction, 0.0), 1.0))
            self.advance(now - reported)
            reported = max(reported, now)

        return done


class Stopped(Exception):
    """A scan ended early because the run was interrupted (never shown to the user)."""


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def missing_column(file: DataFile, column: str, available: list[str]) -> SourceDataError:
    shown = ", ".join(available[:20]) + (", ..." if len(available) > 20 else "")
    return SourceDataError(f"{file.rel}: column `{column}` not found; columns are {shown}")


def nesting(dtype: pl.DataType) -> int:
    """How deep lists and structs nest in `dtype` (walked without recursion), stopping once
    past MAX_NESTING."""
    deepest, todo = 0, [(dtype, 0)]
    while todo and deepest <= MAX_NESTING:
        t, depth = todo.pop()
        deepest = max(deepest, depth)
        if isinstance(t, pl.List | pl.Array):
            todo.append((t.inner, depth + 1))
        elif isinstance(t, pl.Struct):
            todo.extend((f.dtype, depth + 1) for f in t.fields)
    return deepest


def check_nesting(frame: pl.DataFrame, columns, file: DataFile) -> None:
    """Refuse a kept column nested deeper than MAX_NESTING, naming the file and the first
    row holding a value of it (JSONL: its line)."""
    for column in columns:
        if nesting(frame.schema[column]) > MAX_NESTING:
            present = frame[column].is_not_null().arg_true()
            row = int(frame["file_row"][int(present[0])]) if len(present) else 0
            where = f"line {row + 1}" if file.format.startswith("jsonl") else f"row {row}"
            raise SourceDataError(
                f"{file.rel} {where}: field `{column}` is nested more than {MAX_NESTING} levels "
                "deep; mds keeps metadata up to that depth"
            )


@contextmanager
def reading(file: DataFile, what: str) -> Iterator[None]:
    """Turn library read failures into one SourceDataError line naming the file."""
    try:
        yield
    except MdsError:
        raise
    except (pl.exceptions.PolarsError, pa.ArrowException, OSError, ValueError) as exc:
        raise SourceDataError(f"{file.rel}: cannot read {what} ({first_line(exc)})") from None
