"""Per-position columns computed when read: each must equal the whole column made first."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mds.planner.plan.columns import AllRows, LengthCosts, QuantizedCosts


def eager_costs(lengths, a, b):
    L = np.asarray(lengths).astype(np.float64)
    return a * L + b * L * L


def eager_quantized(raw, lengths, scale):
    q = np.rint(np.asarray(raw) * scale).astype(np.int64)
    return np.where((q == 0) & (np.asarray(lengths) > 0), 1, q)


def test_all_rows_index_like_an_arange():
    rows = AllRows(10, np.uint32)
    whole = np.arange(10, dtype=np.uint32)
    assert len(rows) == 10 and rows.shape == (10,) and rows.dtype == np.uint32
    pos = np.array([3, 0, 9, 3])
    assert rows[pos].dtype == np.uint32 and rows[pos].tolist() == [3, 0, 9, 3]
    assert rows[2:7:2].tolist() == whole[2:7:2].tolist()
    assert rows[np.array([-1])].tolist() == [9]
    assert rows[whole % 3 == 0].tolist() == [0, 3, 6, 9]
    assert np.array_equal(np.asarray(rows), whole) and rows.tolist() == whole.tolist()
    with pytest.raises(IndexError):
        rows[np.array([10])]


@given(
    st.lists(st.integers(1, 2**31 - 1), min_size=1, max_size=50),
    st.floats(0, 1e12),
    st.floats(0, 1e6),
)
def test_length_costs_max_is_the_cost_of_the_longest_sample(lengths, a, b):
    lengths = np.asarray(lengths, dtype=np.int32)
    costs = LengthCosts(lengths, a, b)
    assert costs.max() == eager_costs(lengths, a, b).max()


def test_length_costs_equal_the_whole_column():
    lengths = np.array([5, 1, 4096, 77, 3], dtype=np.int32)
    for a, b in [(3.0, 0.5), (1.0, 1 / (6 * 4096)), (-2.0, 1.0), (10.0, -0.001)]:
        costs, whole = LengthCosts(lengths, a, b), eager_costs(lengths, a, b)
        assert np.array_equal(costs[np.array([4, 0, 2])], whole[[4, 0, 2]])
        assert np.array_equal(np.asarray(costs), whole) and costs.max() == whole.max()
        assert costs.dtype == np.float64 and len(costs) == 5


def test_length_costs_add_the_per_sample_constant():
    lengths = np.array([5, 1, 4096, 77, 3], dtype=np.int32)
    costs = LengthCosts(lengths, 3.0, 0.5, d=100.0)
    whole = eager_costs(lengths, 3.0, 0.5) + 100.0
    assert np.array_equal(np.asarray(costs), whole) and costs.max() == whole.max()
    # d = 0 leaves the costs bit for bit as without it
    assert np.array_equal(
        np.asarray(LengthCosts(lengths, 3.0, 0.5, 0.0)), eager_costs(lengths, 3.0, 0.5)
    )


def test_quantized_costs_equal_the_whole_column():
    lengths = np.array([5, 1, 4096, 77, 0], dtype=np.int32)
    for raw in (LengthCosts(lengths, 1.0, 0.001), np.array([0.0, 1e-9, 2.5, 1.0, 0.0])):
        scale = 2.0**40 / float(np.asarray(raw).max())
        costs, whole = QuantizedCosts(raw, lengths, scale), eager_quantized(raw, lengths, scale)
        assert costs.dtype == np.int64
        assert np.array_equal(costs[np.array([1, 4, 2])], whole[[1, 4, 2]])
        assert np.array_equal(np.asarray(costs), whole) and costs.tolist() == whole.tolist()
    assert QuantizedCosts(np.array([0.0]), np.array([3]), 1.0).tolist() == [1]  # never 0 units
