"""Source pools: eligible rows after filter and overlong handling, lengths and integer costs."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from plan_builders import make_pool, plan_config, synthetic

from mds.errors import ConfigError, PlanError
from mds.planner.index.tables import read_manifest
from mds.planner.plan.columns import AllRows
from mds.planner.plan.pool import COST_SCALE, load_pools, needed_columns, quantize

A_LENGTHS = [5, 0, 12, 3000, 7, 40]
SOURCES = {
    "a": {
        "lengths": A_LENGTHS,
        "weight": 1.0,
        "meta": {
            "q": [0.5, 0.25, 3.0, 0.75, 1.0, 2.0],
            "lang": ["en", "fr", "en", "de", "en", "fr"],
        },
    },
    "b": {"lengths": [1, 2, 3], "weight": 2.0, "meta": {"lang": ["en", "en", "sv"]}},
    "c": {"lengths": [100, 200, 300, 400], "weight": 0.5},
}
TRAIN = {"steps": 4, "dp_size": 2, "samples_per_step": 4, "max_tokens_per_micro_batch": 1000}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("pool")
    synthetic(root, SOURCES, TRAIN)
    return root


def pools(root, *, cost=None, sources=None, only=None, **train):
    data = synthetic(root, SOURCES, TRAIN, cost=cost, build=False)
    if only is not None:  # plan a subset of the indexed sources
        data["source"] = [t for t in data["source"] if t["name"] in only]
    for table in data["source"]:
        table.update((sources or {}).get(table["name"], {}))
    cfg = plan_config(root, data, **train)
    return load_pools(cfg, read_manifest(cfg.index))


def by_name(ps):
    return {p.name: p for p in ps}


def test_overlong_error_names_source_row_and_tokens(root):
    with pytest.raises(PlanError) as err:
        pools(root)
    msg = str(err.value)
    assert "source 'a' row 3: 3000 tokens exceed max_tokens_per_micro_batch = 1000" in msg
    assert "(1 such samples)" in msg and 'overlong = "drop"' in msg


def test_drop_removes_overlong_and_empty_rows(root):
    p = by_name(pools(root, overlong="drop"))
    a = p["a"]
    assert a.rows.tolist() == [0, 2, 4, 5]  # row 1 has 0 tokens, row 3 is overlong
    assert a.lengths.tolist() == [5, 12, 7, 40]
    assert (a.dropped, a.truncated, a.n, a.index_rows) == (1, 0, 4, 6)
    assert p["b"].rows.tolist() == [0, 1, 2] and p["b"].dropped == 0
    assert [x.base for x in p.values()] == [0, 6, 9]
    assert [x.index for x in p.values()] == [0, 1, 2]


def test_truncate_keeps_overlong_rows_capped(root):
    a = by_name(pools(root, overlong="truncate"))["a"]
    assert a.rows.tolist() == [0, 2, 3, 4, 5]
    assert a.lengths.tolist() == [5, 12, 1000, 7, 40]
    assert (a.dropped, a.truncated) == (0, 1)


def test_filter(root):
    p = by_name(pools(root, overlong="drop", sources={"a": {"filter": "lang = 'en' AND q > 0.6"}}))
    assert p["a"].rows.tolist() == [2, 4]
    p = by_name(pools(root, sources={"a": {"filter": "n_tokens < 1000"}}))
    assert p["a"].rows.tolist() == [0, 2, 4, 5] and p["a"].dropped == 0  # filtered, not dropped
    p = by_name(pools(root, overlong="drop", sources={"b": {"filter": "lang = 'xx'"}}))
    assert p["b"].n == 0


def test_filter_and_cost_expression_may_use_the_row_index(root):
    p = by_name(pools(root, overlong="drop", sources={"a": {"filter": "row % 2 = 0"}}))
    assert p["a"].rows.tolist() == [0, 2, 4]
    (a,) = pools(root, overlong="drop", cost={"expr": "row * 10 + 1"}, only=["a"])
    assert a.raw_costs.tolist() == [1.0, 21.0, 41.0, 51.0]


def test_filter_keeping_every_row_holds_no_row_array(root):
    p = by_name(pools(root, overlong="drop", sources={"b": {"filter": "n_tokens >= 0"}}))
    assert isinstance(p["b"].rows, AllRows) and p["b"].rows.tolist() == [0, 1, 2]


def test_narrow_dtypes(root):
    # lengths fit int32 under any capacity below 2^31; rows uint32 while global ids fit
    for pool in pools(root, overlong="drop"):
        assert pool.lengths.dtype == np.int32 and pool.rows.dtype == np.uint32
        assert pool.raw_costs.dtype == np.float64 and pool.costs.dtype == np.int64


def test_columns_read_are_n_tokens_and_those_the_expressions_name():
    schema = pl.Schema(
        {"file_id": pl.UInt32, "n_tokens": pl.UInt32, "lang": pl.String, "q": pl.Float64}
    )
    assert needed_columns(schema, []) == ["n_tokens"]
    assert needed_columns(schema, ["q > 1 AND lang = 'en'", "row + n_tokens"]) == [
        "n_tokens",
        "lang",
        "q",
    ]
    # unknown or unparsable: every column, so the error raised later lists them all
    assert needed_columns(schema, ["nope > 1"]) is None
    assert needed_columns(schema, ["n_tokens >>> 1"]) is None


def test_default_cost_is_a_l_plus_b_l2(root):
    p = by_name(pools(root, overlong="drop", cost={"a": 3.0, "b": 0.5}))
    L = p["a"].lengths.astype(float)
    assert np.array_equal(p["a"].raw_costs, 3.0 * L + 0.5 * L * L)


def test_cost_expression_over_a_metadata_column(root):
    # only source a has `q`, so plan a alone
    (a,) = pools(root, overlong="drop", cost={"expr": "q * 10 + n_tokens"}, only=["a"])
    assert a.raw_costs.tolist() == [10.0, 42.0, 17.0, 60.0]
    assert (a.base, a.index) == (0, 0)


def test_cost_expression_constant_is_broadcast(root):
    p = by_name(pools(root, overlong="drop", cost={"expr": "2.5"}))
    for pool in p.values():
        assert pool.raw_costs.tolist() == [2.5] * pool.n
        assert pool.costs.tolist() == [int(COST_SCALE)] * pool.n


@pytest.mark.parametrize(
    ("sources", "message"),
    [
        (
            {"a": {"filter": "n_tokens >>> 3"}},
            "source 'a': `filter`: not a valid SQL expression: 'n_tokens >>> 3'",
        ),
        ({"a": {"filter": "nope > 3"}}, "source 'a': `filter`: 'nope > 3' uses an unknown column"),
        ({"a": {"filter": "lang"}}, "source 'a': `filter`: cannot evaluate 'lang'"),
        (
            {"c": {"filter": "lang = 'en'"}},
            "source 'c': `filter`: \"lang = 'en'\" uses an unknown column",
        ),
    ],
)
def test_bad_filters(root, sources, message):
    with pytest.raises(ConfigError) as err:
        pools(root, overlong="drop", sources=sources)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        (
            "q - 1",
            "[cost] `expr` (source 'a'): gives -0.5 for index row 0; costs must be finite and >= 0",
        ),
        ("n_tokens / 0", "gives inf for index row 0"),
        ("lang", "[cost] `expr` (source 'a'): must be numeric, got String"),
        ("zz * 2", "[cost] `expr` (source 'a'): 'zz * 2' uses an unknown column"),
        ("n_tokens +* 2", "[cost] `expr` (source 'a'): not a valid SQL expression"),
        ("q * 2", "[cost] `expr` (source 'b'): 'q * 2' uses an unknown column"),
    ],
)
def test_bad_cost_expressions(root, expr, message):
    with pytest.raises(ConfigError) as err:
        pools(root, overlong="drop", cost={"expr": expr})
    assert message in str(err.value)


def test_negative_cost_names_the_index_row_not_the_position(root):
    # row 1 (0 tokens) is not eligible: the first bad position is index row 2
    with pytest.raises(ConfigError, match="for index row 2;"):
        pools(root, overlong="drop", cost={"expr": "2 - q"}, only=["a"])


def test_source_missing_from_the_index(tmp_path):
    small = synthetic(tmp_path, {"a": {"lengths": [1, 2], "weight": 1}}, TRAIN)
    big = synthetic(
        tmp_path,
        {"a": {"lengths": [1, 2], "weight": 1}, "zz": {"lengths": [3], "weight": 1}},
        TRAIN,
        build=False,
    )
    assert small["index"] == big["index"]
    cfg = plan_config(tmp_path, big)
    with pytest.raises(ConfigError) as err:
        load_pools(cfg, read_manifest(cfg.index))
    msg = str(err.value)
    assert "source 'zz' is in the mix but not in the index" in msg
    assert "(it has a); re-run `mds index`" in msg


def test_mix_may_use_a_subset_in_another_order(root):
    c, b = pools_reordered(root)
    assert (b.name, b.index, b.base, b.rows.tolist()) == ("b", 1, 6, [0, 1, 2])
    assert (c.name, c.index, c.base, c.index_rows) == ("c", 0, 9, 4)


def pools_reordered(root):
    data = synthetic(root, SOURCES, TRAIN, build=False)
    data["source"] = [data["source"][2], data["source"][1]]  # c, b
    cfg = plan_config(root, data)
    return load_pools(cfg, read_manifest(cfg.index))


def test_quantize_scales_the_largest_cost_to_2_40():
    ps = [make_pool("x", [1, 10, 100], a=1.0, b=1.0), make_pool("y", [1000, 3], a=1.0, b=1.0)]
    quantize(ps)
    peak = 1000.0 + 1000.0**2
    assert ps[1].costs[0] == int(COST_SCALE)
    for p in ps:
        assert p.costs.dtype == np.int64
        expected = np.rint(p.raw_costs * (COST_SCALE / peak)).astype(np.int64)
        assert np.array_equal(p.costs, np.maximum(expected, 1))


def test_quantize_gives_every_nonempty_sample_at_least_one_unit():
    ps = [make_pool("x", [1, 2**30], a=1.0, b=0.0)]
    ps[0].raw_costs = np.array([0.0, 1.0])
    quantize(ps)
    assert ps[0].costs.tolist() == [1, int(COST_SCALE)]


def test_quantize_all_zero_and_empty_pools():
    ps = [make_pool("x", [], a=1.0), make_pool("y", [3, 4])]
    ps[1].raw_costs = np.zeros(2)
    quantize(ps)
    assert ps[0].costs.tolist() == [] and ps[1].costs.tolist() == [1, 1]


@pytest.mark.parametrize(
    ("sources", "cost", "message"),
    [
        (
            {"c": {"filter": "n_tokens * 100000000000000000 > 0"}},
            None,
            "source 'c': `filter`: 'n_tokens * 100000000000000000 > 0' overflows int64 at "
            "index row 0;",
        ),
        (
            {"c": {"filter": "abs(0 - n_tokens * 92233720368547758) > 5"}},
            None,
            "overflows int64 at index row 1;",
        ),
        (
            None,
            {"expr": "n_tokens * 92233720368547758 - n_tokens * 92233720368547758 + 1"},
            "[cost] `expr` (source 'c'): 'n_tokens * 92233720368547758 - n_tokens * "
            "92233720368547758 + 1' overflows int64 at index row 1;",
        ),
        (None, {"expr": "n_tokens * 4611686018427387904 + 1"}, "at index row 0;"),
    ],
)
def test_integer_overflow_in_filter_or_cost_is_refused_naming_the_row(root, sources, cost, message):
    with pytest.raises(ConfigError) as err:
        pools(root, sources=sources, cost=cost, only=["c"])
    assert message in str(err.value), err.value


def test_integer_arithmetic_that_fits_int64_is_exact(root):
    p = by_name(
        pools(root, only=["c"], sources={"c": {"filter": "n_tokens * 23058430092136939 > 0"}})
    )
    assert p["c"].n == 4  # 400 * 23058430092136939 < 2^63
    p = by_name(pools(root, only=["c"], cost={"expr": "n_tokens * 23058430092136939 - 1"}))
    assert np.asarray(p["c"].raw_costs).tolist() == [
        n * 23058430092136939 - 1.0 for n in (100, 200, 300, 400)
    ]
