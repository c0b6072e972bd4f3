"""Scan JSONL and zstd-compressed JSONL: byte offsets plus lengths.

A local plain file whose fields have settled types is scanned in one pass: its lines are
found in the memory-mapped bytes and Polars streams the file once with a fixed schema.
Anything else, and any file that pass declines, is read in bounded chunks that end at a
newline, each parsed by Polars in one call; if Polars rejects a chunk, a line-by-line pass
finds the exact line and the reason, so errors name file and line. Both give the same rows.
Offsets are positions in the (decompressed) byte stream; `length` excludes the newline.

This module holds the chunked scan; the one pass is index/jsonl_fast.py, the bytes and lines
index/jsonl_lines.py, the parse of a chunk index/jsonl_parse.py, and the joint scan of many
small files index/jsonl_batch.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import polars as pl

from mds.errors import SourceDataError
from mds.planner.index.discover import DataFile
from mds.planner.index.jsonl_fast import scan_mapped
from mds.planner.index.jsonl_lines import (
    blank_lines,
    line_spans,
    newline_chunks,
    open_jsonl,
    refuse_cr_only,
)
from mds.planner.index.jsonl_parse import (
    id_lists,
    merge_schema,
    note_families,
    parse_chunk,
    raw_lengths,
    slow_rows,
)
from mds.planner.index.lengths import checked_lengths
from mds.planner.index.scan import ScanContext, first_line

__all__ = ["scan_jsonl"]


def scan_jsonl(file: DataFile, ctx: ScanContext) -> pl.DataFrame:
    """Per line: position, raw length, n_tokens and the kept fields. The measured text is
    dropped as it is parsed, so memory is bounded by a chunk plus the index columns."""
    reported = [0]
    frame = scan_mapped(file, ctx, reported)
    if frame is not None:
        return frame
    if reported[0] and ctx.progress is not None:  # the chunked scan reports from the start
        ctx = replace(ctx, progress=_Behind(ctx.progress, reported[0]))
    return _scan_chunked(file, ctx)


class _Behind:
    """A progress callback that swallows the first `skip` bytes (already reported)."""

    def __init__(self, progress: Callable[[int], None], skip: int):
        self._progress, self._skip = progress, skip

    def __call__(self, nbytes: int) -> None:
        passed = min(nbytes, self._skip)
        self._skip -= passed
        if nbytes > passed:
            self._progress(nbytes - passed)


def _scan_chunked(file: DataFile, ctx: ScanContext) -> pl.DataFrame:
    """Chunk by chunk: a chunk's measured text is dropped as soon as it is measured."""
    spec = ctx.spec
    fields = list(spec.columns())
    column = spec.length.column
    assert column is not None
    loose = column if spec.length.kind in ("tokenizer", "estimate") else None
    tokens = column if spec.length.kind == "tokens" else None
    parts: list[pl.DataFrame] = []
    schema = None
    present = 0
    seen: dict[str, tuple[str, int]] = {}  # field -> (JSON family, line of first value)
    line0 = 0
    scanned = 0  # bytes of the file (compressed, for .zst) reported to ctx.progress
    raw, stream = open_jsonl(file)
    with raw:
        for base, chunk in newline_chunks(stream, ctx.chunk_bytes):
            ctx.check_stop()
            refuse_cr_only(chunk, file)
            starts, lengths = line_spans(chunk)
            keep_rows = ~blank_lines(chunk, starts, lengths)
            n_rows = int(keep_rows.sum())
            idx = np.flatnonzero(keep_rows)
            frame = parse_chunk(chunk, schema, fields, n_rows, loose) if n_rows else None
            if frame is not None and tokens is not None and not id_lists(frame.schema[tokens]):
                frame = None  # read line by line: the error names the line and the id
            if frame is None and n_rows:
                frame = slow_rows(
                    chunk, starts, lengths, keep_rows, fields, line0, file, seen, tokens
                )
            elif frame is not None:
                note_families(frame, idx, line0, seen)
            if frame is not None:
                schema = merge_schema(schema, frame, fields)
                present += frame.height - frame[column].null_count()
                parts.append(
                    pl.DataFrame(
                        {
                            "file_row": (idx + line0).astype(np.int64),
                            "offset": starts[idx] + base,
                            "length": lengths[idx],
                            "n_tokens": raw_lengths(
                                frame,
                                spec,
                                ctx,
                                f"{file.rel}: field ",
                                lambda i, idx=idx, at=line0: (
                                    f"{file.rel} line {int(idx[i]) + at + 1}"
                                ),
                            ),
                        }
                    ).hstack(frame.select(list(spec.keep)))
                )
            line0 += len(starts)
            at = raw.tell()
            ctx.advance(at - scanned)
            scanned = at
    keep_schema = {f: (schema or {}).get(f, pl.Null) for f in spec.keep}
    if not parts or sum(p.height for p in parts) == 0:
        # No samples (an empty file, or only blank lines): nothing to type-check or measure.
        return pl.DataFrame(
            schema={
                "file_row": pl.Int64,
                "offset": pl.Int64,
                "length": pl.Int64,
                "n_tokens": pl.UInt32,
                **keep_schema,
            }
        )
    if present == 0:
        raise SourceDataError(f"{file.rel}: field `{column}` is missing from every line")
    try:
        frame = pl.concat(parts, how="vertical_relaxed")
    except pl.exceptions.PolarsError as exc:
        raise SourceDataError(
            f"{file.rel}: field types change inside the file ({first_line(exc)})"
        ) from None
    lines = frame["file_row"]
    n_tokens = checked_lengths(frame["n_tokens"], lambda i: f"{file.rel} line {int(lines[i]) + 1}")
    return frame.with_columns(n_tokens)
