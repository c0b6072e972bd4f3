"""The plan file: chunked per-step sample ids, readable one (chunk, DP rank) at a time.

Layout (all integers little-endian; docs/plan-format.md is the spec):

    header   b"MDSPLAN\\0" | u32 format version | u32 flags (0)
    chunks   per chunk: a directory of D + 1 entries (u64 offset, u64 size, 8-byte BLAKE2b),
             one block per DP rank, then the chunk's file table. A block is one zstd frame
             of packed columns (core/packed.py): the micro-batch sample counts [steps, M],
             then per sample its file, its row and global id (both from the file's entry in
             the table), its token count and byte range. The file table holds, once per
             chunk, each file a block reads: source, file, first global id, manifest entry,
             in one zstd frame; every table after the first chunk's is compressed with the
             first as a dictionary (chunks mostly read the same files)
    sections arrays named in the footer (per-step stats, sparse per-step source counts,
             per-chunk source cursors), each a packed zstd frame
    footer   a zstd frame of UTF-8 JSON: config, sources, geometry, chunk list with directory
             checksums, section offsets and checksums
    trailer  u64 footer offset | u64 footer size | 8-byte BLAKE2b of the footer | magic

Every byte a reader uses is covered by a checksum chained from the footer, so a corrupt
plan raises PlanError instead of returning wrong samples. No pickle: JSON and raw arrays.
A rank's block and its chunk's file table (with the first chunk's) are all replaying it
needs: no index table and no manifest. Version-3 plans (counts raw before a block's frame,
file tables compressed alone, the footer plain JSON) are read by the same code; version-2
plans (blocks of fixed-width columns and their own file records, no file table, raw
sections) through core/planfile_v2.py.

This module holds the layout's constants and the codec of a chunk's blocks; the writer is
core/planfile_writer.py, the reader core/planfile_reader.py.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import numpy as np

from mds.core.packed import (
    compress,
    decompress,
    frame_limit,
    pack,
    pack_raw,
    raw_dictionary,
    unpack,
    unpack_raw,
)

__all__ = [
    "COUNT_DTYPES",
    "DICTIONARY_MAX",
    "DIR_ENTRY",
    "FETCH_COLUMNS",
    "FORMAT_VERSION",
    "READ_VERSIONS",
    "HEAD",
    "MAGIC",
    "TRAILER",
    "ChunkBlocks",
    "EncodedChunk",
    "Fetch",
    "FileTable",
    "RankChunk",
    "checksum",
    "decode_block",
    "decode_rank_block",
    "decode_table",
    "encode_chunk",
    "encode_table",
    "table_dictionary",
    "plan_id_of",
    "width_of",
]

MAGIC = b"MDSPLAN\x00"
FORMAT_VERSION = 4
READ_VERSIONS = (2, 3, 4)  # versions this reader decodes
DICTIONARY_MAX = 1 << 20  # bytes of the first file table later tables are compressed against
HEAD = struct.Struct("<8sII")
FETCH_COLUMNS = ("file", "row", "tokens", "offset", "length")
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
    """One chunk's rank blocks and file table as the file stores them, with their checksums:
    made where the chunk is planned (a worker process), so the writer only copies bytes."""

    count_width: int  # bytes per micro-batch sample count
    payloads: list[bytes]  # per rank, then (version 3) the chunk's file table
    checksums: list[bytes]  # checksum() of each payload
    # Version 4: the file table's content, which the writer compresses (against the
    # plan's first table, for every chunk after the first: encode_table).
    table: bytes | None = None


class FileTable:
    """A chunk's files, each once, in (source, file, entry) order: the records blocks name
    by position, and per file `start`, the global id of its row 0: a sample's global id is
    its file's start plus `rel`, its row is `rel - back` (`back` 0 but for a JSONL file with
    lines that are not samples). A version-4 table parses an entry's JSON when a block
    first names it."""

    def __init__(
        self,
        source: list[int],
        file: list[int],
        start: np.ndarray,
        entries: list[Any],
        text: bytes = b"",
        ends: list[int] | None = None,
    ):
        self.source, self.file, self.start = source, file, start
        self._entries, self._text, self._ends = entries, text, ends
        self._ascii: str | None = None  # the entries' text when it is ASCII, else ""

    def __len__(self) -> int:
        return len(self.source)

    @property
    def records(self) -> list[tuple[int, int, dict[str, Any]]]:
        return [self.record(p) for p in range(len(self))]

    def record(self, p: int) -> tuple[int, int, dict[str, Any]]:
        return self.records_at([p])[0]

    def records_at(self, positions: list[int]) -> list[tuple[int, int, dict[str, Any]]]:
        """The records at `positions`, their entries parsed on first use."""
        entries = self._entries
        missing = [p for p in positions if entries[p] is None]
        if missing:
            self._parse(missing)
        source, file = self.source, self.file
        return [(source[p], file[p], entries[p]) for p in positions]

    def _parse(self, positions: list[int]) -> None:
        """Parse the entries at `positions`: scanned in place when the entries are ASCII
        (byte offsets are then character offsets), else each parsed alone."""
        assert self._ends is not None
        entries, ends = self._entries, self._ends
        if self._ascii is None:
            self._ascii = self._text.decode() if self._text.isascii() else ""
        text = self._ascii
        for p in positions:
            lo, hi = ends[p - 1] if p else 0, ends[p]
            if text:
                try:
                    entry, end = _SCAN(text, lo)
                except StopIteration:
                    raise ValueError("file table: an entry is not JSON") from None
                if end != hi:
                    raise ValueError("file table: an entry's length does not match it")
            else:
                entry = json.loads(self._text[lo:hi])
            if type(entry) is not dict:
                raise ValueError("file table: an entry is not an object")
            entries[p] = entry


_SCAN = json.JSONDecoder().scan_once  # one JSON value at an offset: (value, end)
_TABLE_HEAD = struct.Struct("<Q")  # size of the packed columns; the entries' JSON follows
_BLOCK_COLUMNS = 7  # files, file, rel, back, tokens, offset, length


def _encode_table(records: list[tuple[int, int, str]], start: np.ndarray, version: int) -> bytes:
    """Version 3: the packed columns' frame and the entries' JSON frame. Version 4: the
    content of one frame (encode_table compresses it): the columns, with each entry's
    length, not compressed, then the entries' JSON run together."""
    columns = [
        np.array([s for s, _f, _e in records], dtype=np.uint64),
        np.array([f for _s, f, _e in records], dtype=np.uint64),
        start.view(np.uint64),  # two's complement: 8 bytes only if one is negative
    ]
    if version >= 4:
        texts = [e.encode() for *_, e in records]
        raw = b"".join(pack_raw([*columns, np.array([len(t) for t in texts], np.uint64)]))
        return _TABLE_HEAD.pack(len(raw)) + raw + b"".join(texts)
    packed = pack(columns)
    entries = compress(("[" + ",".join(e for *_, e in records) + "]").encode())
    return _TABLE_HEAD.pack(len(packed)) + packed + entries


def decode_table(
    data: bytes | memoryview, version: int = FORMAT_VERSION, dictionary: Any = None
) -> FileTable:
    """Inverse of the file table's encoding (version 4: its frame, compressed against
    `dictionary` for a chunk after the first); ValueError for anything malformed."""
    data = memoryview(data)
    limit = frame_limit(len(data))
    if version >= 4:
        if dictionary is not None:
            limit += 2 * len(dictionary.as_bytes())
        return _table_content(decompress(data, limit, dictionary), limit)
    end = _table_end(data)
    source, file, start = unpack(data[_TABLE_HEAD.size : end], 3, limit)
    entries = json.loads(decompress(data[end:], limit))
    if not (
        isinstance(entries, list)
        and len(entries) == len(source) == len(file) == len(start)
        and all(type(e) is dict for e in entries)
    ):
        raise ValueError("file table: records do not match")
    return FileTable(source.tolist(), file.tolist(), start.view(np.int64), entries)


def _table_end(data: bytes | memoryview) -> int:
    """Where a file table's packed columns end (its head gives their size), checked."""
    if len(data) < _TABLE_HEAD.size:
        raise ValueError("no file table")
    (size,) = _TABLE_HEAD.unpack_from(data)
    end = _TABLE_HEAD.size + size
    if end > len(data):
        raise ValueError("file table: truncated")
    return end


def _table_content(content: bytes, limit: int) -> FileTable:
    """A version-4 file table from its content: the packed columns' size, the columns, the
    entries' JSON run together (each entry's length is the fourth column)."""
    end = _table_end(content)
    source, file, start, length = unpack_raw(
        memoryview(content)[_TABLE_HEAD.size : end], 4, limit
    )
    ends = list(accumulate(length.tolist()))
    if not (len(source) == len(file) == len(start) == len(length)) or (
        (ends[-1] if ends else 0) != len(content) - end
    ):
        raise ValueError("file table: records do not match")
    return FileTable(
        source.tolist(),
        file.tolist(),
        start.view(np.int64),
        [None] * len(source),
        content[end:],
        ends,
    )


def table_dictionary(content: bytes) -> Any:
    """What the tables of a plan's later chunks are compressed against: the first chunk's
    table content, up to DICTIONARY_MAX bytes (they mostly name the same files)."""
    return raw_dictionary(content[:DICTIONARY_MAX])


def encode_table(content: bytes, dictionary: Any = None) -> bytes:
    """A version-4 file table as stored: its content in one zstd frame."""
    return compress(content, dictionary)


def _mod_deltas(values: np.ndarray, modulus: int) -> np.ndarray:
    """Each value minus the one before it (the first: minus 0), modulo `modulus`: small
    for ascending values, invertible by a cumulative sum modulo `modulus`."""
    values = values.astype(np.int64, copy=False)
    if not len(values):
        return values
    return np.diff(values, prepend=0) % max(modulus, 1)


def _undo_deltas(deltas: np.ndarray, modulus: int, what: str) -> np.ndarray:
    if not len(deltas):
        return np.zeros(0, dtype=np.int64)
    if int(deltas.max()) >= max(modulus, 1):  # one value (or none): every delta is 0
        raise ValueError(f"{what} out of range")
    out = np.cumsum(deltas.view(np.int64))
    if modulus & (modulus - 1):
        out %= modulus
    else:  # a power of two
        out &= modulus - 1
    return out


def decode_block(data: bytes | memoryview, n: int, table: FileTable) -> tuple[np.ndarray, Fetch]:
    """A version-3 block's packed part (after its counts) for `n` samples: their global ids
    (uint64) and fetch records. ValueError for anything malformed."""
    limit = 64 + 8 * (6 * n + len(table))
    return _block(unpack(data, _BLOCK_COLUMNS, limit), n, table)


def decode_rank_block(
    data: bytes | memoryview, steps: int, micro: int, table: FileTable
) -> tuple[np.ndarray, np.ndarray, Fetch]:
    """A version-4 block (one packed frame, the counts its first column): the counts
    [steps, micro] (int64), the global ids (uint64) and the fetch records. ValueError for
    anything malformed."""
    counts, *columns = unpack(data, 1 + _BLOCK_COLUMNS, frame_limit(len(data)))
    if len(counts) != steps * micro:
        raise ValueError("counts do not match the chunk's steps")
    counts = counts.view(np.int64).reshape(steps, micro)
    if int(counts.min(initial=0)) < 0:
        raise ValueError("negative count")
    ids, fetch = _block(columns, int(counts.sum()), table)
    return counts, ids, fetch


def _block(columns: list[np.ndarray], n: int, table: FileTable) -> tuple[np.ndarray, Fetch]:
    files, file, rel, back, tokens, offset, length = columns
    if any(len(c) != n for c in (file, rel, back, tokens, offset, length)):
        raise ValueError("columns do not match the counts")
    if n and not len(files):
        raise ValueError("samples but no files")
    where = _undo_deltas(files, len(table), "file table position")
    local = _undo_deltas(file, len(files), "file")
    if n and back.any():
        if bool((back > rel).any()):
            raise ValueError("negative row")
        row = rel - back
    else:
        row = rel
    start = table.start[where]
    ids = (start[local] if len(start) > 1 else start.repeat(n)).view(np.uint64) + rel
    fetch = Fetch(
        local, row, tokens, offset, length, files=table.records_at(where.tolist())
    )
    return ids, fetch


def encode_chunk(
    blocks: list[tuple[np.ndarray, np.ndarray, Fetch]] | ChunkBlocks,
    steps: int,
    micro: int,
    id_width: int,
    version: int = FORMAT_VERSION,
) -> EncodedChunk:
    """The blocks of a chunk of `steps` steps: per rank (counts [steps, micro], global ids,
    fetch records), and the chunk's file table (version 4: its content, for the writer to
    compress). `id_width` is the plan's (checked here; a block packs ids by their file's
    start instead)."""
    if not isinstance(blocks, ChunkBlocks):
        blocks = ChunkBlocks.of(blocks)
    dp, bounds = len(blocks), blocks.bounds
    assert blocks.counts.shape == (dp, steps, micro)
    sizes = np.diff(bounds)
    assert np.array_equal(blocks.counts.reshape(dp, -1).sum(axis=1), sizes)
    assert width_of(blocks.ids) <= id_width
    peak = int(blocks.counts.max(initial=0))
    width = 1 if peak < 1 << 8 else 2 if peak < 1 << 16 else 4
    counts = blocks.counts.astype(COUNT_DTYPES[width]).reshape(dp, -1)
    file, row, tokens, offset, length = blocks.columns
    for c in blocks.columns:
        assert len(c) == len(blocks.ids), "one fetch record per sample"
        assert int(c.min(initial=0)) >= 0
    # The chunk's file table: every (source, file, entry) a block names, once, sorted.
    fragments: dict[tuple[int, int, int], tuple[int, int, str]] = {}
    named = []
    for k in range(dp):
        keys = []
        for s, f, entry in blocks.files[k]:
            key = (s, f, id(entry))
            if key not in fragments:
                text = json.dumps(entry, sort_keys=True, separators=(",", ":"))
                fragments[key] = (int(s), int(f), text)
            keys.append(fragments[key])
        named.append(keys)
    records = sorted(set(fragments.values()))
    position = {record: i for i, record in enumerate(records)}
    where = [np.array([position[r] for r in keys], dtype=np.int64) for keys in named]
    ids = np.ascontiguousarray(blocks.ids, dtype=np.uint64).view(np.int64)
    file = np.asarray(file, dtype=np.int64)
    at = np.zeros(len(ids), dtype=np.int64)  # each sample's file-table position
    for k in range(dp):
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        at[lo:hi] = where[k][file[lo:hi]]
    # A file's start: the least (global id - row) of its samples in the chunk, the same for
    # every sample of a file but a JSONL file with lines that are not samples. Then
    # rel = id - start >= row, and back = rel - row >= 0 (0 but there).
    rows = np.asarray(row, dtype=np.int64)
    start = np.full(len(records), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(start, at, ids - rows)
    start[start == np.iinfo(np.int64).max] = 0
    rel = ids - start[at]
    back = rel - rows
    payloads = []
    for k in range(dp):
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        packed = pack(
            ([counts[k]] if version >= 4 else [])
            + [
                _mod_deltas(where[k], len(records)),
                _mod_deltas(file[lo:hi], len(where[k])),
                rel[lo:hi],
                back[lo:hi],
                tokens[lo:hi],
                offset[lo:hi],
                length[lo:hi],
            ]
        )
        # Version 3: the counts raw before the frame; version 4: its first column.
        payloads.append(packed if version >= 4 else counts[k].tobytes() + packed)
    table = _encode_table(records, start, version)
    if version >= 4:
        return EncodedChunk(width, payloads, [checksum(data) for data in payloads], table)
    payloads.append(table)
    return EncodedChunk(width, payloads, [checksum(data) for data in payloads])
