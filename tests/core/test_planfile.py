"""The plan file's codecs: a chunk's blocks and file table (versions 3 and 4), and version
2's fixed-width ids and blocks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planfile_builders import MICRO, fetch_of, write_plan

from mds.core.packed import unpack
from mds.core.planfile import (
    FETCH_COLUMNS,
    ChunkBlocks,
    Fetch,
    checksum,
    decode_block,
    decode_rank_block,
    decode_table,
    encode_chunk,
    encode_table,
)
from mds.core.planfile_reader import PlanReader
from mds.core.planfile_v2 import decode_ids, encode_chunk_v2, encode_fetch, encode_ids
from mds.errors import PlanError


@settings(max_examples=40, deadline=None)
@given(width=st.integers(1, 8), data=st.data())
def test_decode_inverts_encode_for_every_width(width, data):
    top = 2 ** (8 * width) - 1
    ids = data.draw(st.lists(st.integers(0, top), max_size=50))
    x = np.array(ids, dtype=np.uint64)
    raw = encode_ids(x, width)
    assert len(raw) == width * len(ids)
    out = decode_ids(raw, width)
    assert out.dtype == np.dtype("<u8")
    assert out.tolist() == ids


@pytest.mark.parametrize("width", range(1, 9))
def test_encode_is_little_endian_and_truncating(width):
    top = 2 ** (8 * width) - 1
    x = np.array([0, 1, top], dtype=np.uint64)
    raw = encode_ids(x, width)
    assert raw[:width] == b"\0" * width
    assert raw[width : 2 * width] == b"\x01" + b"\0" * (width - 1)
    assert raw[2 * width :] == b"\xff" * width
    assert decode_ids(memoryview(raw), width).tolist() == [0, 1, top]
    assert decode_ids(b"", width).tolist() == []


def table_of(encoded):
    """The file table of an encode_chunk result, as a plan's first chunk stores it."""
    return decode_table(encode_table(encoded.table))


def _random_blocks(rng, dp, top):
    blocks = []
    for _ in range(dp):
        counts = rng.integers(0, 3, (2, MICRO)) * int(rng.integers(0, 2))  # some ranks empty
        ids = rng.integers(0, top, int(counts.sum()), dtype=np.uint64)
        blocks.append((counts, ids, fetch_of(ids)))
    return blocks


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), dp=st.integers(1, 6), top=st.sampled_from([1, 300, 2**40]))
def test_encode_chunk_blocks_decode_to_what_was_encoded(seed, dp, top):
    """The chunk-wide encoder: each rank's block, with the chunk's file table, decodes to
    exactly its counts, ids and fetch records (empty ranks, files shared between ranks), the
    same bytes whether the blocks come as a list or as ChunkBlocks."""
    rng = np.random.default_rng(seed)
    blocks = _random_blocks(rng, dp, top)
    encoded = encode_chunk(blocks, 2, MICRO, 8)
    assert encoded == encode_chunk(ChunkBlocks.of(blocks), 2, MICRO, 8)
    assert encoded.count_width == 1 and len(encoded.payloads) == dp
    assert encoded.checksums == [checksum(p) for p in encoded.payloads]
    table = table_of(encoded)
    assert len(table) == len({(s, f) for *_, fetch in blocks for s, f, _e in fetch.files})
    for k, (counts, ids, fetch) in enumerate(blocks):
        got_counts, got_ids, got = decode_rank_block(encoded.payloads[k], 2, MICRO, table)
        assert got_counts.tolist() == counts.tolist()
        assert got_ids.tolist() == ids.tolist()
        for name in FETCH_COLUMNS:
            assert getattr(got, name).tolist() == getattr(fetch, name).tolist(), name
        assert got.files == fetch.files


def test_a_parquet_file_costs_no_row_column():
    """Rows that are the global id minus the file's start (Parquet, Arrow, Megatron) pack to
    an all-zero `back` column: the row is not stored apart from the id."""
    ids = np.array([105, 103, 250, 251], dtype=np.uint64)
    files = [(0, 0, {"path": "a.parquet"}), (0, 1, {"path": "b.parquet"})]
    file = np.array([0, 0, 1, 1])
    row = np.array([5, 3, 0, 1])
    fetch = Fetch(file, row, np.array([7, 8, 9, 10]), np.zeros(4, int), np.zeros(4, int), files)
    encoded = encode_chunk([(np.array([[2, 2]]), ids, fetch)], 1, 2, 2)
    table = table_of(encoded)
    assert table.start.tolist() == [100, 250]
    _counts, _files, _file, rel, back, *_ = unpack(encoded.payloads[0], 8, 1 << 20)
    assert rel.tolist() == row.tolist() and back.tolist() == [0, 0, 0, 0]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), dp=st.integers(1, 6), top=st.sampled_from([1, 300, 2**40]))
def test_encode_chunk_v2_gives_each_block_as_encoded_alone(seed, dp, top):
    """The version-2 chunk encoder: per rank, exactly the counts, ids and fetch part encoded
    on their own (column widths per rank, empty ranks, shared file records)."""
    rng = np.random.default_rng(seed)
    blocks = _random_blocks(rng, dp, top)
    width = max(1, int(rng.integers(1, 9)))
    ids_top = max((int(b[1].max(initial=0)) for b in blocks), default=0)
    width = max(width, (ids_top.bit_length() + 7) // 8)
    for given_as in (blocks, ChunkBlocks.of(blocks)):
        encoded = encode_chunk_v2(given_as, 2, MICRO, width)
        assert encoded.count_width == 1
        for k, (counts, ids, fetch) in enumerate(blocks):
            alone = (
                counts.astype("u1").tobytes()
                + encode_ids(ids, width)
                + encode_fetch(fetch, len(ids))
            )
            assert encoded.payloads[k] == alone
            assert encoded.checksums[k] == checksum(alone)
    chunk = ChunkBlocks.of(blocks)
    for k, (counts, ids, fetch) in enumerate(blocks):
        c, i, f = chunk[k]
        assert np.array_equal(c, counts) and np.array_equal(i, ids) and f.files == fetch.files


@st.composite
def chunks(draw):
    """A chunk's blocks as a planner could make them, or stranger: 1 to 4 ranks, micro-batches
    empty or not, up to 300 files shared between ranks, Parquet-like rows (global id = the
    file's start + row) or JSONL-like ones (line numbers with gaps, byte offsets up to 2^40),
    or a single sample."""
    dp = draw(st.integers(1, 4))
    steps, micro = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    nfiles = draw(st.sampled_from([1, 2, 7, 300]))
    seed = draw(st.integers(0, 2**32 - 1))
    jsonl = draw(st.booleans())
    single = draw(st.booleans())
    rng = np.random.default_rng(seed)
    files = [(int(f % 5), int(f), {"path": f"d/{f}.x", "size": f * 3}) for f in range(nfiles)]
    starts = np.cumsum(rng.integers(1, 2**20, nfiles)) + (2**40 if jsonl else 0)
    blocks = []
    for k in range(dp):
        counts = rng.integers(0, 4, (steps, micro)) * rng.integers(0, 2, (steps, micro))
        if single:
            counts = np.zeros((steps, micro), np.int64)
            counts[0, 0] = k == 0
        n = int(counts.sum())
        used = np.unique(rng.integers(0, nfiles, max(n, 1)))[: max(n, 1)] if n else []
        local = rng.integers(0, len(used), n) if n else np.zeros(0, np.int64)
        rel = rng.integers(0, 2**19, n)
        back = rng.integers(0, 50, n) * rng.integers(0, 2, n) if jsonl else np.zeros(n, np.int64)
        row = rel + back  # the line number: past the rows, never before
        ids = (starts[np.asarray(used, np.int64)[local]] + rel).astype(np.uint64) if n else []
        offset = rng.integers(0, 2**40, n) if jsonl else np.zeros(n, np.int64)
        length = rng.integers(1, 2**16, n) if jsonl else np.zeros(n, np.int64)
        fetch = Fetch(
            local, row, rng.integers(1, 2**17, n), offset, length,
            [files[f] for f in np.asarray(used, np.int64).tolist()],
        )  # fmt: skip
        blocks.append((counts, np.asarray(ids, np.uint64), fetch))
    return steps, micro, blocks


@settings(max_examples=60, deadline=None)
@given(chunk=chunks(), version=st.sampled_from([3, 4]))
def test_blocks_round_trip_through_the_chunk_encoding(chunk, version):
    """Version 4 (the counts in the block's frame, the table's content compressed by the
    writer) and version 3 (the counts raw before the frame, the table a payload)."""
    steps, micro, blocks = chunk
    encoded = encode_chunk(blocks, steps, micro, 8, version)
    table = table_of(encoded) if version == 4 else decode_table(encoded.payloads[-1], 3)
    head = steps * micro * encoded.count_width
    for k, (counts, ids, fetch) in enumerate(blocks):
        if version == 4:
            got_counts, got_ids, got = decode_rank_block(encoded.payloads[k], steps, micro, table)
            assert got_counts.tolist() == counts.tolist()
        else:
            raw_counts = counts.astype(f"<u{encoded.count_width}").tobytes()
            assert encoded.payloads[k][:head] == raw_counts
            got_ids, got = decode_block(memoryview(encoded.payloads[k])[head:], len(ids), table)
        assert got_ids.tolist() == ids.tolist()
        for name in FETCH_COLUMNS:
            assert getattr(got, name).tolist() == np.asarray(getattr(fetch, name)).tolist()
        assert got.files == fetch.files


@settings(max_examples=40, deadline=None)
@given(chunk=chunks(), data=st.data())
def test_a_changed_or_cut_block_or_table_never_reads_as_another(tmp_path_factory, chunk, data):
    """Any byte of a block, file table or section changed, or the file cut anywhere: the
    reader raises PlanError (the checksums), never returns other samples."""
    steps, micro, blocks = chunk
    path = tmp_path_factory.mktemp("cut") / "plan.mds"
    write_plan(path, [(0, steps, blocks)], id_width=8, sections={"s": np.arange(6)})
    raw = path.read_bytes()
    if data.draw(st.booleans()):
        at = data.draw(st.integers(16, len(raw) - 33))  # between header and trailer
        bad = bytearray(raw)
        bad[at] ^= data.draw(st.integers(1, 255))
        bad = bytes(bad)
    else:
        bad = raw[: data.draw(st.integers(0, len(raw) - 1))]
    path.write_bytes(bad)
    with pytest.raises(PlanError):
        with PlanReader(path) as r:
            for k in range(r.dp):
                r.rank_chunk(0, k)
            r.section("s")
            # A changed byte no read covers (none should exist) would end up here.
            raise AssertionError("the change was not detected")
