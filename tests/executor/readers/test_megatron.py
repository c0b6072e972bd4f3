"""Megatron reader: the sample .bin read at random equals a plain read, open and fetch read
a constant part of the .idx, nothing is cached across opens, and its errors."""

from __future__ import annotations

import numpy as np
import pytest
from reader_helpers import (
    SAMPLE,
    assert_payloads_equal,
    fetch_all,
    reader_for,
    shuffled_with_repeats,
)

from mds.core.lru import LRU
from mds.errors import SourceDataError
from mds.formats.megatron import write_dataset


def test_sample_megatron_matches_the_bin():
    prefix = SAMPLE / "math/math_text_document"
    idx = prefix.with_suffix(".idx").read_bytes()
    n = int.from_bytes(idx[18:26], "little")
    sizes = np.frombuffer(idx, dtype="<i4", count=n, offset=34)
    tokens = np.fromfile(prefix.with_suffix(".bin"), dtype="<u2")
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    expected = [tokens[bounds[i] : bounds[i + 1]] for i in range(n)]
    order = shuffled_with_repeats(n)
    reader = reader_for(
        "megatron",
        prefix.with_suffix(".bin"),
        "token_ids",
        "",
        companion=prefix.with_suffix(".idx"),
    )
    assert_payloads_equal(fetch_all(reader, order), [expected[i].tolist() for i in order])


def test_megatron_round_trip_and_errors(tmp_path):
    sequences = [np.arange(i, dtype=np.int64) * 3 for i in range(30)]
    (tmp_path / "math").mkdir()
    bin_path, idx_path = write_dataset(tmp_path / "math/m", sequences, dtype=np.int32)
    reader = reader_for(
        "megatron", bin_path, "token_ids", "", companion=idx_path, display="math/m.bin"
    )
    order = np.array([29, 0, 7, 7])
    assert_payloads_equal(reader.fetch(order, None, None), [sequences[i] for i in order])
    with pytest.raises(
        SourceDataError,
        match=r"^math/m\.bin sequence 30 is beyond the file's 30 sequences \(file changed since indexing\?\)$",
    ):
        reader.fetch(np.array([30]), None, None)
    reader.close()
    bin_path.write_bytes(bin_path.read_bytes()[:-4])
    with pytest.raises(
        SourceDataError, match=r"^math/m\.bin: Megatron \.bin is \d+ bytes but m\.idx implies"
    ):
        reader_for("megatron", bin_path, "token_ids", "", companion=idx_path, display="math/m.bin")
    idx_path.write_bytes(b"garbage" * 10)
    with pytest.raises(SourceDataError, match=r"^math/m\.idx: not a Megatron \.idx file"):
        reader_for("megatron", bin_path, "token_ids", "", companion=idx_path, display="math/m.bin")
    idx_path.unlink()
    with pytest.raises(
        SourceDataError, match=r"^math/m\.idx: cannot open \(No such file or directory\)$"
    ):
        reader_for("megatron", bin_path, "token_ids", "", companion=idx_path, display="math/m.bin")


def test_megatron_float_data_is_not_token_ids(tmp_path):
    bin_path, idx_path = write_dataset(tmp_path / "f", [np.ones(3)], dtype=np.float32)
    with pytest.raises(
        SourceDataError, match=r"^f\.bin: Megatron dtype is float32, not integer token ids$"
    ):
        reader_for("megatron", bin_path, "token_ids", "", companion=idx_path, display="f.bin")


def test_megatron_open_reads_a_constant_part_of_the_index(tmp_path, monkeypatch):
    """Opening reads the header and two entries; a fetch 12 .idx bytes per sequence: the
    cost follows what is read, not the number of sequences."""
    import os as os_module

    reads: list[tuple[int, int]] = []
    real = os_module.pread

    def counting(fd, size, offset):
        reads.append((size, offset))
        return real(fd, size, offset)

    for count in (10, 5000):
        sequences = [np.full(1 + i % 7, i, dtype=np.int64) for i in range(count)]
        bin_path, idx_path = write_dataset(tmp_path / f"m{count}", sequences, dtype=np.int32)
        monkeypatch.setattr(os_module, "pread", counting)
        reads.clear()
        reader = reader_for("megatron", bin_path, "token_ids", "", companion=idx_path)
        opened = list(reads)
        got = reader.fetch(np.array([count - 1, 0, 3]), None, None)
        reader.close()
        monkeypatch.undo()
        assert_payloads_equal(got, [sequences[count - 1], sequences[0], sequences[3]])
        assert len(opened) == 2 and sum(size for size, _ in opened) == 12
        assert len(reads) == 2 + 3 * 3  # per sequence: size, pointer, data


def test_megatron_bad_entry_of_a_read_sequence(tmp_path):
    """An index damaged after indexing: the sequence read names the .idx and the problem."""
    sequences = [np.arange(i + 1, dtype=np.int64) for i in range(20)]
    bin_path, idx_path = write_dataset(tmp_path / "m", sequences, dtype=np.int32)
    raw = bytearray(idx_path.read_bytes())
    raw[34 + 4 * 5 : 34 + 4 * 6] = (-3).to_bytes(4, "little", signed=True)  # size of 5
    raw[34 + 4 * 20 + 8 * 7 : 34 + 4 * 20 + 8 * 8] = (10**9).to_bytes(8, "little")  # pointer of 7
    idx_path.write_bytes(bytes(raw))
    reader = reader_for("megatron", bin_path, "token_ids", "", companion=idx_path)
    assert_payloads_equal(reader.fetch(np.array([4]), None, None), [sequences[4]])
    with pytest.raises(SourceDataError, match=r"^m\.idx: sequence 5 has negative size -3$"):
        reader.fetch(np.array([5]), None, None)
    with pytest.raises(SourceDataError, match=r"^m\.idx: sequence 7: pointer 1000000000 .* leave"):
        reader.fetch(np.array([7]), None, None)
    reader.close()


def test_a_rewritten_megatron_index_is_read_afresh(tmp_path):
    """Nothing of a Megatron file is cached across opens: a rewrite is seen at once."""
    sequences = [np.arange(i + 1, dtype=np.int64) for i in range(20)]
    bin_path, idx_path = write_dataset(tmp_path / "m", sequences, dtype=np.int32)
    blocks = LRU(max_bytes=1 << 20)
    reader_for("megatron", bin_path, "token_ids", "", blocks, companion=idx_path).close()
    shorter = [s + 1 for s in sequences[:5]]
    write_dataset(tmp_path / "m", shorter, dtype=np.int32)
    reader = reader_for("megatron", bin_path, "token_ids", "", blocks, companion=idx_path)
    assert_payloads_equal(reader.fetch(np.array([4]), None, None), [shorter[4]])
    with pytest.raises(SourceDataError, match="sequence 5 is beyond"):
        reader.fetch(np.array([5]), None, None)
    reader.close()
