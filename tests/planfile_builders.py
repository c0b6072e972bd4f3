"""Builders for the plan-file tests (tests/core/test_planfile*.py): random chunks, fetch
records derived from sample ids, and small plans written with PlanWriter.

A plain module (tests/conftest.py puts tests/ on sys.path): `from planfile_builders import ...`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from mds.core.packed import compress, decompress
from mds.core.planfile import Fetch
from mds.core.planfile_writer import PlanWriter

DP, MICRO = 3, 2


def random_chunks(rng, bounds, dp=DP, micro=MICRO, top=2**20):
    chunks = []
    for a, b in bounds:
        blocks = []
        for _ in range(dp):
            counts = rng.integers(0, 4, (b - a, micro))
            ids = rng.integers(0, top, int(counts.sum())).astype(np.uint64)
            blocks.append((counts, ids))
        chunks.append((a, b, blocks))
    return chunks


def fetch_of(ids: np.ndarray) -> Fetch:
    """Fetch records derived from the ids: three files, JSONL-like byte ranges."""
    ids = ids.astype(np.uint64) % np.uint64(2**40)
    files = (
        [(1, 10 + f, {"path": f"d/f{f}.jsonl", "size": f}) for f in range(3)] if len(ids) else []
    )
    return Fetch(ids % 3, ids // 3, ids % 1000 + 1, ids * 10, ids % 77, files)


def with_fetch(block):
    """A (counts, ids) block completed with fetch records derived from the ids."""
    return block if len(block) == 3 else (*block, fetch_of(block[1]))


def footer_text(data: bytes) -> tuple[int, bytes]:
    """(offset, JSON) of the footer of a plan file's bytes, parsed by hand (not with
    PlanReader): the trailer locates it, version 4 stores the JSON in a zstd frame."""
    offset, size, _digest, magic = struct.unpack("<QQ8s8s", data[-32:])
    assert magic == b"MDSPLAN\x00"
    stored = data[offset : offset + size]
    version = struct.unpack_from("<I", data, 8)[0]
    return offset, decompress(stored, 1 << 30) if version >= 4 else stored


def footer_json(data: bytes) -> dict[str, Any]:
    """The parsed footer of a plan file's bytes (footer_text)."""
    return json.loads(footer_text(data)[1])


def stored_footer(text: bytes) -> bytes:
    """Footer JSON as a version-4 plan stores it."""
    return compress(text)


def write_plan(path: Path, chunks, *, id_width=3, sections=None, footer=None, version=None):
    writer = PlanWriter(
        path,
        path.with_suffix(".tmp"),
        dp_size=len(chunks[0][2]) if chunks else DP,
        micro_batches=chunks[0][2][0][0].shape[1] if chunks else MICRO,
        id_width=id_width,
        **({} if version is None else {"version": version}),
    )
    for a, b, blocks in chunks:
        writer.add_chunk(a, b, [with_fetch(block) for block in blocks])
    for name, array in (sections or {}).items():
        writer.add_section(name, array)
    return writer.commit(footer or {"format": "mds-plan", "note": "test"})


def written_plan(tmp_path: Path, version=None):
    """A plan of three chunks and three sections at tmp_path/plan.mds (in the current
    format, or `version`): (path, chunks, sections, footer bytes)."""
    rng = np.random.default_rng(1)
    chunks = random_chunks(rng, [(0, 4), (4, 8), (8, 10)])
    sections = {
        "stats": rng.integers(0, 10**12, (10, 9)).astype(np.int64),
        "target": rng.random((4, 3)),
        "small": np.arange(5, dtype=np.uint16),
    }
    path = tmp_path / "plan.mds"
    footer_bytes = write_plan(path, chunks, sections=sections, version=version)
    return path, chunks, sections, footer_bytes
