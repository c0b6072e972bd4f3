"""SQL expressions from configs and plans (`filter`, cost `expr`), parsed by Polars' SQL
parser and limited to expressions over a row's columns.

Polars SQL also runs subqueries and table functions (`read_csv('/any/file')`), which would
let a config or a plan file make mds open files; anything that could be one is refused
before Polars sees it.
"""

from __future__ import annotations

import re

import polars as pl

from mds.executor.errors import ConfigError

__all__ = ["signed_ints", "sql_expr"]

_LITERAL = re.compile(r"'(?:[^']|'')*'")
_QUERY = re.compile(r"\b(select|from|with|join|union|values|table)\b|\b(read|scan)_\w+", re.I)


def signed_ints(frame: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame | pl.DataFrame:
    """`frame` with every integer column as Int64, so that expressions over it (`n_tokens - 100`,
    `a * b`) compute with signed 64-bit integers instead of wrapping in UInt32 arithmetic."""
    schema = frame.collect_schema() if isinstance(frame, pl.LazyFrame) else frame.schema
    narrow = [n for n, t in schema.items() if t.is_integer() and t != pl.Int64]
    return frame.with_columns(pl.col(narrow).cast(pl.Int64)) if narrow else frame


def sql_expr(expr: str, where: str) -> pl.Expr:
    """The Polars expression of `expr`; ConfigError naming `where` if it is not a plain
    expression over columns."""
    found = _QUERY.search(_LITERAL.sub("''", expr))
    if found:
        raise ConfigError(
            f"{where}: {expr!r} uses {found.group(0)!r}; only expressions over a row's "
            "columns are allowed (no queries or table functions)"
        )
    try:
        return pl.sql_expr(expr)
    except (pl.exceptions.PolarsError, ValueError, OSError) as exc:
        raise ConfigError(
            f"{where}: not a valid SQL expression: {expr!r} ({str(exc).splitlines()[0]})"
        ) from None
