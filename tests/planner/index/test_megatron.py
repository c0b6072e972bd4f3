"""The planner's Megatron scanner: lengths come from the .idx, the .bin size is checked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from builders import ctx, data_file, source

from mds.errors import SourceDataError
from mds.formats.megatron import write_dataset
from mds.planner.index.megatron import scan_megatron

SEQUENCES = [[1, 2, 3], [], [9] * 50, [4], list(range(1000))]


def _scan(bin_path: Path):
    return scan_megatron(data_file(bin_path), ctx(source(path="x"), "megatron"))


@pytest.mark.parametrize("dtype", [np.uint16, np.int32], ids=["uint16", "int32"])
def test_lengths_and_rows(tmp_path: Path, dtype) -> None:
    bin_path, _ = write_dataset(tmp_path / "doc", SEQUENCES, dtype)
    frame = _scan(bin_path)
    assert frame.columns == ["file_row", "n_tokens"]
    assert frame["n_tokens"].to_list() == [len(s) for s in SEQUENCES]
    assert frame["file_row"].to_list() == list(range(len(SEQUENCES)))


def test_empty_dataset(tmp_path: Path) -> None:
    bin_path, _ = write_dataset(tmp_path / "empty", [], np.uint16)
    assert _scan(bin_path).height == 0


@pytest.mark.parametrize("delta", [-2, 2], ids=["short", "long"])
def test_bin_of_the_wrong_size(tmp_path: Path, delta: int) -> None:
    bin_path, _ = write_dataset(tmp_path / "doc", SEQUENCES, np.uint16)
    data = bin_path.read_bytes()
    bin_path.write_bytes(data[:delta] if delta < 0 else data + b"\0" * delta)
    with pytest.raises(SourceDataError) as info:
        _scan(bin_path)
    message = str(info.value)
    assert message.startswith(f"{bin_path}: Megatron .bin is {len(data) + delta} bytes")
    assert f"doc.idx implies {len(data)}" in message


def test_corrupt_idx_names_the_idx(tmp_path: Path) -> None:
    _, idx_path = write_dataset(tmp_path / "doc", SEQUENCES, np.uint16)
    idx_path.write_bytes(b"NOTMAGIC!" + idx_path.read_bytes()[9:])
    with pytest.raises(SourceDataError, match=f"{idx_path}: not a Megatron .idx file"):
        _scan(tmp_path / "doc.bin")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_float_token_dtypes_are_refused(tmp_path: Path, dtype) -> None:
    bin_path, _ = write_dataset(tmp_path / "doc", [[1.0, 2.5], [3.0]], dtype)
    with pytest.raises(SourceDataError, match=r"^doc\.bin: token dtype float\d\d in doc\.idx"):
        scan_megatron(data_file(bin_path), ctx(source(format="megatron"), "megatron"))
