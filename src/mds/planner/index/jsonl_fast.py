"""The one-pass scan of a local plain JSONL file whose fields have settled types: its lines
are found in the memory-mapped bytes and Polars streams the file once with a fixed schema.
It gives the rows the chunked scan (index/jsonl.py) gives, or declines (None) whenever it
cannot be sure of that, and the chunked scan then runs and names any error.
"""

from __future__ import annotations

import glob
import mmap
import os
import re

import numpy as np
import polars as pl

from mds.core import storage
from mds.planner.index.discover import DataFile
from mds.planner.index.jsonl_lines import BARE_CR, blank_lines, newlines, spans
from mds.planner.index.lengths import checked_lengths, estimate_expr
from mds.planner.index.scan import ScanContext

__all__ = ["scan_mapped"]
# Samples of the first chunk whose inferred types the one pass tries, in turn: (lines, bytes
# beyond the first line). The larger one is for fields missing from the first lines.
_SAMPLES = ((100, 64 << 10), (10_000, 4 << 20))


def _chunk_bounds(ends: np.ndarray, size: int, chunk_bytes: int) -> tuple[int, int]:
    """Where `newline_chunks` ends the first chunk of a regular file of `size` bytes with LFs at
    `ends`, and where it starts the last (reads of a file give full blocks until EOF)."""
    first, last, base, pos = None, 0, 0, 0
    while pos < size:
        pos = min(pos + chunk_bytes, size)
        if pos - base < chunk_bytes:
            continue
        k = int(np.searchsorted(ends, pos)) - 1  # the last LF before pos
        if k < 0 or ends[k] < base:
            continue
        if first is None:
            first = int(ends[k]) + 1
        last, base = base, int(ends[k]) + 1
    if base < size:
        last = base
    return (size if first is None else first), last


def _sample_end(ends: np.ndarray, first: int, lines: int, nbytes: int) -> int:
    """End of a sample: whole lines of the first chunk, at most `lines` of them and (beyond
    the first line) `nbytes`."""
    n = min(int(np.searchsorted(ends, first)), lines)  # LFs inside the first chunk
    if n == 0:
        return first
    n = min(n, max(int(np.searchsorted(ends, nbytes)), 1))
    return int(ends[n - 1]) + 1


def _settled_schema(sample: bytes, spec, loose: str | None) -> dict | None:
    """The schema to parse the whole file with, if the sample's types are the ones the
    chunked scan would infer from its first chunk whenever the whole file then parses: a
    string inferred for the measured text stays one whatever else the chunk holds (Polars
    makes mixed values text), and a strict Categorical, Int64 or Boolean parse accepts only
    values of that type. None for any other type (the chunked scan handles those)."""
    try:
        schema = pl.read_ndjson(sample, infer_schema_length=None).schema
    except (pl.exceptions.PolarsError, ValueError, RuntimeError):
        return None
    strict = {}
    count = spec.length.column if spec.length.kind == "count" else None
    for f in spec.columns():
        dtype = schema.get(f, pl.Null)
        if f == loose and dtype == pl.String:
            strict[f] = pl.String
        elif f != loose and dtype == pl.String and f != count:
            strict[f] = pl.Categorical
        elif f != loose and (dtype == pl.Int64 or (dtype == pl.Boolean and f != count)):
            strict[f] = dtype
        else:
            return None
    return strict


def _not_text(field: str) -> re.Pattern[bytes]:
    """Finds `field` given a value that is neither a string nor null. The one pass parses the
    measured text as String, which turns a number into its text where the chunked scan may
    refuse the line (a field must keep one JSON type); such a file is left to the chunked
    scan. A string value cannot hold the pattern (its quotes are escaped); a false alarm
    costs only the slower scan."""
    return re.compile(b'"' + re.escape(field.encode()) + rb'"[ \t\r\n]*:[ \t\r\n]*[^"n \t\r\n]')


def _map_lines(file: DataFile, chunk_bytes: int, spec, loose: str | None):
    """(size, rows, starts, lengths, schema) of a local plain file's samples (its non-blank
    lines), or None where the one pass does not apply (an empty file, a last chunk with
    bare-CR line ends, no settled schema)."""
    with open(file.path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            arr = np.frombuffer(mm, dtype=np.uint8)
            try:
                ends = newlines(arr)
            finally:
                del arr
            first, last = _chunk_bounds(ends, size, chunk_bytes)
            if (not len(ends) or ends[-1] < last) and BARE_CR.search(mm, last):
                return None
            if loose is not None and _not_text(loose).search(mm):
                return None
            for lines, nbytes in _SAMPLES:
                strict = _settled_schema(mm[: _sample_end(ends, first, lines, nbytes)], spec, loose)
                if strict is not None:
                    break
            else:
                return None
            starts, lengths = spans(ends, size)
            blank = blank_lines(mm, starts, lengths)
    rows = np.flatnonzero(~blank).astype(np.int64, copy=False)
    if len(rows) < len(starts):  # a gather only when there are blank lines to drop
        starts, lengths = starts[rows], lengths[rows]
    return size, rows, starts, lengths, strict


def scan_mapped(file: DataFile, ctx: ScanContext, reported: list[int]) -> pl.DataFrame | None:
    """The one-pass scan of a local plain file: the rows the chunked scan (index/jsonl.py) gives, or None when
    it cannot be sure of that (other length kinds, unsettled types, any parse problem); the
    chunked scan then runs and names any error. `reported[0]`: bytes told to ctx.progress."""
    spec = ctx.spec
    kind, column = spec.length.kind, spec.length.column
    if storage.is_url(file.path) or file.format != "jsonl" or kind not in ("estimate", "count"):
        return None
    assert column is not None
    loose = column if kind == "estimate" else None
    ctx.check_stop()
    try:
        lines = _map_lines(file, ctx.chunk_bytes, spec, loose)
    except (OSError, ValueError):
        return None
    if lines is None:
        return None
    size, rows, starts, lengths, strict = lines
    if len(rows) == 0:
        return None
    if kind == "estimate":
        assert spec.length.estimate is not None
        n_tokens = estimate_expr(pl.col(column), spec.length.estimate)
    else:
        n_tokens = pl.col(column).alias("n_tokens")
    used = [column, *spec.keep]
    # scan_ndjson always globs: escaped, `p[1].jsonl` reads that file and not `p1.jsonl`.
    query = pl.scan_ndjson(glob.escape(str(file.path)), schema=strict).select(
        n_tokens,
        *[
            pl.col(c).cast(pl.String) if strict[c] == pl.Categorical else pl.col(c)
            for c in spec.keep
        ],
        # A field only parsed is still parsed: a projected-out one would skip its type check.
        *[
            pl.col(f).is_null().alias(f"__parsed_{i}")
            for i, f in enumerate(strict)
            if f not in used
        ],
    )
    step = max(1, int(len(rows) * ctx.chunk_bytes / size))
    parts, done = [], 0
    try:
        for part in query.collect_batches(chunk_size=step):
            ctx.check_stop()
            parts.append(part)
            done += part.height
            if done > len(rows):
                return None
            if done:  # the file has been read up to the end of the last row
                at = min(int(starts[done - 1] + lengths[done - 1]) + 1, size)
                ctx.advance(at - reported[0])
                reported[0] = max(at, reported[0])
    except (pl.exceptions.PolarsError, ValueError, RuntimeError):
        return None
    if done != len(rows):
        return None
    ctx.advance(size - reported[0])
    reported[0] = size
    parsed = pl.concat(parts).select("n_tokens", *spec.keep)
    frame = pl.DataFrame({"file_row": rows, "offset": starts, "length": lengths}).hstack(parsed)
    checked = checked_lengths(frame["n_tokens"], lambda i: f"{file.rel} line {int(rows[i]) + 1}")
    return frame.with_columns(checked)
