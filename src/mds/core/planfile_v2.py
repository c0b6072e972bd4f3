"""The block codec of version-2 plans (docs/plan-format.md, "Version 2"): per block the
counts, ids at `id_width` bytes, then each fetch column at the fewest whole bytes that hold
it and the block's own file records as JSON. Kept to read version-2 plans, and to write
them where a test or benchmark compares the versions."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from mds.core.planfile import (
    COUNT_DTYPES,
    ChunkBlocks,
    EncodedChunk,
    Fetch,
    checksum,
    width_of,
)

__all__ = ["decode_fetch", "decode_ids", "encode_chunk_v2", "encode_fetch", "encode_ids"]

# A block's fetch part: the byte width of each per-sample column (0: all zero, not stored),
# then the size of the block's file-record JSON.
_FETCH_HEAD = struct.Struct("<5BxxxQ")


def encode_ids(ids: np.ndarray, width: int) -> bytes:
    raw = np.ascontiguousarray(ids, dtype="<u8").view(np.uint8).reshape(-1, 8)
    return raw[:, :width].tobytes()


def decode_ids(data: bytes | memoryview, width: int, n: int | None = None) -> np.ndarray:
    """Unsigned integers of `width` bytes (0: `n` zeros)."""
    if width == 0:
        return np.zeros(n or 0, dtype="<u8")
    raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, width)
    out = np.zeros((raw.shape[0], 8), dtype=np.uint8)
    out[:, :width] = raw
    return out.view("<u8").ravel()


def encode_fetch(fetch: Fetch, n: int) -> bytes:
    """The fetch part of a block: widths, the columns at those widths, the file records."""
    columns = fetch.columns()
    assert all(len(c) == n for c in columns), "one fetch record per sample"
    assert all(int(c.min(initial=0)) >= 0 for c in columns if len(c))
    widths = [width_of(c) for c in columns]
    files = json.dumps(
        [[int(s), int(f), entry] for s, f, entry in fetch.files],
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    parts = [_FETCH_HEAD.pack(*widths, len(files))]
    parts += [encode_ids(c, w) for c, w in zip(columns, widths, strict=True)]
    return b"".join(parts) + files


def _file_record(item: Any) -> tuple[int, int, dict[str, Any]]:
    s, f, entry = item
    if not (isinstance(s, int) and isinstance(f, int) and isinstance(entry, dict)):
        raise ValueError("file record is not [source, file, entry]")
    return s, f, entry


def decode_fetch(data: memoryview, n: int) -> Fetch:
    """Inverse of encode_fetch; ValueError for anything malformed."""
    if len(data) < _FETCH_HEAD.size:
        raise ValueError("no fetch records")
    *widths, files_size = _FETCH_HEAD.unpack(data[: _FETCH_HEAD.size])
    if any(w > 8 for w in widths):
        raise ValueError("bad column width")
    pos, columns = _FETCH_HEAD.size, []
    for w in widths:
        columns.append(decode_ids(data[pos : pos + n * w], w, n))
        pos += n * w
    if pos + files_size != len(data):
        raise ValueError("fetch records do not fill the block")
    files = [_file_record(item) for item in json.loads(bytes(data[pos:]))]
    if n and int(columns[0].max()) >= len(files):
        raise ValueError("a sample names a file the block does not list")
    return Fetch(*columns, files=files)



def _widths(column: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """width_of() of every block's part of `column` (non-negative), [blocks]."""
    blocks = len(bounds) - 1
    peak = np.zeros(blocks, dtype=np.uint64)
    filled = np.flatnonzero(bounds[1:] > bounds[:-1])
    if filled.size:
        # Empty blocks are left out, so each reduced segment is exactly one block's part.
        peak[filled] = np.maximum.reduceat(column.astype(np.uint64), bounds[filled])
    out = np.zeros(blocks, dtype=np.int64)
    for k in range(8):
        out += peak >= np.uint64(1) << np.uint64(8 * k)
    return out


def encode_chunk_v2(
    blocks: list[tuple[np.ndarray, np.ndarray, Fetch]] | ChunkBlocks,
    steps: int,
    micro: int,
    id_width: int,
) -> EncodedChunk:
    """The blocks of a chunk of `steps` steps: per rank (counts [steps, micro], global ids,
    fetch records), encoded with `id_width`-byte ids. Each column is encoded once for the
    whole chunk at each width some block needs; a block's bytes are slices of those."""
    if not isinstance(blocks, ChunkBlocks):
        blocks = ChunkBlocks.of(blocks)
    dp, bounds = len(blocks), blocks.bounds
    assert blocks.counts.shape == (dp, steps, micro)
    sizes = np.diff(bounds)
    assert np.array_equal(blocks.counts.reshape(dp, -1).sum(axis=1), sizes)
    peak = int(blocks.counts.max(initial=0))
    width = 1 if peak < 1 << 8 else 2 if peak < 1 << 16 else 4
    counts = blocks.counts.astype(COUNT_DTYPES[width]).reshape(dp, -1)
    ids = memoryview(encode_ids(blocks.ids, id_width))
    widths, encoded = [], []
    for c in blocks.columns:
        assert len(c) == len(blocks.ids), "one fetch record per sample"
        assert int(c.min(initial=0)) >= 0
        w = _widths(c, bounds)
        widths.append(w.tolist())
        encoded.append({int(x): memoryview(encode_ids(c, int(x))) for x in np.unique(w) if x})
    fragments: dict[tuple[int, int, int], str] = {}
    payloads = []
    for k in range(dp):
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        items = []
        for s, f, entry in blocks.files[k]:
            key = (s, f, id(entry))
            if key not in fragments:
                fragments[key] = json.dumps(
                    [int(s), int(f), entry], sort_keys=True, separators=(",", ":")
                )
            items.append(fragments[key])
        files = ("[" + ",".join(items) + "]").encode()
        ws = [w[k] for w in widths]
        parts = [counts[k].tobytes(), ids[lo * id_width : hi * id_width]]
        parts.append(_FETCH_HEAD.pack(*ws, len(files)))
        parts += [enc[w][lo * w : hi * w] for enc, w in zip(encoded, ws, strict=True) if w]
        parts.append(files)
        payloads.append(b"".join(parts))
    return EncodedChunk(width, payloads, [checksum(data) for data in payloads])
