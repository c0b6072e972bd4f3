"""Parsing a chunk of JSONL lines into a frame: one Polars call with a strict schema where
it can, line by line where it cannot, so an error names the file, the 1-based line and the
reason (malformed JSON, invalid UTF-8, a field changing its JSON type, a token id that is
not an int64 integer); and the chunk's raw lengths from the configured field.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import numpy as np
import polars as pl

from mds.errors import SourceDataError
from mds.planner.index.discover import DataFile
from mds.planner.index.lengths import check_column_type, check_token_ids, text_lengths
from mds.planner.index.scan import ScanContext, first_line

__all__ = [
    "id_lists",
    "merge_schema",
    "note_families",
    "parse_chunk",
    "raw_lengths",
    "slow_rows",
]

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


def slow_rows(
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


def id_lists(dtype: pl.DataType) -> bool:
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


def parse_chunk(
    chunk: bytes, schema, fields, n_rows: int, loose: str | None
) -> pl.DataFrame | None:
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


def merge_schema(schema, frame: pl.DataFrame, fields) -> dict:
    """Types later chunks are parsed with: settled by the first non-null values."""
    merged = dict(schema or {})
    for f in fields:
        old, new = merged.get(f, pl.Null), frame.schema[f]
        if old == pl.Null or (old.is_integer() and new.is_float()):
            merged[f] = new
    return merged


def note_families(frame: pl.DataFrame, idx: np.ndarray, line0: int, seen: dict) -> None:
    """Record the family and line of each field's first non-null value (fast path)."""
    for f in frame.columns:
        family = _dtype_family(frame.schema[f])
        if family is None or f in seen:
            continue
        present = frame[f].is_not_null()
        if present.any():
            seen[f] = (family, line0 + int(idx[int(present.arg_true()[0])]) + 1)


def raw_lengths(
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
        return text_lengths(
            frame[column].cast(pl.String), spec.length, ctx.tokenizer, stop=ctx.check_stop
        )
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
