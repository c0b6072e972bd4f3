"""The plan file's codec: id encoding and a chunk's blocks encoded at once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planfile_builders import MICRO, fetch_of

from mds.core.planfile import (
    ChunkBlocks,
    checksum,
    decode_ids,
    encode_chunk,
    encode_fetch,
    encode_ids,
)


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


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), dp=st.integers(1, 6), top=st.sampled_from([1, 300, 2**40]))
def test_encode_chunk_gives_each_block_as_encoded_alone(seed, dp, top):
    """The chunk-wide encoder: per rank, exactly the counts, ids and fetch part encoded on
    their own (column widths per rank, empty ranks, shared file records)."""
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(dp):
        counts = rng.integers(0, 3, (2, MICRO)) * int(rng.integers(0, 2))  # some ranks empty
        ids = rng.integers(0, top, int(counts.sum()), dtype=np.uint64)
        blocks.append((counts, ids, fetch_of(ids)))
    width = max(1, int(rng.integers(1, 9)))
    ids_top = max((int(b[1].max(initial=0)) for b in blocks), default=0)
    width = max(width, (ids_top.bit_length() + 7) // 8)
    for given_as in (blocks, ChunkBlocks.of(blocks)):
        encoded = encode_chunk(given_as, 2, MICRO, width)
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
