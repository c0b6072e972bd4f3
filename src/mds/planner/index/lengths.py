"""Token lengths from index inputs: type checks, tokenizer counts, labelled estimates.

Every scanner funnels its raw length column through `checked_lengths`, so null, negative
and out-of-range lengths fail the same way whatever the format.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from mds.core.tokenizer import load_tokenizer
from mds.errors import SourceDataError
from mds.planner.index.config import Estimate, LengthSpec

__all__ = [
    "check_column_type",
    "check_token_ids",
    "checked_lengths",
    "estimate_expr",
    "load_tokenizer",
    "text_lengths",
    "token_counts",
]

MAX_TOKENS = 2**32 - 1
# Token ids are replayed as int64: a wider integer (uint64 ids >= 2^63) would come back wrong.
_ID_MIN, _ID_MAX = -(2**63), 2**63 - 1
_WIDE = (pl.UInt64, pl.Int128, pl.UInt128)
# One encode_batch call takes at most this many texts and about this many characters, so
# that a scan sees an interrupt (its `stop` check) within a fraction of a second, however
# long the texts are.
TOKENIZE_BATCH = 4096
TOKENIZE_CHARS = 1 << 18


def check_column_type(dtype: pl.DataType, role: str, column: str, where: str) -> None:
    """Raise if `column` cannot serve as `role` ("tokens", "count" or "text")."""
    ok = {
        "tokens": isinstance(dtype, pl.List | pl.Array) and dtype.inner.is_integer(),
        "count": dtype.is_integer(),
        "text": dtype in (pl.String, pl.Null),
    }[role]
    if not ok:
        wanted = {
            "tokens": "a list of integer token ids",
            "count": "an integer token count",
            "text": "a string",
        }[role]
        raise SourceDataError(f"{where}column `{column}` has type {dtype}, expected {wanted}")


def check_token_ids(ids: pl.Series, where: Callable[[int], str]) -> None:
    """Refuse a list column of token ids holding a null id or one outside int64 (what the
    executor replays them as), naming the first such row (`where(i)`) and value. Only the
    null count is looked at unless the id type is wider than int64."""
    if ids.dtype == pl.Null or not isinstance(ids.dtype, pl.List | pl.Array):
        return
    inner = ids.dtype.inner
    flat = ids.explode(empty_as_null=False, keep_nulls=False)
    wide = inner in _WIDE and flat.null_count() < len(flat)
    if wide and flat.min() >= _ID_MIN and flat.max() <= _ID_MAX:
        wide = False
    if not flat.null_count() and not wide:
        return
    bad = pl.element().is_null()
    if inner in _WIDE:
        bad = bad | (pl.element() < _ID_MIN) | (pl.element() > _ID_MAX)
    rows = ids.list.eval(bad).list.any().fill_null(False)
    i = int(rows.arg_true()[0])
    items = ids[i].to_list()
    value = next(v for v in items if v is None or not _ID_MIN <= v <= _ID_MAX)
    what = "null is not an integer" if value is None else f"{value} is outside int64"
    raise SourceDataError(f"{where(i)}: token id {what}; token ids are integers that fit int64")


def token_counts(
    tok: Any,
    texts: list[str | None],
    stop: Callable[[], None] | None = None,
    done: Callable[[float], None] | None = None,
) -> list[int | None]:
    """The token count of each text (None for None), in bounded batches: `stop()` is called
    before each (it raises to end the scan: an interrupt), `done` is told the fraction
    counted after each."""
    counts: list[int | None] = []
    start = 0
    while start < len(texts):
        end, chars = start, 0
        while end < len(texts) and end - start < TOKENIZE_BATCH and chars < TOKENIZE_CHARS:
            chars += len(texts[end] or "")
            end += 1
        if stop is not None:
            stop()
        batch = texts[start:end]
        present = [t for t in batch if t is not None]
        lens = iter(len(e.ids) for e in tok.encode_batch(present, add_special_tokens=False))
        counts.extend(None if t is None else next(lens) for t in batch)
        if done is not None:
            done(end / len(texts))
        start = end
    return counts


def _tokenize(
    texts: pl.Series,
    path: str,
    done: Callable[[float], None] | None,
    stop: Callable[[], None] | None,
) -> pl.Series:
    counts = token_counts(load_tokenizer(path), texts.to_list(), stop, done)
    return pl.Series("n_tokens", counts, dtype=pl.Int64)


def text_lengths(
    texts: pl.Series,
    length: LengthSpec,
    tokenizer_path: Path | None,
    done: Callable[[float], None] | None = None,
    stop: Callable[[], None] | None = None,
) -> pl.Series:
    """n_tokens for a text column: tokenizer counts, or the labelled ceil(len / divisor) estimate.
    `done` is told the fraction tokenized after each batch (for a progress bar); `stop` is
    called before each batch (ScanContext.check_stop: it raises once the run is interrupted)."""
    if length.kind == "tokenizer":
        assert tokenizer_path is not None
        return _tokenize(texts, str(tokenizer_path), done, stop)
    assert length.kind == "estimate" and length.estimate is not None
    return texts.to_frame("text").select(estimate_expr(pl.col("text"), length.estimate))["n_tokens"]


def estimate_expr(text: pl.Expr, estimate: Estimate) -> pl.Expr:
    """The labelled estimate ceil(len / divisor) of a text expression, as Int64 `n_tokens`
    (one definition for eager columns and lazy scans)."""
    sizes = text.str.len_bytes() if estimate.unit == "bytes" else text.str.len_chars()
    return (sizes.cast(pl.Float64) / estimate.divisor).ceil().cast(pl.Int64).alias("n_tokens")


def checked_lengths(n: pl.Series, where: Callable[[int], str]) -> pl.Series:
    """Validate raw lengths and return them as UInt32; `where(i)` names row i in errors."""
    if n.dtype == pl.Null:
        n = n.cast(pl.Int64)
    nulls = n.is_null()
    if nulls.any():
        i = int(nulls.arg_true()[0])
        raise SourceDataError(f"{where(i)}: length is null")
    negative = n < 0
    if negative.any():
        i = int(negative.arg_true()[0])
        raise SourceDataError(f"{where(i)}: length is negative ({n[i]})")
    too_long = n > MAX_TOKENS
    if too_long.any():
        i = int(too_long.arg_true()[0])
        raise SourceDataError(f"{where(i)}: length {n[i]} exceeds {MAX_TOKENS}")
    return n.cast(pl.UInt32).alias("n_tokens")
