"""Reading a plan file (core/planfile.py has the layout) from a file or an object: the
footer first, then only the (chunk, DP rank) blocks and sections asked for, each
checksum-verified, so a corrupt plan raises PlanError instead of returning wrong samples."""

from __future__ import annotations

import json
import math
import os
import re
import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mds.core import storage
from mds.core.packed import decompress, frame_limit, unpack, unzigzag
from mds.core.planfile import (
    COUNT_DTYPES,
    DIR_ENTRY,
    FORMAT_VERSION,
    HEAD,
    MAGIC,
    READ_VERSIONS,
    TRAILER,
    FileTable,
    RankChunk,
    checksum,
    decode_block,
    decode_rank_block,
    decode_table,
    plan_id_of,
    table_dictionary,
)
from mds.core.planfile_v2 import decode_fetch, decode_ids
from mds.errors import PlanError, SourceDataError

__all__ = ["PlanReader"]

_MAX_FOOTER = 1 << 30
_DIR_SLOT = struct.Struct("<QQ8s")  # a directory entry (DIR_ENTRY) as plain values
_SECTION_DTYPE = re.compile(r"[<>|=]?[biuf][1248]")


def _sparse(data: bytes, shape: tuple[int, ...], dtype: np.dtype, nbytes: int) -> np.ndarray:
    """A sparse section: per row its number of non-zero cells, then per cell its column
    (the first of a row as is, the next as the gap after the previous minus 1) and its
    value (zigzag), packed."""
    rows, cols = shape
    per_row, gaps, values = unpack(data, 3, 3 * nbytes + 8 * rows + 64)
    nnz = len(gaps)
    if len(per_row) != rows or len(values) != nnz or int(per_row.sum()) != nnz:
        raise ValueError("cells do not match the rows")
    out = np.zeros(rows * cols, dtype=dtype)
    if nnz:
        step = gaps.astype(np.int64) + 1
        total = np.cumsum(step)
        ends = np.cumsum(per_row.astype(np.int64))
        row = np.repeat(np.arange(rows, dtype=np.int64), per_row.astype(np.int64))
        before = np.concatenate([[0], total])[ends - per_row.astype(np.int64)]
        col = total - before[row] - 1
        if int(col.max()) >= cols:
            raise ValueError("column out of range")
        out[row * cols + col] = unzigzag(values)
    return out.reshape(shape)


def _columns(data: bytes, shape: tuple[int, ...], dtype: np.dtype, nbytes: int) -> np.ndarray:
    """A section of integer columns (a 1-d array: one), each packed zigzag."""
    rows, cols = shape[0], shape[1] if len(shape) == 2 else 1
    columns = unpack(data, cols, 8 * rows * cols + 64 * cols + 64)
    if any(len(c) != rows for c in columns):
        raise ValueError("columns do not match the shape")
    out = np.empty((rows, cols), dtype=dtype)
    for j, column in enumerate(columns):
        out[:, j] = unzigzag(column).astype(dtype)
    return out.reshape(shape)


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
            missing = str(exc).endswith("missing (no such object)")
            hint = f"; {storage.missing_hint(self.path)}" if missing else ""
            raise PlanError(f"cannot open plan: {exc}{hint}") from None
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    def _open_object(self) -> Any:
        from mds.core.object_ranges import RangeFile

        return RangeFile(self.path, None)

    def _fail(self, what: str) -> PlanError:
        if self._object is not None and ("truncat" in what or "corrupt" in what):
            what += (
                "; copy the plan there again whole (an upload cut short leaves a truncated "
                "object), or write it with `mds plan -o URL`"
            )
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
        footer = getattr(self, "_footer_stored", None)
        try:
            now = self._open_object()
        except SourceDataError:
            return False
        try:
            if now.size != self.size:
                return True
            if footer is None:
                return False
            offset, size, _digest, tail = TRAILER.unpack(
                now.read_at(TRAILER.size, self.size - TRAILER.size)
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
        if self.size < HEAD.size + TRAILER.size:
            raise self._fail("not an mds plan (file too short; truncated?)")
        magic, version, flags = HEAD.unpack(self._read(0, HEAD.size))
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
        if version not in READ_VERSIONS:
            raise self._fail(
                f"plan format version {version} is from an older mds, which this one no longer "
                "reads; re-plan with `mds plan` (same config and index: same samples)"
            )
        offset, size, digest, tail = TRAILER.unpack(
            self._read(self.size - TRAILER.size, TRAILER.size)
        )
        if tail != MAGIC:
            raise self._fail("truncated or corrupt plan (no trailer)")
        if size > _MAX_FOOTER or offset + size > self.size - TRAILER.size:
            raise self._fail("corrupt plan trailer")
        data = self._read(offset, size)
        if checksum(data) != digest:
            raise self._bad("plan footer checksum mismatch (corrupt file)")
        self._footer_stored = data
        try:
            if version >= 4:  # a zstd frame of the JSON
                data = decompress(data, min(frame_limit(size), _MAX_FOOTER))
            self.footer_bytes = data
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
                c[4] in COUNT_DTYPES and s == c[0] < c[1]
                for s, c in zip(starts, self.chunks, strict=True)
            )
        ):
            raise self._fail("corrupt plan footer (bad layout)")
        self.plan_id = plan_id_of(data)
        self.version = version
        # Version 3: each chunk's directory ends with its file table's entry.
        self.dir_entries = self.dp + (version >= 3)
        self._dirs: dict[int, tuple[bytes, list[tuple[int, int, bytes]]]] = {}
        self._tables: dict[int, FileTable] = {}
        self._decoded: dict[tuple[bytes, bool], FileTable] = {}  # the last table decoded
        # Version 4: the first chunk's file table, which later tables are compressed against;
        # read once per reader.
        self._dictionary: Any = None

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
        """The chunk's directory as DIR_ENTRY records."""
        return np.frombuffer(self._slots(chunk)[0], dtype=DIR_ENTRY)

    def _slots(self, chunk: int) -> tuple[bytes, list[tuple[int, int, bytes]]]:
        """The chunk's directory, read and checked once: its bytes and its entries as
        (offset, size, checksum) tuples (a numpy record's fields cost a microsecond each)."""
        held = self._dirs.get(chunk)
        if held is None:
            _a, _b, offset, digest, _w = self.chunks[chunk]
            data = self._read(offset, self.dir_entries * DIR_ENTRY.itemsize)
            if checksum(data) != digest:
                raise self._bad(f"chunk {chunk}: directory checksum mismatch (corrupt file)")
            held = (data, list(_DIR_SLOT.iter_unpack(data)))
            if len(self._dirs) > 256:
                self._dirs.clear()
            self._dirs[chunk] = held
        return held

    def _entry(self, chunk: int, k: int, what: str) -> bytes:
        offset, size, digest = self._slots(chunk)[1][k]
        data = self._read(offset, size)
        if checksum(data) != digest:
            raise self._bad(f"chunk {chunk} {what}: checksum mismatch (corrupt file)")
        return data

    def _table(self, chunk: int) -> FileTable:
        """The chunk's file table (version 3 on), read and checked once per chunk. Its bytes
        are read and checked for every chunk; a table with the bytes of one decoded before
        (consecutive chunks that read the same files) is not decoded again."""
        table = self._tables.get(chunk)
        if table is None:
            data = self._entry(chunk, self.dp, "file table")
            later = bool(chunk) and self.version >= 4  # compressed against the first table
            key = (self._slots(chunk)[1][self.dp][2], later)
            table = self._decoded.get(key)
            if table is None:
                try:
                    dictionary = self._table_dictionary() if later else None
                    table = decode_table(data, self.version, dictionary)
                except (ValueError, TypeError, RecursionError) as exc:
                    raise self._fail(f"chunk {chunk}: corrupt file table ({exc})") from None
            if len(self._tables) > 16:
                self._tables.clear()
            self._tables[chunk] = table
            self._decoded = {key: table}
        return table

    def _table_dictionary(self) -> Any:
        """The first chunk's table content as a zstd dictionary, read and checked once."""
        if self._dictionary is None:
            data = self._entry(0, self.dp, "file table")
            content = decompress(data, frame_limit(len(data)))
            self._dictionary = table_dictionary(content)
        return self._dictionary

    def rank_chunk(self, chunk: int, rank: int) -> RankChunk:
        """The samples of `rank` in `chunk`, checksum-verified."""
        if not 0 <= rank < self.dp:
            raise PlanError(f"{self.path}: DP rank {rank} is outside the plan's dp_size {self.dp}")
        if not 0 <= chunk < len(self.chunks):
            raise PlanError(f"{self.path}: chunk {chunk} does not exist")
        a, b, _, _, width = self.chunks[chunk]
        data = self._entry(chunk, rank, f"rank {rank}")
        if self.version >= 4:
            table = self._table(chunk)
            try:
                counts, ids, fetch = decode_rank_block(data, b - a, self.micro, table)
            except (ValueError, TypeError) as exc:
                raise self._fail(f"chunk {chunk} rank {rank}: corrupt block ({exc})") from None
            if self.id_width < 8 and int(ids.max(initial=0)) >> (8 * self.id_width):
                raise self._fail(f"chunk {chunk} rank {rank}: corrupt block (id out of range)")
            return RankChunk(a, counts, ids, fetch)
        head = (b - a) * self.micro * width
        if head > len(data):
            raise self._fail(f"chunk {chunk} rank {rank}: corrupt block")
        counts = (
            np.frombuffer(data[:head], dtype=COUNT_DTYPES[width])
            .reshape(b - a, self.micro)
            .astype(np.int64)
        )
        n = int(counts.sum())
        if self.version >= 3:
            table = self._table(chunk)
            try:
                ids, fetch = decode_block(memoryview(data)[head:], n, table)
            except (ValueError, TypeError) as exc:
                raise self._fail(f"chunk {chunk} rank {rank}: corrupt block ({exc})") from None
            if self.id_width < 8 and int(ids.max(initial=0)) >> (8 * self.id_width):
                raise self._fail(f"chunk {chunk} rank {rank}: corrupt block (id out of range)")
            return RankChunk(a, counts, ids, fetch)
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
        codec = meta.get("codec", "raw")
        data = self._read(offset, size)
        if checksum(data) != digest:
            raise self._bad(f"section {name!r}: checksum mismatch (corrupt file)")
        # Sections are plain numbers ("<i8", "<f8", "|u1", ...): no objects, records,
        # sub-arrays or zero-size types, whatever the footer says.
        if not _SECTION_DTYPE.fullmatch(dtype):
            raise self._fail(f"section {name!r}: corrupt shape or dtype ({dtype!r})")
        dtype = np.dtype(dtype)
        # math.prod on Python ints: numpy's product of a forged shape can wrap around.
        nbytes = math.prod(shape) * dtype.itemsize
        # What a packed section may expand to: a sparse one (mostly zeros), 256 times the
        # plan's size; any other, what its frame may hold (core/packed.py).
        limit = max(frame_limit(size), 256 * self.size if codec == "sparse" else 0)
        if min(shape, default=0) < 0 or (nbytes != size if codec == "raw" else nbytes > limit):
            raise self._fail(f"section {name!r}: corrupt shape")
        try:
            if codec == "raw":
                return np.frombuffer(data, dtype=dtype).reshape(shape)
            if codec == "zstd":
                raw = decompress(data, nbytes)
                if len(raw) != nbytes:
                    raise ValueError("size does not match the shape")
                planes = np.frombuffer(raw, dtype=np.uint8).reshape(dtype.itemsize, -1)
                return np.ascontiguousarray(planes.T).view(dtype).reshape(shape)
            if codec == "sparse" and len(shape) == 2 and dtype.kind in "iu":
                return _sparse(data, shape, dtype, nbytes)
            if codec == "columns" and len(shape) in (1, 2) and dtype.kind in "iu":
                return _columns(data, shape, dtype, nbytes)
            raise ValueError(f"unknown codec {codec!r}")
        except (ValueError, TypeError) as exc:
            raise self._fail(f"section {name!r}: corrupt shape or data ({exc})") from None

    def verify_sections(self) -> None:
        """Checksum-verify every section (they are small): for commands that rewrite or
        re-derive a plan and so vouch for all of it. PlanError names the first bad one."""
        for name in sorted(self.sections):
            self.section(name)
