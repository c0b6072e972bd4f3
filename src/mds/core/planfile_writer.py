"""Writing a plan file (core/planfile.py has the layout): chunks, then sections, then the
footer and trailer, to a temporary file renamed into place on commit."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mds.core import commit
from mds.core.packed import MAX_COLUMNS, compress, pack, zigzag
from mds.core.planfile import (
    DIR_ENTRY,
    FORMAT_VERSION,
    HEAD,
    MAGIC,
    TRAILER,
    ChunkBlocks,
    EncodedChunk,
    Fetch,
    checksum,
    encode_chunk,
    encode_table,
    table_dictionary,
)
from mds.core.planfile_v2 import encode_chunk_v2

__all__ = ["PlanWriter"]


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
        version: int = FORMAT_VERSION,
    ):
        """`version` 2 or 3 writes an older format (2: blocks with their own file records,
        raw sections; 3: file tables on their own, the footer as plain JSON): only for
        comparing formats and testing that they are still read."""
        assert version in (2, 3, FORMAT_VERSION)
        self.path, self.tmp = Path(path), Path(tmp)
        self.dp, self.micro = dp_size, micro_batches
        self.id_width, self.version = id_width, version
        self._f: BinaryIO = open(self.tmp, "wb")  # noqa: SIM115 - closed in commit/abort
        try:
            self._f.write(HEAD.pack(MAGIC, version, 0))
        except BaseException:
            self.abort()
            raise
        self._chunks: list[list[Any]] = []
        self._sections: dict[str, dict[str, Any]] = {}
        self._dictionary: Any = None  # version 4: the first chunk's file table, as a dictionary

    def add_chunk(
        self,
        step_start: int,
        step_end: int,
        blocks: list[tuple[np.ndarray, np.ndarray, Fetch]] | ChunkBlocks | EncodedChunk,
    ) -> None:
        """Append one chunk: for each rank, (counts [steps, M], global ids, fetch records),
        or the chunk as encode_chunk made it with this plan's geometry."""
        if not isinstance(blocks, EncodedChunk):
            steps = step_end - step_start
            if self.version == 2:
                blocks = encode_chunk_v2(blocks, steps, self.micro, self.id_width)
            else:
                blocks = encode_chunk(blocks, steps, self.micro, self.id_width, self.version)
        assert (blocks.table is not None) == (self.version >= 4)
        if blocks.table is not None:
            # The first chunk's table is compressed alone; every later one against it.
            table = encode_table(blocks.table, self._dictionary)
            if self._dictionary is None:
                self._dictionary = table_dictionary(blocks.table)
            blocks = EncodedChunk(
                blocks.count_width,
                [*blocks.payloads, table],
                [*blocks.checksums, checksum(table)],
            )
        # Version 3 on: the blocks, then the chunk's file table.
        assert len(blocks.payloads) == self.dp + (self.version >= 3)
        dir_offset = self._f.tell()
        directory = np.zeros(len(blocks.payloads), dtype=DIR_ENTRY)
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

    def add_section(self, name: str, array: np.ndarray, *, sparse: bool = False) -> None:
        """Append a section: its bytes as byte planes in a zstd frame, or with `sparse` (a
        2-d integer array of mostly zeros) only its non-zero cells, or (version 4, integers
        in 1 or 2 dimensions) its columns packed (docs/plan-format.md)."""
        dtype = array.dtype.newbyteorder("<")
        array = np.ascontiguousarray(array).astype(dtype)
        codec = "sparse" if sparse else "zstd"
        if self.version < 3:
            data = array.tobytes()
        elif sparse:
            assert array.ndim == 2 and dtype.kind in "iu"
            row, col = np.nonzero(array)
            per_row = np.bincount(row, minlength=array.shape[0])
            gaps = np.diff(col, prepend=0) - 1
            starts = np.cumsum(per_row) - per_row
            gaps[starts[per_row > 0]] = col[starts[per_row > 0]]
            values = zigzag(array[row, col].astype(np.int64))
            data = pack([per_row, gaps, values])
        elif (
            self.version >= 4
            and array.ndim in (1, 2)
            and dtype.kind in "iu"
            and (array.ndim == 1 or array.shape[1] <= MAX_COLUMNS)
        ):
            table = array if array.ndim == 2 else array[:, None]
            data = pack([zigzag(table[:, j].astype(np.int64)) for j in range(table.shape[1])])
            codec = "columns"
        else:
            planes = array.view(np.uint8).reshape(-1, dtype.itemsize).T
            data = compress(planes.tobytes())
        self._sections[name] = {
            "offset": self._f.tell(),
            "size": len(data),
            "dtype": dtype.str,
            "shape": list(array.shape),
            "checksum": checksum(data).hex(),
        }
        if self.version >= 3:
            self._sections[name]["codec"] = codec
        self._f.write(data)

    def commit(self, footer: dict[str, Any]) -> bytes:
        """Write footer and trailer, fsync, rename into place; returns the footer's JSON
        (version 4 stores it as a zstd frame)."""
        footer = dict(footer)
        footer["layout"] = {
            "dp_size": self.dp,
            "micro_batches": self.micro,
            "id_width": self.id_width,
            "chunks": self._chunks,
            "sections": self._sections,
        }
        data = json.dumps(footer, sort_keys=True, separators=(",", ":")).encode()
        stored = compress(data) if self.version >= 4 else data
        offset = self._f.tell()
        self._f.write(stored)
        self._f.write(TRAILER.pack(offset, len(stored), checksum(stored), MAGIC))
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
