"""Tests for the Megatron .bin/.idx reader and writer: round trips, the exact byte format, and
every validation error."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mds.errors import SourceDataError
from mds.formats.megatron import (
    DTYPE_CODES,
    MAGIC,
    check_bin,
    open_bin,
    read_index,
    read_sequence,
    write_dataset,
)

ALL_DTYPES = [DTYPE_CODES[code] for code in sorted(DTYPE_CODES)]


def _values(dtype: np.dtype) -> st.SearchStrategy:
    if dtype.kind == "f":
        return st.floats(allow_nan=False, width=dtype.itemsize * 8)
    info = np.iinfo(dtype)
    return st.integers(int(info.min), int(info.max))


def _idx(
    sizes: list[int],
    pointers: list[int],
    docs: list[int],
    *,
    code: int = 8,
    version: int = 1,
    magic: bytes = MAGIC,
    tail: bytes = b"",
) -> bytes:
    """An .idx built field by field with struct, independent of write_dataset."""
    n, d = len(sizes), len(docs)
    return (
        magic
        + struct.pack("<Q", version)
        + struct.pack("<B", code)
        + struct.pack("<Q", n)
        + struct.pack("<Q", d)
        + struct.pack(f"<{n}i", *sizes)
        + struct.pack(f"<{n}q", *pointers)
        + struct.pack(f"<{d}q", *docs)
        + tail
    )


def _write(tmp_path: Path, data: bytes, name: str = "d.idx") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


# A valid uint16 index of three sequences (2, 0 and 3 tokens) in two documents.
GOOD = {"sizes": [2, 0, 3], "pointers": [0, 4, 4], "docs": [0, 2, 3]}


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_round_trip_every_dtype(tmp_path: Path, dtype: np.dtype, data: st.DataObject) -> None:
    sequences = data.draw(st.lists(st.lists(_values(dtype), max_size=40), max_size=12))
    bin_path, idx_path = write_dataset(tmp_path / "ds", sequences, dtype=dtype)
    index = read_index(idx_path)
    assert index.dtype == dtype
    assert index.sizes.dtype == np.int32 and index.pointers.dtype == np.int64
    assert index.sizes.tolist() == [len(s) for s in sequences]
    assert index.document_indices.tolist() == list(range(len(sequences) + 1))
    check_bin(index, bin_path)
    mapped = open_bin(index, bin_path)
    for i, sequence in enumerate(sequences):
        got = read_sequence(mapped, index, i)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, np.array(sequence, dtype=dtype))
        np.testing.assert_array_equal(read_sequence(bin_path, index, i), got)


def test_writer_matches_hand_built_bytes(tmp_path: Path) -> None:
    bin_path, idx_path = write_dataset(tmp_path / "ds", [[1, 2], [], [3, 4, 65535]])
    assert idx_path.read_bytes() == _idx([2, 0, 3], [0, 4, 4], [0, 1, 2, 3])
    assert bin_path.read_bytes() == struct.pack("<5H", 1, 2, 3, 4, 65535)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_reads_hand_built_index(tmp_path: Path) -> None:
    path = _write(tmp_path, _idx(GOOD["sizes"], GOOD["pointers"], GOOD["docs"], code=8))
    # magic, version 1, dtype code 8 (uint16), 3 sequences, 3 document indices
    header = MAGIC + bytes([1, 0, 0, 0, 0, 0, 0, 0, 8]) + bytes([3] + [0] * 7) * 2
    assert path.read_bytes()[:34] == header
    index = read_index(path)
    assert index.dtype == np.uint16
    assert index.sizes.tolist() == [2, 0, 3]
    assert index.pointers.tolist() == [0, 4, 4]
    assert index.document_indices.tolist() == [0, 2, 3]
    assert index.bin_nbytes == 10
    assert not index.sizes.flags.writeable  # a view of the map, not a copy
    bin_path = tmp_path / "d.bin"
    bin_path.write_bytes(struct.pack("<5H", 7, 8, 9, 10, 11))
    assert read_sequence(bin_path, index, 1).tolist() == []
    assert read_sequence(bin_path, index, 2).tolist() == [9, 10, 11]


def test_empty_dataset(tmp_path: Path) -> None:
    bin_path, idx_path = write_dataset(tmp_path / "empty", [])
    assert bin_path.stat().st_size == 0
    assert idx_path.read_bytes() == _idx([], [], [0])
    index = read_index(idx_path)
    assert len(index) == 0 and index.bin_nbytes == 0
    check_bin(index, bin_path)
    assert len(open_bin(index, bin_path)) == 0
    with pytest.raises(IndexError):
        read_sequence(bin_path, index, 0)


def test_sequence_modes_trailer_is_accepted(tmp_path: Path) -> None:
    tail = struct.pack("<3b", 0, 1, 0)
    path = _write(tmp_path, _idx(GOOD["sizes"], GOOD["pointers"], GOOD["docs"], tail=tail))
    assert read_index(path).sizes.tolist() == [2, 0, 3]


def _error(tmp_path: Path, data: bytes) -> str:
    path = _write(tmp_path, data)
    with pytest.raises(SourceDataError) as info:
        read_index(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "bad magic"),
        (b"TNTIDX\x00\x00" + b"\x00" * 40, "bad magic"),
        (MAGIC + b"\x01\x00", "truncated Megatron .idx header"),
        (_idx([], [], [0], version=2), "unsupported Megatron .idx version 2"),
        (_idx([], [], [0], code=0), "unknown Megatron dtype code 0"),
        (_idx([], [], [0], code=9), "unknown Megatron dtype code 9"),
        (_idx([1, 2], [0, 2], [0, 2])[:-1], "file too short for 2 sequences"),
        (_idx([1, 2], [0, 2], [0, 2])[:40], "file too short"),
        (_idx([1, 2], [0, 2], [0, 2], tail=b"\x00"), "1 unexpected bytes"),
        (_idx([1, 2], [0, 2], [0, 2], tail=b"\x00" * 3), "3 unexpected bytes"),
        (_idx([1, 2], [0, 4], [0, 2]), "pointer of sequence 1 is 4, expected 2"),
        (_idx([1, 2], [8, 10], [0, 2]), "pointer of sequence 0 is 8, expected 0"),
        (_idx([3, -1, 2], [0, 6, 4], [0, 3]), "sequence 1 has negative size -1"),
        (_idx([1, 2], [0, 2], [0, 1]), "document_indices must start at 0 and end at"),
        (_idx([1, 2], [0, 2], []), "document_indices must start at 0"),
        (_idx([1, 2, 3], [0, 2, 6], [0, 2, 1, 3]), "document_indices decrease at entry 2"),
    ],
)
def test_validation_errors(tmp_path: Path, data: bytes, expected: str) -> None:
    assert expected in _error(tmp_path, data)


def test_pointer_check_spans_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mds.formats.megatron as megatron

    monkeypatch.setattr(megatron, "_CHUNK", 2)
    sizes = [1, 2, 3, 4, 5]
    pointers = [0, 2, 6, 12, 20]  # uint16: running sum of sizes * 2
    assert read_index(_write(tmp_path, _idx(sizes, pointers, [0, 3, 5]))).bin_nbytes == 30
    bad = [0, 2, 6, 12, 21]
    assert "pointer of sequence 4 is 21, expected 20" in _error(tmp_path, _idx(sizes, bad, [0, 5]))


def test_missing_idx(tmp_path: Path) -> None:
    with pytest.raises(SourceDataError, match="cannot read Megatron index"):
        read_index(tmp_path / "nope.idx")


@pytest.mark.parametrize("delta", [-1, 1])
def test_wrong_bin_size(tmp_path: Path, delta: int) -> None:
    bin_path, idx_path = write_dataset(tmp_path / "ds", [[1, 2, 3], [4]], dtype=np.int32)
    bin_path.write_bytes(
        bin_path.read_bytes()[:delta] if delta < 0 else bin_path.read_bytes() + b"x"
    )
    index = read_index(idx_path)
    with pytest.raises(SourceDataError) as info:
        check_bin(index, bin_path)
    assert str(info.value).startswith(f"{bin_path}: ") and "implies 16" in str(info.value)
    with pytest.raises(SourceDataError):
        read_sequence(bin_path, index, 0)


def test_missing_bin(tmp_path: Path) -> None:
    _, idx_path = write_dataset(tmp_path / "ds", [[1]])
    with pytest.raises(SourceDataError, match="cannot read Megatron data file"):
        check_bin(read_index(idx_path), tmp_path / "other.bin")


def test_writer_rejects_values_outside_dtype(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="do not fit"):
        write_dataset(tmp_path / "ds", [[1], [70000]], dtype=np.uint16)
    assert list(tmp_path.iterdir()) == []  # no partial files, no temp files


def test_writer_rejects_unknown_dtype(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no Megatron code"):
        write_dataset(tmp_path / "ds", [[1]], dtype=np.uint32)


def test_read_sequence_rejects_wrong_array_dtype(tmp_path: Path) -> None:
    bin_path, idx_path = write_dataset(tmp_path / "ds", [[1, 2]])
    index = read_index(idx_path)
    with pytest.raises(TypeError):
        read_sequence(np.memmap(bin_path, dtype=np.uint8, mode="r"), index, 0)


def test_import_stays_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, mds.formats.megatron; "
        "bad = [m for m in ('polars', 'torch', 'pyarrow') if m in sys.modules]; "
        "sys.exit(','.join(bad) or None)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
