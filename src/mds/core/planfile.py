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
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mds.core import commit, storage
from mds.errors import PlanError, SourceDataError

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "PlanReader",
    "PlanWriter",
    "FETCH_COLUMNS",
    "ChunkBlocks",
    "EncodedChunk",
    "Fetch",
    "RankChunk",
    "checksum",
    "encode_chunk",
    "plan_id_of",
]

MAGIC = b"MDSPLAN\x00"
FORMAT_VERSION = 2
_HEAD = struct.Struct("<8sII")
# A block's fetch part: the byte width of each per-sample column (0: all zero, not stored),
# then the size of the block's file-record JSON.
FETCH_COLUMNS = ("file", "row", "tokens", "offset", "length")
_FETCH_HEAD = struct.Struct("<5BxxxQ")
_TRAILER = struct.Struct("<QQ8s8s")
_DIR_ENTRY = np.dtype([("offset", "<u8"), ("size", "<u8"), ("checksum", "S8")])
_MAX_FOOTER = 1 << 30
_COUNT_DTYPES = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}
_SECTION_DTYPE = re.compile(r"[<>|=]?[biuf][1248]")


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
    counts = blocks.counts.astype(_COUNT_DTYPES[width]).reshape(dp, -1)
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


class PlanWriter:
    """Writes a plan to a temporary file; `commit()` renames it into place."""

    def __init__(
        self,
        path: Path,
        tmp: Path,
        *,
        dp_size: int,
        micro_batches: int,
        id_width: int,
    ):
        self.path, self.tmp = Path(path), Path(tmp)
        self.dp, self.micro = dp_size, micro_batches
        self.id_width = id_width
        self._f: BinaryIO = open(self.tmp, "wb")  # noqa: SIM115 - closed in commit/abort
        try:
            self._f.write(_HEAD.pack(MAGIC, FORMAT_VERSION, 0))
        except BaseException:
            self.abort()
            raise
        self._chunks: list[list[Any]] = []
        self._sections: dict[str, dict[str, Any]] = {}

    def add_chunk(
        self,
        step_start: int,
        step_end: int,
        blocks: list[tuple[np.ndarray, np.ndarray, Fetch]] | ChunkBlocks | EncodedChunk,
    ) -> None:
        """Append one chunk: for each rank, (counts [steps, M], global ids, fetch records),
        or the chunk as encode_chunk made it with this plan's geometry."""
        if not isinstance(blocks, EncodedChunk):
            blocks = encode_chunk(blocks, step_end - step_start, self.micro, self.id_width)
        assert len(blocks.payloads) == self.dp
        dir_offset = self._f.tell()
        directory = np.zeros(self.dp, dtype=_DIR_ENTRY)
        sizes = np.array([len(data) for data in blocks.payloads], dtype=np.uint64)
        directory["offset"] = dir_offset + directory.nbytes + np.cumsum(sizes) - sizes
        directory["size"] = sizes
        directory["checksum"] = blocks.checksums
        dir_bytes = directory.tobytes()
        self._f.write(dir_bytes)
        for data in blocks.payloads:
            self._f.write(data)
        self._chunks.append(
            [step_start, step_end, dir_offset, checksum(dir_bytes).hex(), blocks.count_width]
        )

    def add_section(self, name: str, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        self._sections[name] = {
            "offset": self._f.tell(),
            "size": len(data),
            "dtype": array.dtype.newbyteorder("<").str,
            "shape": list(array.shape),
            "checksum": checksum(data).hex(),
        }
        self._f.write(data)

    def commit(self, footer: dict[str, Any]) -> bytes:
        """Write footer and trailer, fsync, rename into place; returns the footer bytes."""
        footer = dict(footer)
        footer["layout"] = {
            "dp_size": self.dp,
            "micro_batches": self.micro,
            "id_width": self.id_width,
            "chunks": self._chunks,
            "sections": self._sections,
        }
        data = json.dumps(footer, sort_keys=True, separators=(",", ":")).encode()
        offset = self._f.tell()
        self._f.write(data)
        self._f.write(_TRAILER.pack(offset, len(data), checksum(data), MAGIC))
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        commit.replace_local(self.tmp, self.path)
        return data

    def abort(self) -> None:
        """Remove the temporary file, even when closing it fails (a full disk fails the
        final flush again)."""
        try:
            if not self._f.closed:
                self._f.close()
        except OSError:
            pass
        finally:
            self.tmp.unlink(missing_ok=True)


class PlanReader:
    """Random access to a plan: the footer, then only the (chunk, rank) blocks asked for."""

    def __init__(self, path: str | os.PathLike):
        # A plan in object storage (s3://) is read with range requests: the footer, then
        # the blocks asked for, as from a file.
        self.path: Any = str(path) if storage.is_url(path) else Path(path)
        self._object: Any = None
        self._pid = os.getpid()
        try:
            if storage.is_url(path):
                self._object = self._open_object()
                self._f: BinaryIO | None = None
            else:
                self._f = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            raise PlanError(f"{self.path}: cannot open plan ({exc.strerror or exc})") from None
        except SourceDataError as exc:
            raise PlanError(f"cannot open plan: {exc}") from None
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    def _open_object(self) -> Any:
        from mds.core.object_ranges import RangeFile

        return RangeFile(self.path, None)

    def _fail(self, what: str) -> PlanError:
        return PlanError(f"{self.path}: {what}")

    def _bad(self, what: str) -> PlanError:
        """Bytes that do not check out: a plan object replaced since it was opened says so
        (its bytes are those of another plan, not damage), anything else is corrupt."""
        if self._object is not None and self._replaced():
            return PlanError(
                f"{self.path} changed while it was being read (it was replaced); open it "
                "again to read the new plan, and write a plan that is being read to a new URL"
            )
        return self._fail(what)

    def _replaced(self) -> bool:
        """Whether the plan object now differs from the one opened: another size, or another
        footer (which holds the checksums of everything else)."""
        footer = getattr(self, "footer_bytes", None)
        try:
            now = self._open_object()
        except SourceDataError:
            return False
        try:
            if now.size != self.size:
                return True
            if footer is None:
                return False
            offset, size, _digest, tail = _TRAILER.unpack(
                now.read_at(_TRAILER.size, self.size - _TRAILER.size)
            )
            return tail != MAGIC or now.read_at(min(size, self.size), offset) != footer
        except (SourceDataError, struct.error):
            return False
        finally:
            now.close()

    def _read(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or offset + size > self.size:
            raise self._bad(
                f"corrupt plan: a reference points outside the file ({offset}+{size} > {self.size})"
            )
        if self._object is not None:
            if self._pid != os.getpid():  # a forked worker opens its own connection
                self._object, self._pid = self._open_object(), os.getpid()
            try:
                data = self._object.read_at(size, offset)
            except SourceDataError as exc:
                raise PlanError(f"cannot read plan: {exc}") from None
        else:
            # pread: no shared file position, so threads and forked workers can share it.
            data = os.pread(self._f.fileno(), size, offset)  # type: ignore[union-attr]
        if len(data) != size:
            raise self._bad("truncated plan file")
        return data

    def _load(self) -> None:
        if self._object is not None:
            self.size = self._object.size
        else:
            self.size = os.fstat(self._f.fileno()).st_size  # type: ignore[union-attr]
        if self.size < _HEAD.size + _TRAILER.size:
            raise self._fail("not an mds plan (file too short; truncated?)")
        magic, version, flags = _HEAD.unpack(self._read(0, _HEAD.size))
        if magic != MAGIC:
            raise self._fail("not an mds plan (bad magic)")
        if flags:
            raise self._fail(
                f"unknown plan header flags {flags:#x} (this mds knows none); upgrade mds"
            )
        if version > FORMAT_VERSION:
            raise self._fail(
                f"plan format version {version} is newer than this mds supports ({FORMAT_VERSION}); upgrade mds"
            )
        if version < 1:
            raise self._fail(f"invalid plan format version {version}")
        if version < FORMAT_VERSION:
            raise self._fail(
                f"plan format version {version} is from an older mds, which this one no longer "
                "reads; re-plan with `mds plan` (same config and index: same samples)"
            )
        offset, size, digest, tail = _TRAILER.unpack(
            self._read(self.size - _TRAILER.size, _TRAILER.size)
        )
        if tail != MAGIC:
            raise self._fail("truncated or corrupt plan (no trailer)")
        if size > _MAX_FOOTER or offset + size > self.size - _TRAILER.size:
            raise self._fail("corrupt plan trailer")
        data = self._read(offset, size)
        if checksum(data) != digest:
            raise self._bad("plan footer checksum mismatch (corrupt file)")
        self.footer_bytes = data
        try:
            self.footer = json.loads(data)
            layout = self.footer["layout"]
            self.dp = int(layout["dp_size"])
            self.micro = int(layout["micro_batches"])
            self.id_width = int(layout["id_width"])
            self.chunks = [
                (int(a), int(b), int(o), bytes.fromhex(c), int(w))
                for a, b, o, c, w in layout["chunks"]
            ]
            self.sections = dict(layout["sections"])
        # OverflowError: int(Infinity); RecursionError: deeply nested JSON.
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
            raise self._fail(f"corrupt plan footer ({exc})") from None
        # The chunks tile [first_step, steps) in order: chunk_of() bisects them. A plan
        # derived from another at step K (its `lineage`) starts at K.
        first = self.footer.get("first_step", 0) if isinstance(self.footer, dict) else 0
        if not (isinstance(first, int) and not isinstance(first, bool) and first >= 0):
            raise self._fail(f"corrupt plan footer (first_step {first!r})")
        self.first_step = first
        starts = [first, *(c[1] for c in self.chunks)][: len(self.chunks)]
        if not (
            self.dp > 0
            and self.micro > 0
            and 1 <= self.id_width <= 8
            and all(
                c[4] in _COUNT_DTYPES and s == c[0] < c[1]
                for s, c in zip(starts, self.chunks, strict=True)
            )
        ):
            raise self._fail("corrupt plan footer (bad layout)")
        self.plan_id = plan_id_of(data)
        self._dirs: dict[int, np.ndarray] = {}

    @property
    def steps(self) -> int:
        return self.chunks[-1][1] if self.chunks else self.first_step

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        if self._object is not None:
            self._object.close()

    def __enter__(self) -> PlanReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def chunk_of(self, step: int) -> int:
        if not self.first_step <= step < self.steps:
            span = (
                f"{self.steps} steps"
                if not self.first_step
                else (f"steps {self.first_step} to {self.steps - 1}")
            )
            raise PlanError(f"{self.path}: step {step} is outside the plan's {span}")
        lo, hi = 0, len(self.chunks)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.chunks[mid][0] <= step:
                lo = mid
            else:
                hi = mid
        return lo

    def _directory(self, chunk: int) -> np.ndarray:
        directory = self._dirs.get(chunk)
        if directory is None:
            _a, _b, offset, digest, _w = self.chunks[chunk]
            data = self._read(offset, self.dp * _DIR_ENTRY.itemsize)
            if checksum(data) != digest:
                raise self._bad(f"chunk {chunk}: directory checksum mismatch (corrupt file)")
            directory = np.frombuffer(data, dtype=_DIR_ENTRY)
            if len(self._dirs) > 256:
                self._dirs.clear()
            self._dirs[chunk] = directory
        return directory

    def rank_chunk(self, chunk: int, rank: int) -> RankChunk:
        """The samples of `rank` in `chunk`, checksum-verified."""
        if not 0 <= rank < self.dp:
            raise PlanError(f"{self.path}: DP rank {rank} is outside the plan's dp_size {self.dp}")
        if not 0 <= chunk < len(self.chunks):
            raise PlanError(f"{self.path}: chunk {chunk} does not exist")
        a, b, _, _, width = self.chunks[chunk]
        entry = self._directory(chunk)[rank]
        data = self._read(int(entry["offset"]), int(entry["size"]))
        # An "S8" field drops trailing NUL bytes on read; pad it back to the stored 8 bytes.
        if checksum(data) != bytes(entry["checksum"]).ljust(8, b"\0"):
            raise self._bad(f"chunk {chunk} rank {rank}: checksum mismatch (corrupt file)")
        head = (b - a) * self.micro * width
        if head > len(data):
            raise self._fail(f"chunk {chunk} rank {rank}: corrupt block")
        counts = (
            np.frombuffer(data[:head], dtype=_COUNT_DTYPES[width])
            .reshape(b - a, self.micro)
            .astype(np.int64)
        )
        n = int(counts.sum())
        end = head + n * self.id_width
        if end > len(data):
            raise self._fail(f"chunk {chunk} rank {rank}: corrupt block (counts do not match ids)")
        view = memoryview(data)
        ids = decode_ids(view[head:end], self.id_width)
        try:
            fetch = decode_fetch(view[end:], n)
        except (ValueError, TypeError, RecursionError) as exc:
            raise self._fail(f"chunk {chunk} rank {rank}: corrupt block ({exc})") from None
        return RankChunk(a, counts, ids, fetch)

    def section(self, name: str) -> np.ndarray:
        try:
            meta = self.sections[name]
            offset, size, dtype = int(meta["offset"]), int(meta["size"]), str(meta["dtype"])
            shape = tuple(int(x) for x in meta["shape"])
            digest = bytes.fromhex(meta["checksum"])
        except (KeyError, ValueError, TypeError, OverflowError) as exc:
            raise self._fail(f"corrupt plan footer (section {name!r}: {exc})") from None
        data = self._read(offset, size)
        if checksum(data) != digest:
            raise self._bad(f"section {name!r}: checksum mismatch (corrupt file)")
        # Sections are plain numbers ("<i8", "<f8", "|u1", ...): no objects, records,
        # sub-arrays or zero-size types, whatever the footer says.
        if not _SECTION_DTYPE.fullmatch(dtype):
            raise self._fail(f"section {name!r}: corrupt shape or dtype ({dtype!r})")
        dtype = np.dtype(dtype)
        # math.prod on Python ints: numpy's product of a forged shape can wrap around.
        if min(shape, default=0) < 0 or math.prod(shape) * dtype.itemsize != size:
            raise self._fail(f"section {name!r}: corrupt shape")
        return np.frombuffer(data, dtype=dtype).reshape(shape)

    def verify_sections(self) -> None:
        """Checksum-verify every section (they are small): for commands that rewrite or
        re-derive a plan and so vouch for all of it. PlanError names the first bad one."""
        for name in sorted(self.sections):
            self.section(name)
