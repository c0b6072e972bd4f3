"""Scan JSONL and zstd-compressed JSONL in bounded chunks: byte offsets plus lengths.

Each chunk ends at a newline; Polars parses it in one call. If Polars rejects a chunk, a
line-by-line pass finds the exact line and the reason, so errors name file and line.
Offsets are positions in the (decompressed) byte stream; `length` excludes the newline.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
import polars as pl
import zstandard
from mds.executor.errors import SourceDataError
from mds.planner.index.discover import DataFile
from mds.planner.index.lengths import check_column_type, checked_lengths, text_lengths
from mds.planner.index.scan import ScanContext, first_line

__all__ = ["ZstdFrames", "scan_jsonl"]

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


def _line_spans(chunk: bytes) -> tuple[np.ndarray, np.ndarray]:
    arr = np.frombuffer(chunk, dtype=np.uint8)
    ends = np.flatnonzero(arr == 10)
    if not chunk.endswith(b"\n"):
        ends = np.append(ends, len(chunk))
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    return starts.astype(np.int64), (ends - starts).astype(np.int64)


def _blank(chunk: bytes, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Lines that hold only whitespace: not samples, but they keep their line numbers."""
    blank = lengths == 0
    for i in np.flatnonzero(lengths <= 8):
        if not blank[i] and not chunk[starts[i] : starts[i] + lengths[i]].strip():
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


def _slow_rows(
    chunk: bytes, starts, lengths, keep_rows, fields, line0: int, file: DataFile
) -> pl.DataFrame:
    """Parse line by line; raise naming the line on the first problem, else return the rows."""
    columns: dict[str, list] = {f: [] for f in fields}
    for i in np.flatnonzero(keep_rows):
        where = f"{file.rel} line {line0 + int(i) + 1}"
        raw = chunk[starts[i] : starts[i] + lengths[i]]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SourceDataError(f"{where}: invalid UTF-8 at byte {exc.start}") from None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SourceDataError(
                f"{where}: malformed JSON ({exc.msg} at column {exc.colno})"
            ) from None
        if not isinstance(obj, dict):
            raise SourceDataError(
                f"{where}: expected a JSON object, got {_KIND.get(type(obj), 'null')}"
            )
        for f in fields:
            columns[f].append(obj.get(f))
    try:
        return pl.DataFrame(columns, strict=False)
    except (pl.exceptions.PolarsError, TypeError, ValueError) as exc:
        raise SourceDataError(f"{file.rel}: inconsistent field types ({first_line(exc)})") from None


def _parse(chunk: bytes, schema, fields, n_rows: int) -> pl.DataFrame | None:
    try:
        if schema is None:
            frame = pl.read_ndjson(io.BytesIO(chunk), infer_schema_length=None)
            frame = frame.select(
                [pl.col(f) if f in frame.columns else pl.lit(None).alias(f) for f in fields]
            )
        else:
            frame = pl.read_ndjson(io.BytesIO(chunk), schema=schema)
    except (pl.exceptions.PolarsError, ValueError, RuntimeError):
        return None
    return frame if frame.height == n_rows else None


def _open(file: DataFile):
    try:
        raw = open(file.path, "rb")  # noqa: SIM115 - closed by the caller
    except OSError as exc:
        raise SourceDataError(f"{file.rel}: cannot open ({exc.strerror or exc})") from None
    return raw, (ZstdFrames(raw, file.rel) if file.format == "jsonl.zst" else raw)


def scan_jsonl(file: DataFile, ctx: ScanContext) -> pl.DataFrame:
    spec = ctx.spec
    fields = list(spec.columns())
    kind, column = spec.length.kind, spec.length.column
    parts: list[pl.DataFrame] = []
    schema = None
    line0 = 0
    raw, stream = _open(file)
    with raw:
        for base, chunk in _chunks(stream, ctx.chunk_bytes):
            starts, lengths = _line_spans(chunk)
            keep_rows = ~_blank(chunk, starts, lengths)
            n_rows = int(keep_rows.sum())
            frame = _parse(chunk, schema, fields, n_rows) if n_rows else None
            if frame is None and n_rows:
                frame = _slow_rows(chunk, starts, lengths, keep_rows, fields, line0, file)
            if frame is not None:
                if schema is None:
                    schema = {
                        f: (pl.String if frame.schema[f] == pl.Null else frame.schema[f])
                        for f in fields
                    }
                idx = np.flatnonzero(keep_rows)
                head = pl.DataFrame(
                    {
                        "file_row": (idx + line0).astype(np.int64),
                        "offset": starts[idx] + base,
                        "length": lengths[idx],
                    }
                )
                parts.append(pl.concat([head, frame], how="horizontal"))
            line0 += len(starts)
    if not parts:
        frame = pl.DataFrame(
            schema={
                "file_row": pl.Int64,
                "offset": pl.Int64,
                "length": pl.Int64,
                **{f: pl.Null for f in fields},
            }
        )
    else:
        try:
            frame = pl.concat(parts, how="vertical_relaxed")
        except pl.exceptions.PolarsError as exc:
            raise SourceDataError(
                f"{file.rel}: field types change inside the file ({first_line(exc)})"
            ) from None
    if column and frame.height and frame[column].null_count() == frame.height:
        raise SourceDataError(f"{file.rel}: field `{column}` is missing from every line")
    role = "text" if kind in ("tokenizer", "estimate") else kind
    assert column is not None
    check_column_type(frame.schema[column], role, column, f"{file.rel}: field ")
    if kind in ("tokenizer", "estimate"):
        raw_n = text_lengths(frame[column], spec.length, ctx.tokenizer)
    elif kind == "tokens":
        raw_n = frame[column].list.len().cast(pl.Int64)
    else:
        raw_n = frame[column].cast(pl.Int64)
    lines = frame["file_row"]
    n_tokens = checked_lengths(raw_n, lambda i: f"{file.rel} line {int(lines[i]) + 1}")
    return pl.concat(
        [
            frame.select("file_row", "offset", "length"),
            n_tokens.to_frame(),
            frame.select(list(spec.keep)),
        ],
        how="horizontal",
    )
