"""SQL expressions from configs and plans (`filter`, cost `expr`), parsed by Polars' SQL
parser and limited to expressions over a row's columns.

Polars SQL also runs subqueries and table functions (`read_csv('/any/file')`), which would
let a config or a plan file make mds open files; anything that could be one is refused
before Polars sees it.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

import polars as pl

from mds.errors import ConfigError

__all__ = [
    "first_overflow",
    "overflow_error",
    "overflow_flag",
    "signed_ints",
    "sql_expr",
]

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


# Node kinds of a serialized Polars expression: a dict with one of these keys is an
# expression (anything else in the tree is an option, a name or a literal's value).
_NODES = {
    "Agg",
    "Alias",
    "BinaryExpr",
    "Cast",
    "Column",
    "Columns",
    "Element",
    "Eval",
    "Explode",
    "Field",
    "Filter",
    "Function",
    "Gather",
    "KeepName",
    "Len",
    "Literal",
    "Nth",
    "Over",
    "Selector",
    "Slice",
    "Sort",
    "SortBy",
    "Ternary",
    "Window",
}
_INT64 = pl.Int64
_WIDER = (pl.UInt64, pl.Int128, pl.UInt128)


class _Wider(Exception):
    """Polars computes a node in an integer type wider than int64 (its argument)."""


def _wider_error(where: str, text: str, dtype: pl.DataType) -> ConfigError:
    return ConfigError(
        f"{where}: {text!r} computes integers wider than int64 ({dtype}); integer arithmetic "
        "in expressions is int64"
    )


def _is_node(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in _NODES


def _children(payload: Any, path: tuple = ()) -> list[tuple]:
    """Paths (keys and indexes) from a node's payload to its child expressions."""
    if _is_node(payload):
        return [path]
    if not isinstance(payload, dict | list):
        return []
    items = payload.items() if isinstance(payload, dict) else enumerate(payload)
    out = []
    for key, value in items:
        out.extend(_children(value, (*path, key)))
    return out


def _get(tree: Any, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _expr(node: Any) -> pl.Expr:
    return pl.Expr.deserialize(io.StringIO(json.dumps(node)), format="json")


# A Float64 magnitude past which a result has surely left int64 even after rounding (2^64):
# between 2^63 and this, Int128 is exact and its comparison flags the row.
_FLOAT_EDGE = 2.0**64


def _shadow(node: Any, paths: list[tuple], dtype: str) -> pl.Expr:
    """`node` computed again with its children at `paths` cast (strictly) to `dtype`."""
    shadow = json.loads(json.dumps(node))
    payload = next(iter(shadow.values()))
    for path in paths:
        parent = _get(payload, path[:-1])
        parent[path[-1]] = {
            "Cast": {"expr": parent[path[-1]], "dtype": {"Literal": dtype}, "options": "Strict"}
        }
    return _expr(shadow)


def overflow_flag(expr: pl.Expr, data: pl.LazyFrame, where: str, text: str) -> pl.Expr | None:
    """A boolean expression, true on the rows of `data` where an integer operation of `expr`
    wraps around int64; None if no operation can. The rule holds for any operation:
    each node with integer inputs is computed again from the same inputs cast to Int128,
    where one operation on int64 values (a product, a sum of fewer than 2^64 rows) is exact,
    and a row whose results differ wrapped there. Checking every node checks each one on
    exact inputs. An integer wider than int64 (a literal past 2^63 - 1) is refused."""
    tree = json.loads(expr.meta.serialize(format="json"))
    frame = pl.LazyFrame(schema=data.collect_schema())
    checks: list[tuple[str | None, list, pl.Expr, Any]] = []

    def dtype(node: Any) -> pl.DataType:
        try:
            return frame.select(_expr(node).alias("v")).collect_schema()["v"]
        except (pl.exceptions.PolarsError, ValueError):
            return pl.Null  # an unknown column or type error: said where it is evaluated

    def visit(node: Any) -> None:
        payload = next(iter(node.values()))
        paths = _children(payload)
        for path in paths:
            visit(_get(payload, path))
        if not paths or "Cast" in node:  # a strict cast fails on overflow, never wraps
            return
        out = dtype(node)
        if out in _WIDER:
            raise _wider_error(where, text, out)
        if not out.is_integer():
            return
        integer = [path for path in paths if dtype(_get(payload, path)).is_integer()]
        if integer:
            exact = _shadow(node, integer, "Int128").cast(pl.Int128)
            flag = exact.ne_missing(_expr(node).cast(pl.Int128)).fill_null(False)
            if _operation(node) is None:
                # not + - * abs: the Int128 result may wrap too (a power), so a Float64
                # magnitude (inputs cast) far past int64 flags the row as well
                far = _shadow(node, integer, "Float64").abs() >= _FLOAT_EDGE
                flag = flag | far.fill_null(False)
            inputs = [_get(payload, p) for p in paths]
            checks.append((_operation(node), inputs, flag, node))

    visit(tree)
    try:
        flags = _needed(data, checks)
    except _Wider as exc:
        raise _wider_error(where, text, exc.args[0]) from None
    if not flags:
        return None
    return pl.any_horizontal(flags) if len(flags) > 1 else flags[0]


# The values each integer type holds: a result of that type outside them has wrapped.
_RANGES = {
    **{
        t: (-(2 ** (b - 1)), 2 ** (b - 1) - 1)
        for t, b in ((pl.Int8, 8), (pl.Int16, 16), (pl.Int32, 32), (pl.Int64, 64))
    },
    **{t: (0, 2**b - 1) for t, b in ((pl.UInt8, 8), (pl.UInt16, 16), (pl.UInt32, 32))},
}


def _operation(node: Any) -> str | None:
    """ "+", "-", "*" or "abs" for those nodes (whose result range follows from their
    inputs' ranges), else None."""
    kind, payload = next(iter(node.items()))
    if kind == "BinaryExpr":
        return {"Plus": "+", "Minus": "-", "Multiply": "*"}.get(payload["op"])
    if kind == "Function":
        function = payload["function"]
        if function == "Abs":
            return "abs"
        if isinstance(function, dict) and isinstance(function.get("Sql"), dict):
            return {"Plus": "+", "Minus": "-", "Mul": "*"}.get(function["Sql"].get("Binary"))
    return None


def _min_max(child: pl.Expr, key: str) -> tuple[pl.Expr, pl.Expr]:
    """The min and max of `child` as Int128. A constant (no column) is cast first: Polars'
    reductions trust its schema type, which for a folded constant may not be the one it has."""
    if not child.meta.root_names():
        child = child.cast(pl.Int128)
    return (
        child.min().cast(pl.Int128).alias(f"lo{key}"),
        child.max().cast(pl.Int128).alias(f"hi{key}"),
    )


def _needed(frame: pl.LazyFrame, checks: list) -> list[pl.Expr]:
    """The flags of `checks` that may be true: a +, -, * or abs whose inputs' ranges (one
    pass of min and max) keep every result inside its type cannot wrap, and needs no flag.
    The type is the one Polars computes in, read from the result (a constant such as
    `1 + 9223372036854775807` is computed in another type than its schema says)."""
    if not checks:
        return []
    # The types Polars computes in, from a row (no reduction: it trusts the schema's type).
    types = frame.head(1).select(_expr(c[3]).alias(f"t{k}") for k, c in enumerate(checks))
    types_found = types.collect().schema
    for dtype in types_found.values():
        if dtype in _WIDER:
            raise _Wider(dtype)
    known = [(k, *c) for k, c in enumerate(checks) if c[0] and len(c[1]) <= 2]
    bounds = [
        e
        for i, (_k, _op, inputs, _flag, _node) in enumerate(known)
        for j, child in enumerate(inputs)
        for e in _min_max(_expr(child), f"{i}_{j}")
    ]
    row = frame.select(bounds).collect().row(0, named=True) if bounds else {}
    safe = set()
    for i, (k, op, inputs, flag, _node) in enumerate(known):
        fits = _RANGES.get(types_found[f"t{k}"])
        ranges = [(row[f"lo{i}_{j}"], row[f"hi{i}_{j}"]) for j in range(len(inputs))]
        if fits is None or any(lo is None or hi is None for lo, hi in ranges):
            continue
        (a, b), (c, d) = ranges[0], ranges[-1]
        ends = {
            "+": (a + c, b + d),
            "-": (a - d, b - c),
            "*": (a * c, a * d, b * c, b * d),
            "abs": (abs(a), abs(b)),
        }[op]
        if min(ends) >= fits[0] and max(ends) <= fits[1]:
            safe.add(id(flag))
    return [flag for _op, _inputs, flag, _node in checks if id(flag) not in safe]


def first_overflow(frame: pl.LazyFrame, expr: pl.Expr, where: str, text: str) -> int | None:
    """The position of the first row of `frame` where an integer operation of `expr` would
    wrap around int64, or None (see overflow_flag)."""
    flag = overflow_flag(expr, frame, where, text)
    if flag is None:
        return None
    found = frame.select(flag.arg_true().first().alias("at")).collect()["at"][0]
    return None if found is None else int(found)


def overflow_error(where: str, text: str, row: int) -> ConfigError:
    return ConfigError(
        f"{where}: {text!r} overflows int64 at index row {row}; integer arithmetic is "
        "checked, not wrapped: compute in floating point (`n_tokens::float * ...`) for "
        "larger values"
    )
