"""Builders for the `mds verify` tests (tests/planner/report/test_verify*.py): where a
plan's blocks lie, and byte edits of plans, indexes and source files.

A plain module (tests/conftest.py puts tests/ on sys.path): `from verify_builders import ...`.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

from index_files import manifest_with_files, write_v1
from planfile_builders import footer_json

SOURCES = ["web", "books", "forum", "code", "wiki", "math"]


PLAN_CHECKS = ["plan file", "plan layout", "chunk directories", "rank blocks", "sections"]


def failure(result) -> tuple[str, str]:
    first = result.first_failure
    assert first is not None and not result.ok
    return first.name, first.detail


def check(result, name: str):
    (found,) = [c for c in result.checks if c.name == name]
    return found


def copy_plan(pristine: Path, tmp_path: Path) -> Path:
    target = tmp_path / "plan.mds"
    shutil.copyfile(pristine / "plan.mds", target)
    return target


def layout(plan: Path) -> dict:
    return footer_json(plan.read_bytes())["layout"]


def block_span(plan: Path, chunk: int, rank: int) -> tuple[int, int]:
    """(offset, size) of one rank's block, from its chunk directory."""
    directory = layout(plan)["chunks"][chunk][2]
    with open(plan, "rb") as f:
        f.seek(directory + 24 * rank)
        offset, size = struct.unpack("<QQ", f.read(16))
    return offset, size


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def same_size_edit(path: Path, offset: int) -> None:
    """Change one byte, keeping the size and the mtime: only a content check can tell."""
    st = path.stat()
    flip(path, offset)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def copy_index(pristine: Path, tmp_path: Path) -> Path:
    target = tmp_path / "index"
    shutil.copytree(pristine / "index", target)
    return target


def edit_manifest(index: Path, change) -> None:
    """Edit the index's manifest, written back as VERSION 1 (file entries inline, so a
    change can reach one file's entry)."""
    data = manifest_with_files(index)
    change(data)
    write_v1(index, data)
