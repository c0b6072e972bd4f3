"""Packed integer columns (core/packed.py): exact round trips at every width, the same bytes
for the same columns, and malformed or oversized frames refused."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from mds.core import packed
from mds.core.packed import frame_limit, pack, pack_raw, unpack, unpack_raw, unzigzag, zigzag

COLUMN = st.lists(
    st.one_of(st.integers(0, 255), st.integers(0, 2**40), st.integers(0, 2**64 - 1)), max_size=40
)


@settings(max_examples=60, deadline=None)
@given(columns=st.lists(COLUMN, min_size=1, max_size=7))
def test_unpack_inverts_pack(columns):
    arrays = [np.array(c, dtype=np.uint64) for c in columns]
    data = pack(arrays)
    assert data == pack(arrays)  # same columns, same bytes
    out = unpack(data, len(arrays), 1 << 20)
    assert [o.tolist() for o in out] == columns
    assert all(o.dtype == np.dtype("<u8") for o in out)


@settings(max_examples=60, deadline=None)
@given(
    columns=st.lists(
        st.lists(st.one_of(st.integers(0, 2**16), st.integers(0, 2**64 - 1)), max_size=300),
        min_size=1,
        max_size=9,
    )
)
def test_small_frames_scattered_decode_as_plane_by_plane(columns):
    """A small frame's one-scatter decode gives what the plane-by-plane decode gives."""
    content = b"".join(pack_raw([np.array(c, dtype=np.uint64) for c in columns]))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(packed, "SMALL_PLANE", 0)
        planes = unpack_raw(content, len(columns), 1 << 20)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(packed, "SMALL_PLANE", 1 << 30)
        scattered = unpack_raw(memoryview(content), len(columns), 1 << 20)
    assert [c.tolist() for c in planes] == [c.tolist() for c in scattered] == columns
    assert all(c.dtype == np.dtype("<u8") for c in scattered)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40))
def test_zigzag_round_trip_and_small_magnitudes_stay_small(values):
    x = np.array(values, dtype=np.int64)
    assert unzigzag(zigzag(x)).tolist() == values
    assert zigzag(np.array([0, -1, 1, -2, 2])).tolist() == [0, 1, 2, 3, 4]


def test_malformed_frames_are_refused():
    data = pack([np.arange(100, dtype=np.uint64), np.zeros(3, np.uint64)])
    with pytest.raises(ValueError, match="wrong number of columns"):
        unpack(data, 3, 1 << 20)
    with pytest.raises(ValueError):
        unpack(data[:-3], 2, 1 << 20)
    with pytest.raises(ValueError, match="too large"):
        unpack(data, 2, 100)  # declares more than the caller allows: nothing allocated
    with pytest.raises(ValueError, match="not a zstd frame"):
        unpack(b"not zstd at all", 2, 1 << 20)
    # A frame without its content size (another writer) is refused, not decoded blind.
    blind = zstandard.ZstdCompressor(write_content_size=False).compress(b"\x01\x00" + bytes(9))
    with pytest.raises(ValueError, match="unknown or too large"):
        unpack(blind, 1, 1 << 20)
    assert frame_limit(10) == 8 << 20 and frame_limit(1 << 20) == 2048 << 20
