"""The walk of Arrow IPC message headers: batches listed without reading their bodies,
each decoded alone, for files and streams, compressed or not; what it cannot read is one
error naming the file."""

from __future__ import annotations

import io

import pyarrow as pa
import pytest

from mds.errors import SourceDataError
from mds.formats.arrow_ipc import read_batch, read_batch_table

TABLE = pa.table(
    {
        "tokens": pa.array([list(range(i % 7)) for i in range(300)], type=pa.list_(pa.int32())),
        "text": [f"row {i}" for i in range(300)],
    }
)


def _ipc(stream: bool, compression: str | None = None, table: pa.Table = TABLE) -> bytes:
    sink = io.BytesIO()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    opener = pa.ipc.new_stream if stream else pa.ipc.new_file
    with opener(sink, table.schema, options=options) as writer:
        for batch in table.to_batches(max_chunksize=64):
            writer.write_batch(batch)
    return sink.getvalue()


class _Reads:
    """Reads of a bytes object, recorded."""

    def __init__(self, data: bytes):
        self.data, self.bytes_read = data, 0

    def __call__(self, n: int, pos: int) -> bytes:
        self.bytes_read += min(n, max(0, len(self.data) - pos))
        return self.data[pos : pos + n]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_batches_are_listed_and_each_read_alone(stream, compression):
    data = _ipc(stream, compression)
    read = _Reads(data)
    table = read_batch_table(read, len(data), "x.arrow")
    assert table.schema == TABLE.schema
    assert table.rows.tolist() == [64, 64, 64, 64, 44]
    batches = [read_batch(table, i, read) for i in range(len(table.rows))]
    assert pa.Table.from_batches(batches).equals(TABLE)


def test_the_walk_steps_over_the_bodies():
    big = pa.table({"tokens": [list(range(2000))] * 400})  # 3.2 MB in 7 batches
    data = _ipc(True, table=big)
    read = _Reads(data)
    read_batch_table(read, len(data), "big.arrow")
    assert read.bytes_read < len(data) // 4


def test_dictionary_batches_are_refused_by_name():
    table = pa.table({"lang": pa.array(["en", "de", "en"]).dictionary_encode()})
    data = _ipc(True, table=table)
    with pytest.raises(SourceDataError, match=r"^d.arrow: dictionary-encoded Arrow IPC"):
        read_batch_table(_Reads(data), len(data), "d.arrow")


@pytest.mark.parametrize("cut", [5, 200, -30])
def test_cut_or_foreign_bytes_are_an_error_naming_the_file(cut):
    data = _ipc(False)[:cut] if cut > 0 else b"PAR1" + _ipc(True)[4:cut]
    with pytest.raises(SourceDataError, match=r"^t.arrow: not a readable Arrow IPC"):
        read_batch_table(_Reads(data), len(data), "t.arrow")
