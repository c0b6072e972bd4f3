"""Scan JSONL and zstd-compressed JSONL: byte offsets plus lengths.

A local plain file whose fields have settled types is scanned in one pass: its lines are
found in the memory-mapped bytes and Polars streams the file once with a fixed schema.
Anything else, and any file that pass declines, is read in bounded chunks that end at a
newline, each parsed by Polars in one call; if Polars rejects a chunk, a line-by-line pass
finds the exact line and the reason, so errors name file and line. Both give the same rows.
Offsets are positions in the (decompressed) byte stream; `length` excludes the newline.
"""

from __future__ import annotations

import glob
import io
import json
import mmap
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import BinaryIO

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.json as pa_json
import zstandard

from mds.core import storage
from mds.errors import SourceDataError
from mds.planner.index.discover import DataFile
from mds.planner.index.lengths import (
    MAX_TOKENS,
    check_column_type,
    check_token_ids,
    checked_lengths,
    estimate_expr,
    text_lengths,
)
from mds.planner.index.scan import ScanContext, first_line

__all__ = ["ZstdFrames", "scan_jsonl", "scan_jsonl_batch"]

_RAW_READ = 1 << 20


class ZstdFrames:
    """Read a concatenation of zstd frames, raising on a truncated last frame.

    zstandard's stream_reader returns a short read on truncation; this does not.
    """

    def __init__(self, raw: BinaryIO, name: str):
        self._raw, self._name = raw, name
        self._dctx = zstandard.ZstdDecompressor()
        self._obj = None
        self._pending = b""

    def read(self, _size: int = -1) -> bytes:
        while True:
            data = self._pending or self._raw.read(_RAW_READ)
            self._pending = b""
            if not data:
                if self._obj is not None and not self._obj.eof:
                    raise SourceDataError(f"{self._name}: truncated zstd frame")
                return b""
            if self._obj is None or self._obj.eof:
                self._obj = self._dctx.decompressobj()
            try:
                out = self._obj.decompress(data)
            except zstandard.ZstdError as exc:
                raise SourceDataError(f"{self._name}: corrupt zstd data ({exc})") from None
            if self._obj.eof:
                self._pending = self._obj.unused_data
            if out:
                return out


def _chunks(stream, chunk_bytes: int) -> Iterator[tuple[int, bytes]]:
    """Yield (offset, bytes) pieces of the stream that end on a newline (or at EOF)."""
    base, carry = 0, b""
    while True:
        block = stream.read(chunk_bytes)
        if not block:
            if carry:
                yield base, carry
            return
        buf = carry + block if carry else block
        if len(buf) < chunk_bytes:
            carry = buf
            continue
        cut = buf.rfind(b"\n")
        if cut < 0:
            carry = buf
            continue
        yield base, buf[: cut + 1]
        base += cut + 1
        carry = buf[cut + 1 :]


_NEWLINE_BLOCK = 1 << 20


def _newlines(arr: np.ndarray) -> np.ndarray:
    """Positions of the LF bytes, compared a block at a time so the mask stays in cache.

    Lines are mostly far longer than 8 bytes, so a block's mask is first read as 64-bit
    words and only the few words holding an LF are searched byte by byte: a nonzero over an
    eighth of the elements, plus a small gather. A block dense with LFs is searched whole.
    """
    mask = np.empty(min(len(arr), _NEWLINE_BLOCK), dtype=bool)
    found = []
    for at in range(0, len(arr), _NEWLINE_BLOCK):
        m = mask[: min(_NEWLINE_BLOCK, len(arr) - at)]
        np.equal(arr[at : at + len(m)], 10, out=m)
        whole = len(m) & ~7
        words = np.flatnonzero(m[:whole].view(np.uint64) != 0)
        if len(words) > whole >> 5:  # over a quarter of the words: search every byte
            found.append(np.flatnonzero(m) + at)
            continue
        hits = np.flatnonzero(m[:whole].reshape(-1, 8)[words])
        found.append((words[hits >> 3] << 3) + (hits & 7) + at)
        if whole < len(m):
            found.append(np.flatnonzero(m[whole:]) + (at + whole))
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _line_spans(chunk) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each line of a bytes-like buffer; the last may end without LF."""
    return _spans(_newlines(np.frombuffer(chunk, dtype=np.uint8)), len(chunk))


def _spans(ends: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each line of `size` bytes with LFs at `ends`."""
    if not len(ends) or ends[-1] != size - 1:
        ends = np.append(ends, size)
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    return starts.astype(np.int64), (ends - starts).astype(np.int64)


_WHITESPACE = np.frombuffer(b" \t\r\x0b\x0c", dtype=np.uint8)


def _blank(chunk: bytes, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Lines that hold only whitespace: not samples, but they keep their line numbers.

    Only a line that starts with whitespace can be blank, so only those few are inspected.
    """
    blank = lengths == 0
    if len(starts) == 0:
        return blank
    arr = np.frombuffer(chunk, dtype=np.uint8)
    first = np.zeros(len(starts), dtype=bool)
    present = ~blank
    first[present] = np.isin(arr[starts[present]], _WHITESPACE)
    for i in np.flatnonzero(first):
        if not chunk[starts[i] : starts[i] + lengths[i]].strip():
            blank[i] = True
    return blank


_KIND = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "list",
    dict: "object",
}
# JSON value families a field may not switch between (integers and floats mix freely).
_FAMILY = {**_KIND, int: "number"}


def _dtype_family(dtype: pl.DataType) -> str | None:
    if dtype == pl.Null:
        return None
    if dtype == pl.String:
        return "string"
    if dtype == pl.Boolean:
        return "boolean"
    if dtype.is_numeric():
        return "number"
    if isinstance(dtype, pl.List | pl.Array):
        return "list"
    if isinstance(dtype, pl.Struct):
        return "object"
    return str(dtype)


def _type_change(where: str, field: str, family: str, seen: tuple[str, int]) -> SourceDataError:
    def a(word: str) -> str:
        return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"

    return SourceDataError(
        f"{where}: field `{field}` is {a(family)} here but {a(seen[0])} on line {seen[1]} "
        "(a field must keep one JSON type throughout the file)"
    )


def _slow_rows(
    chunk: bytes,
    starts,
    lengths,
    keep_rows,
    fields,
    line0: int,
    file: DataFile,
    seen: dict,
    tokens: str | None = None,
) -> pl.DataFrame:
    """Parse line by line; raise naming the line on the first problem, else return the rows.

    `seen` maps a field to (JSON family, line) of its first non-null value; it is updated.
    `tokens`: the field of token-id lists, whose items must be JSON integers (a `true` would
    otherwise become 1 in the frame).
    """
    columns: dict[str, list] = {f: [] for f in fields}
    for i in np.flatnonzero(keep_rows):
        line = line0 + int(i) + 1
        where = f"{file.rel} line {line}"
        raw = chunk[starts[i] : starts[i] + lengths[i]]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SourceDataError(f"{where}: invalid UTF-8 at byte {exc.start}") from None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SourceDataError(
                f"{where}: malformed JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})"
            ) from None
        except RecursionError:
            raise SourceDataError(f"{where}: JSON nested too deeply to read") from None
        if not isinstance(obj, dict):
            raise SourceDataError(
                f"{where}: expected a JSON object, got {_KIND.get(type(obj), 'null')}"
            )
        for f in fields:
            value = obj.get(f)
            if f == tokens and isinstance(value, list):
                _check_ids_of_line(value, where)
            if value is not None:
                family = _FAMILY.get(type(value), "value")
                first = seen.setdefault(f, (family, line))
                if first[0] != family:
                    raise _type_change(where, f, family, first)
            columns[f].append(value)
    try:
        return pl.DataFrame(columns, strict=False)
    except RecursionError:
        raise SourceDataError(f"{file.rel}: a field is nested too deeply to index") from None
    except (pl.exceptions.PolarsError, TypeError, ValueError) as exc:
        raise SourceDataError(f"{file.rel}: inconsistent field types ({first_line(exc)})") from None


def _id_lists(dtype: pl.DataType) -> bool:
    """Whether Polars parsed a token-id field as lists of integers (or found no values)."""
    if dtype == pl.Null:
        return True
    return isinstance(dtype, pl.List) and (dtype.inner == pl.Null or dtype.inner.is_integer())


def _check_ids_of_line(ids: list, where: str) -> None:
    """Refuse a token-id list item that is not a JSON integer in int64 (true, null, 1.5, "7")."""
    for item in ids:
        if type(item) is not int or not -(2**63) <= item < 2**63:
            text = json.dumps(item)
            what = "outside int64" if type(item) is int else "not an integer"
            raise SourceDataError(
                f"{where}: token id {text[:40]} is {what}; token ids are integers that fit int64"
            )


def _parse(chunk: bytes, schema, fields, n_rows: int, loose: str | None) -> pl.DataFrame | None:
    """Parse a chunk with Polars; None if it fails (the caller then goes line by line).

    A String schema makes Polars turn any JSON value into text, hiding a field whose type
    changes; Categorical accepts only strings, so String fields are parsed as that. The
    `loose` field (the text that is measured, then dropped) stays String: hashing every
    document into a Categorical would cost more than the whole scan.
    """
    try:
        if schema is None:
            frame = pl.read_ndjson(io.BytesIO(chunk), infer_schema_length=None)
            schema = {f: frame.schema.get(f, pl.Null) for f in fields}
            missing = [pl.lit(None).alias(f) for f in fields if f not in frame.columns]
            frame = frame.with_columns(missing).select(fields)
            if pl.String not in schema.values():
                return frame if frame.height == n_rows else None
        strict = {
            f: (pl.Categorical if d == pl.String and f != loose else d) for f, d in schema.items()
        }
        frame = pl.read_ndjson(io.BytesIO(chunk), schema=strict)
        frame = frame.with_columns(
            [pl.col(f).cast(pl.String) for f, d in strict.items() if d == pl.Categorical]
        )
    except (pl.exceptions.PolarsError, ValueError, RuntimeError):
        return None
    return frame if frame.height == n_rows else None


def _merge_schema(schema, frame: pl.DataFrame, fields) -> dict:
    """Types later chunks are parsed with: settled by the first non-null values."""
    merged = dict(schema or {})
    for f in fields:
        old, new = merged.get(f, pl.Null), frame.schema[f]
        if old == pl.Null or (old.is_integer() and new.is_float()):
            merged[f] = new
    return merged


def _note_families(frame: pl.DataFrame, idx: np.ndarray, line0: int, seen: dict) -> None:
    """Record the family and line of each field's first non-null value (fast path)."""
    for f in frame.columns:
        family = _dtype_family(frame.schema[f])
        if family is None or f in seen:
            continue
        present = frame[f].is_not_null()
        if present.any():
            seen[f] = (family, line0 + int(idx[int(present.arg_true()[0])]) + 1)


def _open(file: DataFile):
    if storage.is_url(file.path):  # an object: read in order, a range request per chunk
        raw = storage.open_input(file.path)
        return raw, (ZstdFrames(raw, file.rel) if file.format == "jsonl.zst" else raw)
    try:
        raw = open(file.path, "rb")  # noqa: SIM115 - closed by the caller
    except OSError as exc:
        raise SourceDataError(f"{file.rel}: cannot open ({exc.strerror or exc})") from None
    return raw, (ZstdFrames(raw, file.rel) if file.format == "jsonl.zst" else raw)


def _raw_lengths(
    frame: pl.DataFrame, spec, ctx: ScanContext, where: str, line: Callable[[int], str]
) -> pl.Series:
    """Unchecked n_tokens of one parsed chunk (the caller checks them all at the end);
    `line(i)` names row i of the chunk, for a type error."""
    kind, column = spec.length.kind, spec.length.column
    dtype = frame.schema[column]
    if dtype != pl.Null:
        role = "text" if kind in ("tokenizer", "estimate") else kind
        try:
            check_column_type(dtype, role, column, where)
        except SourceDataError:
            check_column_type(dtype, role, column, f"{line(_first_offender(frame[column]))}: ")
            raise
    if kind in ("tokenizer", "estimate"):
        return text_lengths(frame[column].cast(pl.String), spec.length, ctx.tokenizer)
    if kind == "tokens":
        if dtype == pl.Null:
            return pl.Series("n_tokens", [None] * frame.height, dtype=pl.Int64)
        check_token_ids(frame[column], line)
        return frame[column].list.len().cast(pl.Int64).alias("n_tokens")
    return frame[column].cast(pl.Int64).alias("n_tokens")


def _first_offender(values: pl.Series) -> int:
    """The row that made a column's type wrong: the first with a fractional number, else the
    first non-empty value (a whole float like 1.0 parses the same as 1)."""
    rows = values.to_list()
    for i, v in enumerate(rows):
        items = v if isinstance(v, list) else [v]
        if any(isinstance(x, float) and not x.is_integer() for x in items):
            return i
    return next((i for i, v in enumerate(rows) if v not in (None, [])), 0)


_BARE_CR = re.compile(rb"\r[ \t\r]*[^\s]")


def _cr_only(chunk: bytes, file: DataFile) -> None:
    """Refuse a file whose lines end in a bare CR (classic Mac OS): read as one line it would
    fail far from the cause. A chunk holds no LF only when the whole rest of the file has none."""
    if b"\n" not in chunk and _BARE_CR.search(chunk):
        raise SourceDataError(
            f"{file.rel}: lines end in a bare CR (classic Mac OS line endings), which JSONL "
            "does not support; convert them to LF (or CRLF)"
        )


def scan_jsonl(file: DataFile, ctx: ScanContext) -> pl.DataFrame:
    """Per line: position, raw length, n_tokens and the kept fields. The measured text is
    dropped as it is parsed, so memory is bounded by a chunk plus the index columns."""
    reported = [0]
    frame = _scan_mapped(file, ctx, reported)
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


# --- one pass over a local file ---------------------------------------------------------

# Samples of the first chunk whose inferred types the one pass tries, in turn: (lines, bytes
# beyond the first line). The larger one is for fields missing from the first lines.
_SAMPLES = ((100, 64 << 10), (10_000, 4 << 20))


def _chunk_bounds(ends: np.ndarray, size: int, chunk_bytes: int) -> tuple[int, int]:
    """Where `_chunks` ends the first chunk of a regular file of `size` bytes with LFs at
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
                ends = _newlines(arr)
            finally:
                del arr
            first, last = _chunk_bounds(ends, size, chunk_bytes)
            if (not len(ends) or ends[-1] < last) and _BARE_CR.search(mm, last):
                return None
            for lines, nbytes in _SAMPLES:
                strict = _settled_schema(mm[: _sample_end(ends, first, lines, nbytes)], spec, loose)
                if strict is not None:
                    break
            else:
                return None
            starts, lengths = _spans(ends, size)
            blank = _blank(mm, starts, lengths)
    rows = np.flatnonzero(~blank).astype(np.int64, copy=False)
    if len(rows) < len(starts):  # a gather only when there are blank lines to drop
        starts, lengths = starts[rows], lengths[rows]
    return size, rows, starts, lengths, strict


def _scan_mapped(file: DataFile, ctx: ScanContext, reported: list[int]) -> pl.DataFrame | None:
    """The one-pass scan of a local plain file: the rows `_scan_chunked` gives, or None when
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


# --- bounded chunks: any file, and the exact line of any error ---------------------------


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
    raw, stream = _open(file)
    with raw:
        for base, chunk in _chunks(stream, ctx.chunk_bytes):
            ctx.check_stop()
            _cr_only(chunk, file)
            starts, lengths = _line_spans(chunk)
            keep_rows = ~_blank(chunk, starts, lengths)
            n_rows = int(keep_rows.sum())
            idx = np.flatnonzero(keep_rows)
            frame = _parse(chunk, schema, fields, n_rows, loose) if n_rows else None
            if frame is not None and tokens is not None and not _id_lists(frame.schema[tokens]):
                frame = None  # read line by line: the error names the line and the id
            if frame is None and n_rows:
                frame = _slow_rows(
                    chunk, starts, lengths, keep_rows, fields, line0, file, seen, tokens
                )
            elif frame is not None:
                _note_families(frame, idx, line0, seen)
            if frame is not None:
                schema = _merge_schema(schema, frame, fields)
                present += frame.height - frame[column].null_count()
                parts.append(
                    pl.DataFrame(
                        {
                            "file_row": (idx + line0).astype(np.int64),
                            "offset": starts[idx] + base,
                            "length": lengths[idx],
                            "n_tokens": _raw_lengths(
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


# --- many small files in one parse ------------------------------------------------------

# Types whose per-file inference cannot differ from the inference over many files: an integer
# field is Int64 in every file that has a value, a string field (checked by the Categorical
# re-parse, or for the measured text by _all_strings) String. Float (a file may hold only
# whole numbers, typed Int64), structs (a file may lack some keys) and wide integers are not.
_SAME_ALONE = (pl.Null, pl.Int64, pl.Boolean, pl.String, pl.List(pl.Null))


def _read_small(file: DataFile, limit: int) -> bytes | None:
    """The file's (decompressed) bytes if they fit in one scan chunk, else None."""
    try:
        raw, stream = _open(file)
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
            if b"\n" not in data and _BARE_CR.search(data):
                return None  # bare-CR line endings: refused by the file's own scan
            data += b"\n"  # the last line ends at EOF, as in a scan of the file alone
        contents.append(data)
    sizes = np.fromiter((len(d) for d in contents), dtype=np.int64, count=len(contents))
    bases = np.zeros(len(contents), dtype=np.int64)
    np.cumsum(sizes[:-1], out=bases[1:])
    buf = b"".join(contents)
    del contents
    starts, lengths = _line_spans(buf) if buf else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    line_file = np.searchsorted(bases, starts, side="right") - 1
    first_line = np.searchsorted(starts, bases, side="left")
    keep_rows = ~_blank(buf, starts, lengths)
    idx = np.flatnonzero(keep_rows)
    row_file = line_file[idx]
    rows = np.bincount(row_file, minlength=len(files)).astype(np.int64)
    if len(idx) == 0:
        return None  # no samples at all: rare, and the file-by-file scan types the empty frames
    frame = _parse(buf, None, fields, len(idx), loose)
    if frame is None or not _types_hold_alone(frame, fields, row_file, len(files)):
        return None
    if loose is not None and frame.schema[loose] == pl.String and not _all_strings(buf, loose):
        return None
    del buf
    present = _per_file_sum(frame[column].is_not_null().to_numpy(), row_file, len(files))
    if np.any((rows > 0) & (present == 0)):
        return None  # a file without the length field: its own scan raises
    try:
        n = _raw_lengths(frame, spec, ctx, "", lambda i: "")
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
