"""Many small JSONL files scanned with one Polars parse, where the per-call cost of Polars
would dwarf each file: the rows each file alone gives, or None whenever they could differ
(a type a file alone could infer differently, any error), and the files are then scanned
one by one (index/jsonl.py), which names the problem.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.json as pa_json

from mds.errors import SourceDataError
from mds.planner.index.discover import DataFile
from mds.planner.index.jsonl_lines import BARE_CR, blank_lines, line_spans, open_jsonl
from mds.planner.index.jsonl_parse import parse_chunk, raw_lengths
from mds.planner.index.lengths import MAX_TOKENS
from mds.planner.index.scan import ScanContext

__all__ = ["scan_jsonl_batch"]

# Types whose per-file inference cannot differ from the inference over many files: an integer
# field is Int64 in every file that has a value, a string field (checked by the Categorical
# re-parse, or for the measured text by _all_strings) String. Float (a file may hold only
# whole numbers, typed Int64), structs (a file may lack some keys) and wide integers are not.
_SAME_ALONE = (pl.Null, pl.Int64, pl.Boolean, pl.String, pl.List(pl.Null))


def _read_small(file: DataFile, limit: int) -> bytes | None:
    """The file's (decompressed) bytes if they fit in one scan chunk, else None."""
    try:
        raw, stream = open_jsonl(file)
        with raw:
            if stream is raw:
                data = raw.read(limit)
            else:
                pieces, total = [], 0
                while total < limit and (piece := stream.read()):
                    pieces.append(piece)
                    total += len(piece)
                data = b"".join(pieces)
    except (SourceDataError, OSError):
        return None  # the file-by-file scan names the problem
    return data if len(data) < limit else None


def _per_file_sum(values: np.ndarray, row_file: np.ndarray, files: int) -> np.ndarray:
    return np.bincount(row_file, weights=values, minlength=files)


def _types_hold_alone(frame: pl.DataFrame, fields, row_file: np.ndarray, files: int) -> bool:
    """Whether each file, parsed alone, would type every field as the joint parse did."""
    for f in fields:
        dtype = frame.schema[f]
        if dtype == pl.List(pl.Int64):
            # A file whose lists are all empty would be List(Null) alone.
            col = frame[f]
            present = _per_file_sum(col.is_not_null().to_numpy(), row_file, files)
            items = _per_file_sum(col.list.len().fill_null(0).to_numpy(), row_file, files)
            if np.any((present > 0) & (items == 0)):
                return False
        elif dtype not in _SAME_ALONE:
            return False
    return True


def _all_strings(buf: bytes, field: str) -> bool:
    """Whether every non-null value of `field` is a JSON string. The measured text is parsed
    as String without the Categorical check, so a file holding only numbers there (typed
    Int64 alone, an error) would pass unseen in a joint parse; PyArrow's reader refuses any
    non-string value for a string column."""
    options = pa_json.ParseOptions(
        explicit_schema=pa.schema([(field, pa.string())]), unexpected_field_behavior="ignore"
    )
    try:
        pa_json.read_json(io.BytesIO(buf), parse_options=options)
    except (pa.ArrowException, ValueError):
        return False
    return True


def scan_jsonl_batch(
    files: Sequence[DataFile], ctx: ScanContext
) -> tuple[pl.DataFrame, np.ndarray] | None:
    """Scan many small files with one Polars parse: (their rows in file order, rows per file).

    The per-call cost of Polars dwarfs a file of a few lines, so small files are joined and
    parsed together. None whenever the result could differ from `scan_jsonl` on each file
    (a type a file alone could infer differently, any error): the caller then scans each
    file alone, which gives the same rows, or the error naming its file and line.
    """
    spec = ctx.spec
    fields = list(spec.columns())
    column = spec.length.column
    assert column is not None
    loose = column if spec.length.kind in ("tokenizer", "estimate") else None
    ctx.check_stop()
    contents = []
    for file in files:
        data = _read_small(file, ctx.chunk_bytes)
        if data is None:
            return None
        if data and not data.endswith(b"\n"):
            if b"\n" not in data and BARE_CR.search(data):
                return None  # bare-CR line endings: refused by the file's own scan
            data += b"\n"  # the last line ends at EOF, as in a scan of the file alone
        contents.append(data)
    sizes = np.fromiter((len(d) for d in contents), dtype=np.int64, count=len(contents))
    bases = np.zeros(len(contents), dtype=np.int64)
    np.cumsum(sizes[:-1], out=bases[1:])
    buf = b"".join(contents)
    del contents
    starts, lengths = line_spans(buf) if buf else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    line_file = np.searchsorted(bases, starts, side="right") - 1
    first_line = np.searchsorted(starts, bases, side="left")
    keep_rows = ~blank_lines(buf, starts, lengths)
    idx = np.flatnonzero(keep_rows)
    row_file = line_file[idx]
    rows = np.bincount(row_file, minlength=len(files)).astype(np.int64)
    if len(idx) == 0:
        return None  # no samples at all: rare, and the file-by-file scan types the empty frames
    frame = parse_chunk(buf, None, fields, len(idx), loose)
    if frame is None or not _types_hold_alone(frame, fields, row_file, len(files)):
        return None
    if loose is not None and frame.schema[loose] == pl.String and not _all_strings(buf, loose):
        return None
    del buf
    present = _per_file_sum(frame[column].is_not_null().to_numpy(), row_file, len(files))
    if np.any((rows > 0) & (present == 0)):
        return None  # a file without the length field: its own scan raises
    try:
        n = raw_lengths(frame, spec, ctx, "", lambda i: "")
    except SourceDataError:
        return None
    if n.null_count() or (len(n) and (n.min() < 0 or n.max() > MAX_TOKENS)):
        return None
    out = pl.DataFrame(
        {
            "file_row": (idx - first_line[row_file]).astype(np.int64),
            "offset": starts[idx] - bases[row_file],
            "length": lengths[idx],
            "n_tokens": n.cast(pl.UInt32).alias("n_tokens"),
        }
    ).hstack(frame.select(list(spec.keep)))
    return out, rows
