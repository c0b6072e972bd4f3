"""RowSlices: rows as slices of one array, sliced without copying, joined in the order
asked, narrowed to uint16 only where every value fits."""

from __future__ import annotations

import numpy as np
import pytest

from mds.core.row_slices import RowSlices


def test_rows_are_views_of_one_array_and_slicing_shares_it():
    rows = RowSlices.of_lengths(np.arange(10, dtype=np.int32), np.array([3, 0, 7]))
    assert len(rows) == 3 and [r.tolist() for r in rows] == [[0, 1, 2], [], list(range(3, 10))]
    assert rows[2].base is rows.values and rows[1:].values is rows.values
    assert [r.tolist() for r in rows[1:]] == [[], list(range(3, 10))]
    assert rows.nbytes == 40 + 2 * 3 * 8


def test_joined_puts_each_part_at_its_positions_at_the_widest_dtype():
    paged = RowSlices.of_lengths(np.arange(10, dtype=np.uint16), np.array([3, 7]))
    decoded = [np.array([70_000, 6], np.int32)]
    joined = RowSlices.joined([(np.array([0, 2]), paged), (np.array([1]), decoded)], 3)
    assert joined.values.dtype == np.int32
    assert [r.tolist() for r in joined] == [[0, 1, 2], [70_000, 6], list(range(3, 10))]
    assert joined.narrow() is joined  # 70,000 does not fit uint16


@pytest.mark.parametrize(
    ("values", "narrow"),
    [
        (np.array([0, 65_535], np.int32), np.uint16),
        (np.array([0, 65_536], np.int64), np.int64),
        (np.array([-1, 5], np.int32), np.int32),
        (np.array([1.0, 2.0]), np.float64),
        (np.array([], np.int32), np.int32),
    ],
)
def test_narrow_is_uint16_only_where_every_value_fits(values, narrow):
    rows = RowSlices.of_lengths(values, np.array([len(values)]))
    got = rows.narrow()
    assert got.values.dtype == narrow and np.array_equal(got[0], values)
