"""Arrow IPC reader: the sample stream read at random equals pyarrow's read, files and
streams by record batch, token payloads as read-only views of the map, and its errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from reader_helpers import (
    SAMPLE,
    assert_payloads_equal,
    fetch_all,
    reader_for,
    shuffled_with_repeats,
)

from mds.errors import SourceDataError


@pytest.mark.parametrize("kind, column", [("token_ids", "input_ids"), ("text", "text")])
def test_sample_arrow_stream_matches_read_all(kind, column):
    path = SAMPLE / "wiki/data-00000-of-00001.arrow"
    with pa.memory_map(str(path)) as source:
        expected = pa.ipc.open_stream(source).read_all().column(column).to_pylist()
    order = shuffled_with_repeats(len(expected))
    got = fetch_all(reader_for("arrow", path, kind, column), order)
    assert_payloads_equal(got, [expected[i] for i in order])


def _batches(n: int, per_batch: int) -> tuple[pa.Schema, list[pa.RecordBatch], list]:
    rows = [list(range(i % 11)) for i in range(n)]
    table = pa.table(
        {"text": [f"row {i}" for i in range(n)], "input_ids": pa.array(rows, pa.list_(pa.int64()))}
    )
    return table.schema, table.to_batches(max_chunksize=per_batch), rows


@pytest.mark.parametrize("layout", ["file", "stream"])
def test_arrow_file_and_stream_random_access(tmp_path, layout):
    schema, batches, rows = _batches(95, 10)
    path = tmp_path / f"x.{layout}.arrow"
    opener = pa.ipc.new_file if layout == "file" else pa.ipc.new_stream
    with pa.OSFile(str(path), "wb") as sink, opener(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    order = shuffled_with_repeats(95)
    reader = reader_for("arrow", path, "token_ids", "input_ids")
    assert reader.starts.tolist() == list(range(0, 91, 10)) + [95]
    assert_payloads_equal(reader.fetch(order, None, None), [rows[i] for i in order])
    got = reader_for("arrow", path).fetch(np.array([94, 0]), None, None)
    assert got == ["row 94", "row 0"]
    with pytest.raises(SourceDataError, match=r"row 95 is beyond the file's 95 rows"):
        reader.fetch(np.array([95]), None, None)
    reader.close()


def test_arrow_token_payloads_are_read_only_views(tmp_path):
    schema, batches, _ = _batches(20, 20)
    path = tmp_path / "x.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(batches[0])
    reader = reader_for("arrow", path, "token_ids", "input_ids")
    payload = reader.fetch(np.array([5]), None, None)[0]
    assert not payload.flags.writeable
    reader.close()


def test_arrow_errors(tmp_path):
    table = pa.table({"input_ids": pa.array([[1], None], pa.list_(pa.int32())), "n": [1.0, 2.0]})
    path = tmp_path / "wiki/data.arrow"
    path.parent.mkdir()
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    reader = reader_for("arrow", path, "token_ids", "input_ids", display="wiki/data.arrow")
    with pytest.raises(
        SourceDataError, match=r"^wiki/data\.arrow row 1: column 'input_ids' is null$"
    ):
        reader.fetch(np.array([1]), None, None)
    with pytest.raises(SourceDataError, match=r"^wiki/data\.arrow has no column 'tokens'"):
        reader_for("arrow", path, "token_ids", "tokens", display="wiki/data.arrow")
    with pytest.raises(SourceDataError, match=r"column 'n' is double, not text"):
        reader_for("arrow", path, "text", "n")
