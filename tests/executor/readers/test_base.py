"""What the readers share: row checks name the first row outside the file, `gather` loads
each block once and answers in request order, and decoded token blocks hand out copies or
views as asked."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from mds.errors import SourceDataError
from mds.executor.readers.base import check_rows, decoded_block, gather, row_starts


def test_check_rows_names_the_first_row_outside_the_file():
    assert check_rows(np.array([3, 0, 9]), 10, "f").dtype == np.int64
    assert check_rows(np.array([], dtype=np.int64), 0, "f").tolist() == []
    with pytest.raises(SourceDataError, match=r"^f row 10 is beyond the file's 10 rows"):
        check_rows(np.array([2, 10, -1]), 10, "f")
    with pytest.raises(SourceDataError, match=r"^f sequence -1 is beyond the file's 4 sequences"):
        check_rows(np.array([-1]), 4, "f", unit="sequence")


def test_gather_loads_each_block_once_in_request_order():
    rows = [list(range(i, i + i % 3)) for i in range(10)]
    array = pa.array(rows, pa.list_(pa.int32()))
    starts = row_starts([4, 4, 2])
    loads = []

    def load(b: int, need: int, row: int):
        loads.append((b, need))
        lo = int(starts[b])
        return decoded_block(array.slice(lo, int(starts[b + 1]) - lo), "token_ids", own=True)

    order = np.array([9, 0, 5, 1, 9, 4])
    got = gather(order, starts, load, lambda r: f"row {r}")
    assert [g.tolist() for g in got] == [rows[i] for i in order]
    assert sorted(loads) == [(0, 2), (1, 2), (2, 2)]  # each block up to the last row asked


def test_token_rows_are_copies_unless_views_are_asked_for():
    array = pa.array([[1, 2], [3], None], pa.list_(pa.int64()))
    local = np.array([0, 1])
    copied = decoded_block(array, "token_ids", own=False).take(local, local, str)
    viewed = decoded_block(array, "token_ids", own=False, views=True).take(local, local, str)
    assert [p.tolist() for p in copied] == [p.tolist() for p in viewed] == [[1, 2], [3]]
    assert copied[0].base is None and viewed[0].base is not None
    with pytest.raises(SourceDataError, match="^row 2 is null$"):
        decoded_block(array, "token_ids", own=True).take(
            np.array([2]), np.array([2]), "row {}".format
        )
    text = decoded_block(pa.array(["a", None]), "text", own=False)
    assert text.take(np.array([0]), np.array([0]), str) == ["a"]
