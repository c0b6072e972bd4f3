"""`mds verify`'s checks of the plan file itself: the footer and layout, every chunk
directory, every (chunk, rank) block and every section against its checksum. Sections and
directories are hashed from the file in pieces, never loaded whole (a packed section of a
version-3 plan is then decoded too)."""

from __future__ import annotations

import hashlib
from typing import Any, BinaryIO

import numpy as np

from mds.core.planfile_reader import PlanReader
from mds.errors import PlanError
from mds.planner.report.verify_result import VerifyResult, first_of

__all__ = ["verify_plan_file"]

_READ = 8 << 20  # bytes hashed per read: sections and tables are streamed, never loaded whole
_DIR_ENTRY = 24  # bytes per entry of a chunk directory (docs/plan-format.md)


def verify_plan_file(result: VerifyResult) -> dict[str, Any] | None:
    """Footer, layout, directories, blocks, sections; returns the footer if it is readable."""
    try:
        reader = PlanReader(result.plan)
    except PlanError as exc:
        result.add("plan file", "plan", str(exc).removeprefix(f"{result.plan}: "), "")
        return None
    with reader, open(result.plan, "rb") as f:
        result.plan_id = reader.plan_id
        result.add(
            "plan file",
            "plan",
            None,
            f"plan id {reader.plan_id}, {reader.steps} steps, {len(reader.chunks)} chunks "
            f"x {reader.dp} ranks",
        )
        result.add("plan layout", "plan", _layout_problem(reader), "chunks cover every step")
        bad_dirs = _verify_directories(result, reader, f)
        _verify_blocks(result, reader, bad_dirs)
        _verify_sections(result, reader, f)
        return reader.footer


def _layout_problem(reader: PlanReader) -> str | None:
    expected = reader.first_step  # a re-planned plan starts at its hand-over step
    for i, (a, b, *_rest) in enumerate(reader.chunks):
        if a != expected:
            return f"chunk {i} starts at step {a}, expected {expected}"
        expected = b
    steps = reader.footer.get("steps")
    if steps != expected:
        return f"the footer says {steps} steps, the chunks cover {expected}"
    return None


def _hash_range(f: BinaryIO, offset: int, size: int, file_size: int) -> bytes | None:
    """The plan checksum of bytes [offset, offset + size), read piecewise; None if outside."""
    if offset < 0 or size < 0 or offset + size > file_size:
        return None
    h = hashlib.blake2b(digest_size=8)
    f.seek(offset)
    left = size
    while left:
        piece = f.read(min(left, _READ))
        if not piece:
            return None
        h.update(piece)
        left -= len(piece)
    return h.digest()


def _verify_directories(result: VerifyResult, reader: PlanReader, f: BinaryIO) -> set[int]:
    """Check every chunk directory against the footer; returns the chunks that failed."""
    bad: list[int] = []
    first = None
    for c, (_a, _b, offset, digest, _w) in enumerate(reader.chunks):
        got = _hash_range(f, offset, reader.dir_entries * _DIR_ENTRY, reader.size)
        if got != digest:
            bad.append(c)
            first = first or (
                f"chunk {c}: directory outside the file (truncated?)"
                if got is None
                else f"chunk {c}: directory checksum mismatch"
            )
    result.add(
        "chunk directories",
        "plan",
        first_of(first, len(bad), "directories"),
        f"{len(reader.chunks)} directories",
    )
    return set(bad)


def _verify_blocks(result: VerifyResult, reader: PlanReader, bad_dirs: set[int]) -> None:
    """Read and check every (chunk, rank) block, one at a time."""
    failed, samples, first = 0, 0, None
    prefix = f"{reader.path}: "
    for c in range(len(reader.chunks)):
        if c in bad_dirs:
            continue  # counted as a directory failure: its blocks cannot be located
        for r in range(reader.dp):
            try:
                samples += len(reader.rank_chunk(c, r).ids)
            except PlanError as exc:
                failed += 1
                first = first or str(exc).removeprefix(prefix)
    checked = (len(reader.chunks) - len(bad_dirs)) * reader.dp
    result.add(
        "rank blocks",
        "plan",
        first_of(first, failed, "blocks"),
        f"{checked} blocks, {samples:,} samples",
    )


def _verify_sections(result: VerifyResult, reader: PlanReader, f: BinaryIO) -> None:
    failed, first = 0, None
    for name, meta in sorted(reader.sections.items()):
        problem = _section_problem(reader, f, name, meta)
        if problem is not None:
            failed += 1
            first = first or problem
    result.add(
        "sections",
        "plan",
        first_of(first, failed, "sections"),
        f"{len(reader.sections)} sections: {', '.join(sorted(reader.sections))}",
    )


def _section_problem(reader: PlanReader, f: BinaryIO, name: str, meta: Any) -> str | None:
    try:
        offset, size = int(meta["offset"]), int(meta["size"])
        dtype = np.dtype(str(meta["dtype"]))
        shape = [int(x) for x in meta["shape"]]
        digest = bytes.fromhex(meta["checksum"])
    except (KeyError, ValueError, TypeError) as exc:
        return f"section {name!r}: corrupt footer entry ({exc})"
    raw = meta.get("codec", "raw") == "raw"
    if dtype.hasobject or (raw and int(np.prod(shape)) * dtype.itemsize != size):
        return f"section {name!r}: size does not match its shape {shape} and dtype"
    got = _hash_range(f, offset, size, reader.size)
    if got is None:
        return f"section {name!r}: outside the file (truncated?)"
    if got != digest:
        return f"section {name!r}: checksum mismatch"
    if not raw:  # a packed section (format 3, small): it must also decode to its shape
        try:
            reader.section(name)
        except PlanError as exc:
            return str(exc).removeprefix(f"{reader.path}: ")
    return None
