"""sqlexpr: expressions over index columns compute in signed 64-bit integers."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mds.errors import ConfigError
from mds.planner.plan.sqlexpr import first_overflow, signed_ints, sql_expr


def test_signed_ints_subtraction_does_not_wrap() -> None:
    frame = pl.DataFrame({"n_tokens": pl.Series([3, 200], dtype=pl.UInt32)})
    out = signed_ints(frame).select(sql_expr("n_tokens - 100", "t"))
    assert out.to_series().to_list() == [-97, 100]


def test_signed_ints_product_and_sum_above_2_32() -> None:
    frame = pl.DataFrame({"n_tokens": pl.Series([2**31, 2**31, 5], dtype=pl.UInt32)})
    wide = signed_ints(frame)
    assert wide.schema["n_tokens"] == pl.Int64
    assert wide["n_tokens"].sum() == 2**32 + 5
    assert wide.select(sql_expr("n_tokens * 4", "t")).to_series()[0] == 2**33


def test_signed_ints_lazy_keeps_other_columns() -> None:
    frame = pl.LazyFrame({"a": pl.Series([1], dtype=pl.UInt8), "b": ["x"], "c": [1.5]})
    schema = signed_ints(frame).collect_schema()
    assert dict(schema) == {"a": pl.Int64, "b": pl.String, "c": pl.Float64}


# --- integer overflow: every result is exact or refused ---------------------------------

INT64 = (-(2**63), 2**63 - 1)
COLUMNS = ("a", "b", "c")
# values near the int64 edges as well as small ones, so random expressions do overflow
VALUES = st.one_of(
    st.integers(-100, 100),
    st.integers(-(2**31), 2**31),
    st.integers(*INT64),
    st.sampled_from([2**62, -(2**62), 2**63 - 1, -(2**63), 3037000499, 3037000500]),
)


def _trees(leaf):
    def grow(children):
        unary = st.tuples(st.sampled_from(["neg", "abs"]), children)
        binary = st.tuples(st.sampled_from(["+", "-", "*"]), children, children)
        return unary | binary

    return st.recursive(leaf, grow, max_leaves=8)


LEAVES = st.one_of(
    st.sampled_from(COLUMNS).map(lambda c: ("col", c)),
    st.sampled_from(COLUMNS).map(lambda c: ("sum", c)),
    st.one_of(st.integers(0, 100), st.integers(0, 2**63 - 1)).map(lambda v: ("lit", v)),
    # powers of a column (Int64 inputs; a power of literals is folded in Polars' own types)
    st.tuples(
        st.sampled_from(["pow2", "pow3"]), st.sampled_from(COLUMNS).map(lambda c: ("col", c))
    ),
)


def _sql(tree) -> str:
    kind = tree[0]
    if kind == "col":
        return tree[1]
    if kind == "sum":
        return f"sum({tree[1]})"
    if kind == "lit":
        return str(tree[1])
    if kind == "neg":
        return f"-({_sql(tree[1])})"
    if kind == "abs":
        return f"abs({_sql(tree[1])})"
    if kind.startswith("pow"):
        return f"power({_sql(tree[1])}, {kind[3:]})"
    return f"({_sql(tree[1])} {kind} {_sql(tree[2])})"


def _exact(tree, row: dict, columns: dict, out_of_range: list) -> int:
    """The mathematically exact value; `out_of_range` collects any node outside int64."""
    kind = tree[0]
    if kind == "col":
        value = row[tree[1]]
    elif kind == "sum":
        value = sum(columns[tree[1]])
    elif kind == "lit":
        value = tree[1]
    elif kind in ("neg", "abs"):
        inner = _exact(tree[1], row, columns, out_of_range)
        value = -inner if kind == "neg" else abs(inner)
    elif kind.startswith("pow"):
        value = _exact(tree[1], row, columns, out_of_range) ** int(kind[3:])
    else:
        left = _exact(tree[1], row, columns, out_of_range)
        right = _exact(tree[2], row, columns, out_of_range)
        value = {"+": left + right, "-": left - right, "*": left * right}[kind]
    if not INT64[0] <= value <= INT64[1]:
        out_of_range.append(value)
    return value


@settings(max_examples=150, deadline=None)
@given(
    tree=_trees(LEAVES),
    columns=st.integers(1, 4).flatmap(
        lambda n: st.fixed_dictionaries(
            {c: st.lists(VALUES, min_size=n, max_size=n) for c in COLUMNS}
        )
    ),
)
def test_integer_expressions_are_exact_or_refused_never_wrapped(tree, columns) -> None:
    text = _sql(tree)
    frame = pl.LazyFrame(columns, schema={c: pl.Int64 for c in COLUMNS})
    expr = sql_expr(text, "t")
    n = len(columns["a"])
    rows = [{c: columns[c][i] for c in COLUMNS} for i in range(n)]
    try:
        wrapped = first_overflow(frame, expr, "t", text)
    except ConfigError as exc:  # Polars would compute past int64 (UInt64, Int128)
        assert "wider than int64" in str(exc)
        out: list[int] = []
        for row in rows:
            _exact(tree, row, columns, out)
        assert out, f"{text} refused as wider than int64, yet every step fits"
        return
    got = frame.with_columns(expr.alias("v")).select("v").collect()["v"].to_list()
    if wrapped is not None:
        # Justified: a step leaves int64, or Polars computes it narrower (a product of two
        # literals is Int32) and the result comes out wrong.
        out = []
        exact = _exact(tree, rows[wrapped], columns, out)
        assert out or got[wrapped] != exact, f"{text} refused at row {wrapped}, yet exact"
        for i in range(wrapped):  # the first such row
            out = []
            exact = _exact(tree, rows[i], columns, out)
            assert not out and got[i] == exact, f"{text}: row {i} wraps before {wrapped}"
        return
    for i in range(n):
        exact = _exact(tree, rows[i], columns, [])
        assert got[i] == exact, f"{text}: row {i} gives {got[i]}, exactly {exact}"


def test_a_power_that_wraps_past_int128_too_is_refused() -> None:
    """(2^43)^3 = 2^129 wraps to 0 in Int128 as in int64, so comparing the two cannot see
    it; the Float64 magnitude does."""
    frame = pl.LazyFrame({"x": [3, 2**43]}, schema={"x": pl.Int64})
    text = "power(x, 3) < 100"
    assert first_overflow(frame, sql_expr(text, "t"), "t", text) == 1
    assert first_overflow(frame.head(1), sql_expr(text, "t"), "t", text) is None
    # an exact result whose Float64 rounds up to 2^63 is not refused
    edge = pl.LazyFrame({"a": [9_223_372_036_846_386_688]}, schema={"a": pl.Int64})
    assert first_overflow(edge, sql_expr("sum(a)", "t"), "t", "sum(a)") is None


def test_integers_past_int64_are_decimal_exact_or_refused() -> None:
    frame = pl.LazyFrame({"a": [1, 2]})
    text = "a * 9223372036854775808"  # a literal past int64 is a Decimal: exact
    assert first_overflow(frame, sql_expr(text, "t"), "t", text) is None
    assert frame.select(sql_expr(text, "t")).collect().to_series().cast(pl.String).to_list() == [
        "9223372036854775808",
        "18446744073709551616",
    ]
    wide = pl.LazyFrame({"a": pl.Series([2**64 - 1], dtype=pl.UInt64)})
    with pytest.raises(ConfigError, match="wider than int64"):
        first_overflow(wide, sql_expr("a + 1", "t"), "t", "a + 1")
