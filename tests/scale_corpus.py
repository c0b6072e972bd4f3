"""Synthetic corpora of any size that cost little disk, for the scale tests and benchmark:
a Megatron dataset whose `.bin` is sparse, and many tiny JSONL files; plus their mds.toml.

A plain module (tests/conftest.py puts tests/ on sys.path): `from scale_corpus import ...`;
bench/bench_scale.py puts tests/ on sys.path to import it.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

__all__ = [
    "FILES_PER_DIR",
    "LINES_PER_FILE",
    "MEGATRON_PATH",
    "SMALL_FILES_PATH",
    "megatron_lengths",
    "write_scale_config",
    "write_small_files",
    "write_sparse_megatron",
]

MIN_TOKENS, MAX_TOKENS = 64, 448  # Megatron sequence lengths: uniform, mean 256
LINES_PER_FILE = 4
FILES_PER_DIR = 1000
MEGATRON_PATH = "data/data"  # the prefix write_sparse_megatron writes under a root
SMALL_FILES_PATH = "data/*/*.jsonl"  # the pattern of write_small_files under a root
_CHUNK = 1 << 22  # rows written at a time: memory stays bounded for 100M rows


def megatron_lengths(first: int, count: int) -> np.ndarray:
    """Lengths of rows [first, first + count): a hash of the row number, so any part of a
    corpus is computed on its own, varied enough that an index table of them does not
    compress to nothing."""
    rows = np.arange(first, first + count, dtype=np.uint64)
    mixed = (rows * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    return (MIN_TOKENS + mixed % np.uint64(MAX_TOKENS - MIN_TOKENS + 1)).astype("<i4")


def write_sparse_megatron(prefix: Path, rows: int) -> None:
    """A Megatron dataset `prefix.idx` + `prefix.bin` of `rows` int32 sequences (one
    document). The `.idx` is real; the `.bin` has the size it implies but is a sparse file
    made with os.truncate, so its token ids read as zeros and it takes no disk."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    itemsize = 4
    with open(prefix.with_name(prefix.name + ".idx"), "wb") as f:
        f.write(struct.pack("<9sQBQQ", b"MMIDIDX\x00\x00", 1, 4, rows, 2))  # dtype 4: int32
        for a in range(0, rows, _CHUNK):
            f.write(megatron_lengths(a, min(_CHUNK, rows - a)).tobytes())
        offset = 0
        for a in range(0, rows, _CHUNK):
            nbytes = megatron_lengths(a, min(_CHUNK, rows - a)).astype("<i8") * itemsize
            ends = np.cumsum(nbytes) + offset
            f.write((ends - nbytes).tobytes())
            offset = int(ends[-1])
        f.write(np.array([0, rows], dtype="<i8").tobytes())
    with open(prefix.with_name(prefix.name + ".bin"), "wb") as f:
        os.truncate(f.fileno(), offset)


def write_small_files(
    root: Path, files: int, *, lines_per_file: int = LINES_PER_FILE, tokens: int = 200
) -> None:
    """`files` tiny JSONL files of `lines_per_file` token-id lists each (exact lengths:
    `tokens`, `tokens` + 10, ...), FILES_PER_DIR per directory: root/d00000/f0000000.jsonl..."""
    body = "".join(
        json.dumps({"tokens": list(range(tokens + 10 * i))}) + "\n" for i in range(lines_per_file)
    ).encode()
    for i in range(files):
        directory = root / f"d{i // FILES_PER_DIR:05d}"
        if i % FILES_PER_DIR == 0:
            directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / f"f{i:07d}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, body)
        finally:
            os.close(fd)


def write_scale_config(
    root: Path,
    kind: str,
    *,
    steps: int,
    samples_per_step: int,
    dp_size: int,
    micro_batches: int = 1,
    chunk_steps: int | None = None,
) -> Path:
    """root/mds.toml with one source (`kind` "megatron": MEGATRON_PATH, "files":
    SMALL_FILES_PATH) and the plan geometry; the index goes to root/index."""
    if kind == "megatron":
        source = f'name = "mega"\npath = "{MEGATRON_PATH}"\n'
    elif kind == "files":
        source = f'name = "small"\npath = "{SMALL_FILES_PATH}"\ntokens = "tokens"\n'
    else:
        raise ValueError(f"kind must be 'megatron' or 'files', got {kind!r}")
    plan = f"\n[plan]\nchunk_steps = {chunk_steps}\n" if chunk_steps else ""
    config = root / "mds.toml"
    config.write_text(
        f'[index]\noutput = "index"\n\n[[source]]\n{source}weight = 1.0\n\n'
        f"[train]\nsteps = {steps}\ndp_size = {dp_size}\nmicro_batches = {micro_batches}\n"
        f"samples_per_step = {samples_per_step}\nmax_tokens_per_micro_batch = 65536\nseed = 1\n"
        'overlong = "error"\n\n[cost]\nmodel = { layers = 12, hidden = 768, vocab = 50000 }\n'
        + plan,
        encoding="utf-8",
    )
    return config
