"""The plan file: chunked per-step sample ids, readable one (chunk, DP rank) at a time.

Layout (all integers little-endian; docs/plan-format.md is the spec):

    header   b"MDSPLAN\\0" | u32 format version | u32 flags (0)
    chunks   per chunk: a directory of D entries (u64 offset, u64 size, 8-byte BLAKE2b),
             then one block per DP rank: micro-batch sample counts [steps, M] (u8, u16
             or u32, the chunk's `count_width`), the samples' global ids (`id_width`
             bytes each), and what fetching them takes: per sample a file, row, planned
             token count and byte range, and the block's file records (JSON)
    sections binary arrays named in the footer (per-step stats, per-chunk source cursors)
    footer   UTF-8 JSON: config, sources, geometry, chunk list with directory checksums,
             section offsets and checksums
    trailer  u64 footer offset | u64 footer size | 8-byte BLAKE2b of the footer | magic

Every byte a reader uses is covered by a checksum chained from the footer, so a corrupt
plan raises PlanError instead of returning wrong samples. No pickle: JSON and raw arrays.
A rank's block is self-contained: replaying it needs no index table and no manifest.

This module holds the layout's constants and the codec of a chunk's blocks; the writer is
core/planfile_writer.py, the reader core/planfile_reader.py.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "COUNT_DTYPES",
    "DIR_ENTRY",
    "FETCH_COLUMNS",
    "FORMAT_VERSION",
    "HEAD",
    "MAGIC",
    "TRAILER",
    "ChunkBlocks",
    "EncodedChunk",
    "Fetch",
    "RankChunk",
    "checksum",
    "decode_fetch",
    "decode_ids",
    "encode_chunk",
    "encode_fetch",
    "encode_ids",
    "plan_id_of",
    "width_of",
]

MAGIC = b"MDSPLAN\x00"
FORMAT_VERSION = 2
HEAD = struct.Struct("<8sII")
# A block's fetch part: the byte width of each per-sample column (0: all zero, not stored),
# then the size of the block's file-record JSON.
FETCH_COLUMNS = ("file", "row", "tokens", "offset", "length")
_FETCH_HEAD = struct.Struct("<5BxxxQ")
TRAILER = struct.Struct("<QQ8s8s")
DIR_ENTRY = np.dtype([("offset", "<u8"), ("size", "<u8"), ("checksum", "S8")])
COUNT_DTYPES = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}


def checksum(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=8).digest()


def plan_id_of(footer: bytes) -> str:
    """A plan's identity: BLAKE2b-128 of its footer, which covers every checksum."""
    return hashlib.blake2b(footer, digest_size=16).hexdigest()


@dataclass(frozen=True)
class Fetch:
    """Where a block's samples live: per sample, an index into `files`, the row inside that
    file (JSONL: line number), the index's token count, and for JSONL the line's byte offset
    and length (0 otherwise). `files` holds (source index, file index in the source's
    manifest list, the manifest's file entry: path, size, mtime_ns, fingerprint, ...)."""

    file: np.ndarray
    row: np.ndarray
    tokens: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    files: list[tuple[int, int, dict[str, Any]]]

    def columns(self) -> list[np.ndarray]:
        return [getattr(self, name) for name in FETCH_COLUMNS]


@dataclass(frozen=True)
class RankChunk:
    """One DP rank's samples for the steps of one chunk."""

    step_start: int
    counts: np.ndarray  # [steps, micro_batches] samples per micro-batch
    ids: np.ndarray  # uint64 global sample ids, in (step, micro-batch, sample) order
    fetch: Fetch


def width_of(values: np.ndarray) -> int:
    """Bytes needed for the largest of non-negative `values` (0 when all are zero)."""
    peak = int(values.max(initial=0)) if len(values) else 0
    return (peak.bit_length() + 7) // 8


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


@dataclass(frozen=True)
class ChunkBlocks:
    """One chunk's rank blocks held as chunk-wide arrays, rank after rank: what a planner
    makes, and what encode_chunk encodes with a fixed number of numpy passes whatever
    the number of ranks. Indexing gives rank k's (counts, ids, Fetch), as a list of
    blocks would."""

    counts: np.ndarray  # [D, steps, micro_batches]
    ids: np.ndarray  # every rank's ids, rank after rank
    bounds: np.ndarray  # [D + 1]: rank k's samples are [bounds[k], bounds[k + 1])
    columns: list[np.ndarray]  # the FETCH_COLUMNS, each aligned with ids
    files: list[list[tuple[int, int, dict[str, Any]]]]  # per rank, its Fetch.files

    @classmethod
    def of(cls, blocks: list[tuple[np.ndarray, np.ndarray, Fetch]]) -> ChunkBlocks:
        sizes = [len(ids) for _, ids, _ in blocks]
        bounds = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        columns = [
            np.concatenate([np.asarray(getattr(f, name)) for _, _, f in blocks] or [[]])
            for name in FETCH_COLUMNS
        ]
        return cls(
            np.stack([c for c, _, _ in blocks]) if blocks else np.zeros((0, 0, 0), np.int64),
            np.concatenate([ids for _, ids, _ in blocks] or [[]]),
            bounds,
            columns,
            [f.files for _, _, f in blocks],
        )

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, k: int) -> tuple[np.ndarray, np.ndarray, Fetch]:
        lo, hi = int(self.bounds[k]), int(self.bounds[k + 1])
        return (
            self.counts[k],
            self.ids[lo:hi],
            Fetch(*(c[lo:hi] for c in self.columns), files=self.files[k]),
        )


@dataclass(frozen=True)
class EncodedChunk:
    """One chunk's rank blocks as the file stores them, with their checksums: made where
    the chunk is planned (a worker process), so the writer only copies bytes."""

    count_width: int  # bytes per micro-batch sample count
    payloads: list[bytes]  # per rank
    checksums: list[bytes]  # per rank, checksum() of its payload


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


def encode_chunk(
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
