"""sqlexpr: expressions over index columns compute in signed 64-bit integers."""

from __future__ import annotations

import polars as pl

from mds.planner.sqlexpr import signed_ints, sql_expr


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
