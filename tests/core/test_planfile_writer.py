"""The plan writer: the file layout of docs/plan-format.md, count widths, checksums ending
in NUL bytes, and an aborted write."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from planfile_builders import DP, MICRO, fetch_of, with_fetch, write_plan, written_plan

from mds.core.packed import decompress
from mds.core.planfile import (
    FETCH_COLUMNS,
    FORMAT_VERSION,
    MAGIC,
    checksum,
    decode_rank_block,
    decode_table,
    encode_chunk,
)
from mds.core.planfile_reader import PlanReader
from mds.core.planfile_writer import PlanWriter
from mds.errors import PlanError


@pytest.fixture
def plan(tmp_path):
    return written_plan(tmp_path)


def test_file_layout_follows_the_spec(plan):
    path, chunks, _, footer_bytes = plan
    data = path.read_bytes()
    assert data[:8] == MAGIC
    assert struct.unpack_from("<II", data, 8) == (FORMAT_VERSION, 0)
    offset, size, digest, magic = struct.unpack("<QQ8s8s", data[-32:])
    stored = data[offset : offset + size]  # the footer's JSON in a zstd frame
    assert magic == MAGIC and decompress(stored, 1 << 20) == footer_bytes
    assert digest == checksum(stored)
    assert offset + size + 32 == len(data)
    layout = json.loads(footer_bytes)["layout"]
    a, b, dir_offset, dir_sum, width = layout["chunks"][0]
    assert (a, b, width) == (0, 4, 1)
    directory = data[dir_offset : dir_offset + 24 * (DP + 1)]  # the blocks, the file table
    assert checksum(directory).hex() == dir_sum
    entries = [struct.unpack_from("<QQ8s", directory, 24 * k) for k in range(DP + 1)]
    assert [off for off, _n, _c in entries] == sorted(off for off, _n, _c in entries)
    for off, n, block_sum in entries:
        assert checksum(data[off : off + n]) == block_sum
    table_off, table_size, _ = entries[-1]
    table = decode_table(data[table_off : table_off + table_size])
    assert table.records == [(1, 10 + f, {"path": f"d/f{f}.jsonl", "size": f}) for f in range(3)]
    counts, ids = chunks[0][2][0]
    off, n, _ = entries[0]
    got_counts, got_ids, fetch = decode_rank_block(data[off : off + n], 4, MICRO, table)
    assert got_counts.tolist() == counts.tolist() and got_ids.tolist() == ids.tolist()
    assert all(
        getattr(fetch, c).tolist() == getattr(fetch_of(ids), c).tolist() for c in FETCH_COLUMNS
    )


@pytest.mark.parametrize(("peak", "width"), [(255, 1), (256, 2), (65535, 2), (65536, 4)])
def test_count_width_is_the_smallest_that_fits_the_chunk(tmp_path, peak, width):
    rng = np.random.default_rng(peak)
    big = (np.array([[peak], [1]]), rng.integers(0, 2**63, peak + 1).astype(np.uint64))
    small = (np.array([[0], [2]]), np.array([5, 2**63 + 7], dtype=np.uint64))
    path = tmp_path / "p.mds"
    one = (np.array([[1]]), small[1][:1])
    none = (np.array([[0]]), small[1][:0])
    write_plan(path, [(0, 2, [big, small]), (2, 3, [one, none])], id_width=8)
    with PlanReader(path) as r:
        assert [c[4] for c in r.chunks] == [width, 1]
        assert np.array_equal(r.rank_chunk(0, 0).counts, big[0])
        assert np.array_equal(r.rank_chunk(0, 0).ids, big[1])
        assert r.rank_chunk(0, 1).ids.tolist() == [5, 2**63 + 7]
        assert r.rank_chunk(1, 0).ids.tolist() == [5]
        assert r.rank_chunk(1, 1).counts.tolist() == [[0]]


def test_an_empty_plan(tmp_path):
    path = tmp_path / "p.mds"
    write_plan(path, [])
    with PlanReader(path) as r:
        assert r.steps == 0 and r.chunks == []
        with pytest.raises(PlanError, match="step 0 is outside the plan's 0 steps"):
            r.chunk_of(0)


def test_checksums_ending_in_nul_bytes(tmp_path):
    """The directory stores each block checksum in an 8-byte field; one ending in 0x00 must
    still verify (numpy's "S8" drops trailing NULs on read; 1 block in 256 is affected)."""
    found = []
    for seed in range(5000):
        counts = np.array([[1]])
        ids = np.array([seed], dtype=np.uint64)
        data = encode_chunk([with_fetch((counts, ids))], 1, 1, 2).payloads[0]
        if checksum(data)[-1] == 0:
            found.append((counts, ids))
            if len(found) == 2:
                break
    assert len(found) == 2
    path = tmp_path / "p.mds"
    write_plan(
        path,
        [
            (0, 1, [found[0], (np.array([[0]]), np.array([], np.uint64))]),
            (1, 2, [found[1], found[1]]),
        ],
        id_width=2,
    )
    with PlanReader(path) as r:
        assert r.micro == 1
        assert r.rank_chunk(0, 0).ids.tolist() == found[0][1].tolist()
        assert r.rank_chunk(1, 1).ids.tolist() == found[1][1].tolist()


def test_abort_removes_the_temporary_file(tmp_path):
    path = tmp_path / "p.mds"
    writer = PlanWriter(path, tmp_path / "p.tmp", dp_size=1, micro_batches=1, id_width=1)
    writer.add_chunk(0, 1, [with_fetch((np.array([[1]]), np.array([7], np.uint64)))])
    assert (tmp_path / "p.tmp").exists()
    writer.abort()
    assert not (tmp_path / "p.tmp").exists() and not path.exists()
    writer.abort()  # idempotent


def test_integer_sections_are_packed_by_column(tmp_path):
    """Version 4 stores a 1-d or 2-d integer section as zigzag columns: extremes of every
    width, unsigned values above 2^63, no columns or no rows read back exactly."""
    sections = {
        "wide": np.array([[0, 2**63 - 1, -(2**63)], [5, -1, 7]], dtype=np.int64),
        "unsigned": np.array([2**64 - 1, 0, 3], dtype=np.uint64),
        "narrow": np.zeros((3, 0), dtype=np.int32),
        "empty": np.zeros((0, 4), dtype=np.int16),
    }
    path = tmp_path / "p.mds"
    block = (np.array([[1, 0]]), np.array([9], dtype=np.uint64))
    write_plan(path, [(0, 1, [block] * DP)], sections=sections)
    with PlanReader(path) as r:
        for name, array in sections.items():
            assert r.sections[name]["codec"] == "columns"
            got = r.section(name)
            assert got.dtype == array.dtype and got.shape == array.shape
            assert np.array_equal(got, array)


def test_a_section_of_more_columns_than_a_frame_holds_is_byte_planes(tmp_path):
    """A frame holds at most 255 columns: a wider integer section (a cursor of 1024
    sources) is stored as byte planes."""
    wide = np.arange(3 * 300, dtype=np.int64).reshape(3, 300)
    path = tmp_path / "p.mds"
    block = (np.array([[1, 0]]), np.array([9], dtype=np.uint64))
    write_plan(path, [(0, 1, [block] * DP)], sections={"wide": wide})
    with PlanReader(path) as r:
        assert r.sections["wide"]["codec"] == "zstd"
        assert np.array_equal(r.section("wide"), wide)
