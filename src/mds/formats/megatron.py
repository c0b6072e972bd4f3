"""Read and write Megatron-LM indexed datasets (`prefix.bin` + `prefix.idx`, index version 1).

The index arrays are views into a memory map (a 100M-sequence index is never copied) and
validation walks them in fixed-size chunks, so memory stays bounded. numpy and stdlib only.
"""

from __future__ import annotations

import os
import secrets
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from mds.core import storage
from mds.errors import SourceDataError

__all__ = [
    "DTYPE_CODES",
    "MAGIC",
    "MegatronIndex",
    "check_bin",
    "open_bin",
    "read_index",
    "read_sequence",
    "write_dataset",
]

MAGIC = b"MMIDIDX\x00\x00"
_VERSION = 1
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document count
HEADER_SIZE = _HEADER.size  # 34

# Megatron's DType enum; the files are little-endian whatever the host is.
DTYPE_CODES: dict[int, np.dtype] = {
    code: np.dtype(spec)
    for code, spec in enumerate(("u1", "i1", "<i2", "<i4", "<i8", "<f8", "<f4", "<u2"), start=1)
}
_CODE_OF = {dtype.newbyteorder("<"): code for code, dtype in DTYPE_CODES.items()}
_INT32, _INT64 = np.dtype("<i4"), np.dtype("<i8")

# Validation works on slices of this many entries so its scratch memory stays bounded.
_CHUNK = 1 << 20


@dataclass(frozen=True, eq=False)
class MegatronIndex:
    """A parsed `.idx`: arrays are read-only views into a memory map of the file."""

    path: Path | str
    dtype: np.dtype
    sizes: np.ndarray  # int32[sequence_count], tokens per sequence
    pointers: np.ndarray  # int64[sequence_count], byte offset of each sequence in the .bin
    document_indices: np.ndarray  # int64[document_count], sequence ranges of documents

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def bin_nbytes(self) -> int:
        """The size the matching .bin must have."""
        if len(self.sizes) == 0:
            return 0
        return int(self.pointers[-1]) + int(self.sizes[-1]) * self.itemsize


def _chunks(n: int) -> Iterator[tuple[int, int]]:
    for start in range(0, n, _CHUNK):
        yield start, min(start + _CHUNK, n)


def _read_header(path: Path) -> tuple[np.dtype, int, int, int]:
    """Parse and check the fixed header; return (dtype, sequences, documents, file size)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_SIZE)
            file_size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise SourceDataError(f"{path}: cannot read Megatron index ({exc.strerror})") from None
    return _parse_header(path, head, file_size)


def _parse_header(path: Any, head: bytes, file_size: int) -> tuple[np.dtype, int, int, int]:
    if head[: len(MAGIC)] != MAGIC:
        raise SourceDataError(f"{path}: not a Megatron .idx file (bad magic)")
    if len(head) < HEADER_SIZE:
        raise SourceDataError(
            f"{path}: truncated Megatron .idx header ({len(head)} bytes, need {HEADER_SIZE})"
        )
    _, version, code, n_seq, n_doc = _HEADER.unpack(head)
    if version != _VERSION:
        raise SourceDataError(
            f"{path}: unsupported Megatron .idx version {version} (only {_VERSION} is supported)"
        )
    if code not in DTYPE_CODES:
        raise SourceDataError(f"{path}: unknown Megatron dtype code {code} (expected 1-8)")
    return DTYPE_CODES[code], n_seq, n_doc, file_size


def _check_length(path: Path, n_seq: int, n_doc: int, file_size: int) -> None:
    need = HEADER_SIZE + 12 * n_seq + 8 * n_doc
    if file_size < need:
        raise SourceDataError(
            f"{path}: file too short for {n_seq} sequences and {n_doc} document indices "
            f"({file_size} bytes, need {need})"
        )
    extra = file_size - need
    if extra not in (0, n_seq):  # n_seq trailing bytes: megatron.core's int8 sequence_modes
        raise SourceDataError(
            f"{path}: {extra} unexpected bytes after the index arrays "
            f"(expected 0, or {n_seq} of sequence_modes)"
        )


def _check_sizes_and_pointers(
    path: Path, sizes: np.ndarray, pointers: np.ndarray, itemsize: int
) -> None:
    """Pointers must be the exclusive running sum of sizes * itemsize; sizes non-negative."""
    offset = 0
    for start, stop in _chunks(len(sizes)):
        nbytes = sizes[start:stop].astype(np.int64) * itemsize
        negative = np.flatnonzero(nbytes < 0)
        if len(negative):
            i = start + int(negative[0])
            raise SourceDataError(f"{path}: sequence {i} has negative size {int(sizes[i])}")
        ends = np.cumsum(nbytes) + offset
        expected = ends - nbytes
        wrong = np.flatnonzero(pointers[start:stop] != expected)
        if len(wrong):
            j = int(wrong[0])
            raise SourceDataError(
                f"{path}: pointer of sequence {start + j} is {int(pointers[start + j])}, "
                f"expected {int(expected[j])} (pointers must be the running sum of "
                f"sizes * {itemsize})"
            )
        offset = int(ends[-1])


def _check_documents(path: Path, docs: np.ndarray, n_seq: int) -> None:
    """Document boundaries: start at 0, never decrease, end at the sequence count."""
    if len(docs) == 0 or docs[0] != 0 or docs[-1] != n_seq:
        raise SourceDataError(
            f"{path}: document_indices must start at 0 and end at the sequence count {n_seq}"
            + (f" (got {int(docs[0])} .. {int(docs[-1])})" if len(docs) else " (it is empty)")
        )
    for start, stop in _chunks(len(docs) - 1):
        steps = docs[start + 1 : stop + 1] - docs[start:stop]
        bad = np.flatnonzero(steps < 0)
        if len(bad):
            i = start + int(bad[0]) + 1
            raise SourceDataError(
                f"{path}: document_indices decrease at entry {i} "
                f"({int(docs[i - 1])} -> {int(docs[i])})"
            )


def read_index(idx_path: str | os.PathLike[str]) -> MegatronIndex:
    """Open and validate a `.idx` (a file, memory-mapped, or an object, read whole with
    range requests); raises SourceDataError naming the file and the problem."""
    if storage.is_url(idx_path):
        raw = _object_bytes(str(idx_path))
        path: Any = idx_path
        dtype, n_seq, n_doc, file_size = _parse_header(path, raw[:HEADER_SIZE], len(raw))
        buffer: Any = np.frombuffer(raw, dtype=np.uint8)
    else:
        path = Path(idx_path)
        dtype, n_seq, n_doc, file_size = _read_header(path)
        buffer = None
    _check_length(path, n_seq, n_doc, file_size)
    if buffer is None:
        buffer = np.memmap(path, dtype=np.uint8, mode="r")
    sizes = np.frombuffer(buffer, dtype=_INT32, count=n_seq, offset=HEADER_SIZE)
    pointers = np.frombuffer(buffer, dtype=_INT64, count=n_seq, offset=HEADER_SIZE + 4 * n_seq)
    docs = np.frombuffer(buffer, dtype=_INT64, count=n_doc, offset=HEADER_SIZE + 12 * n_seq)
    _check_sizes_and_pointers(path, sizes, pointers, dtype.itemsize)
    _check_documents(path, docs, n_seq)
    return MegatronIndex(path, dtype, sizes, pointers, docs)


def _object_bytes(url: str) -> bytes:
    """The whole object, one request."""
    from mds.core.object_ranges import RangeFile

    f = RangeFile(url, None)
    try:
        return f.read_at(f.size, 0)
    finally:
        f.close()


class SequenceFile:
    """Random access to the sequences of a `.bin`/`.idx` pair through `pread`, for training.

    Opening checks the header, the .idx length and the .bin size (constant cost); each read
    looks up its sequence's size and pointer (12 bytes of the .idx) and checks them against
    the .bin. Nothing is memory-mapped, so a process's memory follows the sequences it reads,
    not the size of the files (a map's page faults bring in whole page-cache folios, up to
    2 MiB each, which count as the process's resident memory).

    Of objects (s3:// URLs) reads are range requests: the .idx through the block cache
    `blocks` in aligned blocks, the .bin from the bytes staged for the fetch (`bin_spans`).
    """

    def __init__(self, idx_path: Path | str, bin_path: Path | str, blocks: Any = None):
        objects = storage.is_url(idx_path)
        self.idx_path: Any = idx_path if objects else Path(idx_path)
        self.bin_path: Any = bin_path if objects else Path(bin_path)
        self._idx = self._bin = -1
        self._objects: tuple[Any, Any] | None = None
        try:
            if objects:
                from mds.core.object_ranges import RangeFile

                self._objects = (RangeFile(str(idx_path), blocks), None)
                head = self._objects[0].read_at(HEADER_SIZE, 0)
                info = _parse_header(idx_path, head, self._objects[0].size)
                self._objects = (self._objects[0], RangeFile(str(bin_path), blocks))
                bin_size = self._objects[1].size
            else:
                info = _read_header(self.idx_path)
            self.dtype, self.count, n_doc, file_size = info
            _check_length(self.idx_path, self.count, n_doc, file_size)
            self._pointers_at = HEADER_SIZE + 4 * self.count
            if not objects:
                self._idx = os.open(self.idx_path, os.O_RDONLY)
                try:
                    self._bin = os.open(self.bin_path, os.O_RDONLY)
                except OSError as exc:
                    raise SourceDataError(
                        f"{self.bin_path}: cannot read Megatron data file ({exc.strerror})"
                    ) from None
                bin_size = os.fstat(self._bin).st_size
            self.bin_items = bin_size // self.dtype.itemsize
            if self.count:
                last = self.count - 1
                expected = self._pointer(last) + self._size(last) * self.dtype.itemsize
                if bin_size != expected:
                    raise SourceDataError(
                        f"{self.bin_path}: Megatron .bin is {bin_size} bytes but "
                        f"{_name(self.idx_path)} implies {expected}"
                    )
        except BaseException:
            self.close()
            raise

    def handles(self) -> list[tuple[int, Any]]:
        """The .bin (0) and .idx (1): open descriptors, or RangeFiles of objects."""
        if self._objects is not None:
            return [(0, self._objects[1]), (1, self._objects[0])]
        return [(0, self._bin), (1, self._idx)]

    @property
    def bin_object(self) -> Any:
        """The .bin's RangeFile, for an object; None for a file."""
        return self._objects[1] if self._objects else None

    def _pread(self, which: int, size: int, offset: int) -> bytes:
        path = (self.idx_path, self.bin_path)[which]
        if self._objects is not None:
            f = self._objects[which]
            data = f.read_ranges([offset], [size])[0] if which == 0 else f.read_at(size, offset)
        else:
            data = os.pread((self._idx, self._bin)[which], size, offset)
        if len(data) != size:
            raise SourceDataError(
                f"{path}: truncated (read {len(data)} of {size} bytes at {offset})"
            )
        return data

    def _size(self, i: int) -> int:
        return int.from_bytes(self._pread(0, 4, HEADER_SIZE + 4 * i), "little", signed=True)

    def _pointer(self, i: int) -> int:
        raw = self._pread(0, 8, self._pointers_at + 8 * i)
        return int.from_bytes(raw, "little", signed=True)

    def bin_spans(self, rows: list[int]) -> list[tuple[int, int]]:
        """The .bin byte spans of sequences `rows` (those within the file), from the .idx."""
        rows = [r for r in rows if 0 <= r < self.count]
        if not rows or self._objects is None:
            return []
        idx = self._objects[0]
        starts = [HEADER_SIZE + 4 * r for r in rows] + [self._pointers_at + 8 * r for r in rows]
        raw = idx.read_ranges(starts, [4] * len(rows) + [8] * len(rows))
        out = []
        for k in range(len(rows)):
            size = int.from_bytes(raw[k], "little", signed=True)
            pointer = int.from_bytes(raw[len(rows) + k], "little", signed=True)
            if size > 0 and pointer >= 0:
                out.append((pointer, pointer + size * self.dtype.itemsize))
        return out

    def read(self, i: int) -> np.ndarray:
        """Sequence `i` (0 <= i < count), as a fresh array of `dtype`."""
        size, pointer = self._size(i), self._pointer(i)
        itemsize = self.dtype.itemsize
        if size < 0:
            raise SourceDataError(f"{self.idx_path}: sequence {i} has negative size {size}")
        if pointer < 0 or pointer % itemsize or pointer // itemsize + size > self.bin_items:
            raise SourceDataError(
                f"{self.idx_path}: sequence {i}: pointer {pointer} and size {size} leave the .bin"
            )
        data = self._pread(1, size * itemsize, pointer)
        return np.frombuffer(data, dtype=self.dtype.newbyteorder("<")).astype(self.dtype)

    def close(self) -> None:
        for fd in (self._idx, self._bin):
            if fd >= 0:
                os.close(fd)
        self._idx = self._bin = -1
        for f in self._objects or ():
            if f is not None:
                f.close()
        self._objects = None


def _name(path: Any) -> str:
    return PurePosixPath(str(path)).name


def check_bin(index: MegatronIndex, bin_path: str | os.PathLike[str]) -> None:
    """Raise SourceDataError unless the .bin has exactly the size the index implies."""
    path: Any = bin_path if storage.is_url(bin_path) else Path(bin_path)
    try:
        size = storage.stat(path).st_size
    except OSError as exc:
        raise SourceDataError(f"{path}: cannot read Megatron data file ({exc.strerror})") from None
    if size != index.bin_nbytes:
        raise SourceDataError(
            f"{path}: Megatron .bin is {size} bytes but {_name(index.path)} implies "
            f"{index.bin_nbytes}"
        )


def open_bin(index: MegatronIndex, bin_path: str | os.PathLike[str]) -> np.ndarray:
    """Check the .bin against the index and memory-map it as a flat array of `index.dtype`."""
    check_bin(index, bin_path)
    if index.bin_nbytes == 0:  # mmap cannot map an empty file
        return np.empty(0, dtype=index.dtype)
    return np.memmap(bin_path, dtype=index.dtype, mode="r")


def read_sequence(
    bin_source: str | os.PathLike[str] | np.ndarray, index: MegatronIndex, i: int
) -> np.ndarray:
    """Return sequence `i` as a fresh array; pass `open_bin(...)`'s result when reading many."""
    if not 0 <= i < len(index):
        raise IndexError(f"sequence {i} out of range for {len(index)} sequences")
    data = bin_source if isinstance(bin_source, np.ndarray) else open_bin(index, bin_source)
    if data.dtype != index.dtype:
        raise TypeError(f"bin array has dtype {data.dtype}, index says {index.dtype}")
    start = int(index.pointers[i]) // index.itemsize
    return np.array(data[start : start + int(index.sizes[i])])


def _as_dtype(sequence: object, dtype: np.dtype, i: int) -> np.ndarray:
    raw = np.asarray(sequence)
    if raw.ndim != 1:
        raise ValueError(f"sequence {i} is not one-dimensional (shape {raw.shape})")
    out = raw.astype(dtype)
    if dtype.kind in "iu" and len(raw) and not np.array_equal(out, raw):
        raise ValueError(f"sequence {i} has values that do not fit {dtype}")
    return out


def _idx_bytes(sizes: np.ndarray, dtype: np.dtype) -> bytes:
    n = len(sizes)
    header = _HEADER.pack(MAGIC, _VERSION, _CODE_OF[dtype], n, n + 1)
    nbytes = sizes.astype(_INT64) * dtype.itemsize
    pointers = np.cumsum(nbytes, dtype=_INT64) - nbytes
    docs = np.arange(n + 1, dtype=_INT64)
    return header + sizes.astype(_INT32).tobytes() + pointers.tobytes() + docs.tobytes()


def _temp_beside(path: Path) -> Path:
    """A fresh name in the same directory (so os.replace is atomic); the umask sets its mode."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            with open(tmp, "xb"):
                return tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot create a temporary file beside {path}")


def write_dataset(
    prefix: str | os.PathLike[str],
    sequences: Iterable[object],
    dtype: np.dtype | type = np.uint16,
) -> tuple[Path, Path]:
    """Write `prefix.bin` and `prefix.idx` (one document per sequence) atomically.

    Each file is written under a temporary name in its directory and moved into place with
    `os.replace`, so neither is ever seen half-written. The pair is not replaced as one: between
    the two moves a reader can meet the new .bin beside the old .idx (`check_bin` catches that
    unless the sizes happen to agree), so do not rewrite a dataset that is being read.
    """
    dtype = np.dtype(dtype).newbyteorder("<")
    if dtype not in _CODE_OF:
        names = ", ".join(str(d) for d in DTYPE_CODES.values())
        raise ValueError(f"dtype {dtype} has no Megatron code; use one of {names}")
    bin_path, idx_path = Path(f"{prefix}.bin"), Path(f"{prefix}.idx")
    temps: list[Path] = []
    try:
        temps.append(tmp_bin := _temp_beside(bin_path))
        temps.append(tmp_idx := _temp_beside(idx_path))
        sizes: list[int] = []
        with open(tmp_bin, "wb") as f:
            for i, sequence in enumerate(sequences):
                arr = _as_dtype(sequence, dtype, i)
                if len(arr) > np.iinfo(np.int32).max:
                    raise ValueError(f"sequence {i} is longer than an int32 size can hold")
                f.write(arr.tobytes())
                sizes.append(len(arr))
        tmp_idx.write_bytes(_idx_bytes(np.array(sizes, dtype=_INT64), dtype))
        os.replace(tmp_bin, bin_path)
        os.replace(tmp_idx, idx_path)
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
    return bin_path, idx_path
