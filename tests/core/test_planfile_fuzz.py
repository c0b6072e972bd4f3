"""Fuzzing the plan reader: a mutated plan file reads back exactly as the original, or raises
MdsError. Never another exception, never a hang, never a large allocation.

The plan is the sample data's (4 chunks x 4 DP ranks, 5 sections). Mutations are either
plain byte edits, which every checksum in the chain must catch, or *forged* files: an edit
followed by recomputing the checksums above it (footer, directory, block), so the layout
validation behind the checksums is what answers. A forged file is a different plan: when it
is accepted, what it returns must at least be self-consistent (counts match ids, sections
match their shapes, the chunks tile the steps), and the executor must still either work or
raise MdsError.

Each test runs a fixed number of examples (`EXAMPLES`, reported by `-s`) under a deadline and
a SIGALRM watchdog, so a hang fails instead of stalling CI.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import struct
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from executor_builders import open_executor, rewrite_plan, sample_plan
from fuzzing import DEEP, Tally, edit, paths_of, watchdog
from fuzzing import fuzz as fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from planfile_builders import footer_json, footer_text, stored_footer

from mds.core.planfile import MAGIC, RankChunk, checksum
from mds.core.planfile_reader import PlanReader
from mds.errors import MdsError, PlanError

TRAILER = struct.Struct("<QQ8s8s")
DIR_ENTRY = struct.Struct("<QQ8s")
MEMORY_LIMIT = 32 << 20  # traced bytes per read; the plan file is ~30 KB
EXAMPLES = {
    "bytes": 600,
    "footer_text": 200,
    "forged_footer": 600,
    "forged_footer_bytes": 300,
    "forged_blocks": 400,
    "executor": 100,
}


def fuzz(test: str):
    return fuzz_settings(EXAMPLES[test])


@contextlib.contextmanager
def bounded_memory(limit: int = MEMORY_LIMIT):
    """Fail if the body's traced allocations (Python and numpy) peak above `limit`."""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= limit, f"reading a forged plan allocated {peak} bytes"


# --- reading a plan completely ------------------------------------------------------------------


@dataclass(frozen=True)
class Contents:
    """Everything a reader returns for a plan, as plain comparable values."""

    shape: tuple[int, int, int]  # dp_size, micro_batches, id_width
    chunks: tuple[tuple[int, int], ...]
    # chunk, rank, counts shape, counts, ids, fetch records (columns and file records)
    blocks: tuple[tuple[int, int, tuple[int, ...], bytes, bytes, bytes], ...]
    sections: tuple[tuple[str, str, tuple[int, ...], bytes], ...]


def read_all(path: Path) -> Contents:
    """Open the plan and read every (chunk, rank) block and every section; assert that each
    answer is self-consistent (whatever the footer claims)."""
    with PlanReader(path) as r:
        assert isinstance(r.dp, int) and isinstance(r.micro, int) and 1 <= r.id_width <= 8
        chunks = tuple((a, b) for a, b, *_ in r.chunks)
        # The executor finds a step's chunk by bisection: the chunks must tile [0, steps).
        assert [a for a, _ in chunks] == [0, *(b for _, b in chunks)][: len(chunks)], chunks
        blocks = []
        for c, (a, b) in enumerate(chunks):
            for rank in range(r.dp):
                block = r.rank_chunk(c, rank)
                assert block.step_start == a
                assert block.counts.shape == (b - a, r.micro)
                assert block.counts.dtype == np.int64 and block.counts.min(initial=0) >= 0
                assert block.ids.dtype == np.dtype("<u8")
                assert int(block.counts.sum()) == len(block.ids)
                if r.id_width < 8:
                    assert int(block.ids.max(initial=0)) < 1 << (8 * r.id_width)
                fetch = block.fetch
                assert all(len(col) == len(block.ids) for col in fetch.columns())
                assert all(fetch.file < len(fetch.files)) and isinstance(fetch.files, list)
                records = b"".join(col.astype("<u8").tobytes() for col in fetch.columns())
                records += json.dumps(fetch.files, sort_keys=True).encode()
                blocks.append(
                    (
                        c,
                        rank,
                        block.counts.shape,
                        block.counts.tobytes(),
                        block.ids.tobytes(),
                        records,
                    )
                )
        sections = []
        for name in sorted(r.sections):
            array = r.section(name)
            meta = r.sections[name]
            packed = meta.get("codec", "raw") != "raw"  # format 3: a zstd frame of its bytes
            assert packed or array.nbytes == int(meta["size"])
            assert array.dtype.kind in "biuf"
            assert math.prod(array.shape) * array.itemsize == array.nbytes
            sections.append((name, array.dtype.str, array.shape, array.tobytes()))
        for step in {0, r.steps // 2, r.steps - 1} if r.steps else ():
            a, b = chunks[r.chunk_of(step)]
            assert a <= step < b
        return Contents((r.dp, r.micro, r.id_width), chunks, tuple(blocks), tuple(sections))


def outcome(path: Path, test: str, *, memory: bool = False) -> Contents | MdsError:
    """`read_all`, or the MdsError it raised. Any other exception propagates (a bug)."""
    with watchdog(), bounded_memory() if memory else contextlib.nullcontext():
        try:
            result: Contents | MdsError = read_all(path)
        except MdsError as exc:
            result = exc
    count(test, isinstance(result, MdsError))
    return result


# --- the plan under test ------------------------------------------------------------------------


class Original:
    """The intact plan: its bytes, footer, contents and the byte range of each structure
    (a plain class: hypothesis prints its short repr, not the bytes, for a failing example)."""

    def __init__(self, path: Path):
        self.path = path
        self.data = data = path.read_bytes()
        self.footer_offset, self.footer_size, _, _ = TRAILER.unpack(data[-TRAILER.size :])
        # The footer's JSON (the file stores it in a zstd frame): what the footer tests edit.
        self.footer_text = footer_text(data)[1]
        self.footer: dict[str, Any] = json.loads(self.footer_text)
        self.contents = read_all(path)
        self.regions = regions_of(data)  # (name, start, end exclusive)
        # Strategies over this file, built once (building them per example is the slow part).
        self.position = target(self)
        self.byte_ops = byte_ops(self.position)
        self.footer_edit = footer_edit(self)
        self.layout_edit = footer_edit(self, layout_only=True)

    def __repr__(self) -> str:
        return f"Original({self.path})"


def regions_of(data: bytes) -> tuple[tuple[str, int, int], ...]:
    """Byte ranges of every structure in the file, parsed by hand (not with PlanReader)."""
    offset, size, _, _ = TRAILER.unpack(data[-TRAILER.size :])
    layout = footer_json(data)["layout"]
    dp = layout["dp_size"]
    out = [
        ("header", 0, 16),
        ("trailer", len(data) - TRAILER.size, len(data)),
        ("footer", offset, offset + size),
    ]
    for c, (_a, _b, dir_offset, _sum, _w) in enumerate(layout["chunks"]):
        # Format 3: dp blocks, then the chunk's file table.
        out.append((f"directory {c}", dir_offset, dir_offset + DIR_ENTRY.size * (dp + 1)))
        for r in range(dp + 1):
            off, n, _ = DIR_ENTRY.unpack_from(data, dir_offset + DIR_ENTRY.size * r)
            out.append((f"block {c}/{r}" if r < dp else f"file table {c}", off, off + n))
    for name, meta in layout["sections"].items():
        out.append((f"section {name}", meta["offset"], meta["offset"] + meta["size"]))
    return tuple(out)


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Original:
    _, plan = sample_plan(tmp_path_factory)
    original = Original(plan)
    shape, chunks, sections = (
        original.contents.shape,
        original.contents.chunks,
        original.contents.sections,
    )
    assert len(chunks) >= 3 and shape[0] >= 3 and len(sections) >= 3
    assert all(end > start for _, start, end in original.regions)
    return original


class ScratchFile(os.PathLike):
    """One file rewritten by every example, in place: re-creating it with O_TRUNC costs
    milliseconds on ext4 (it flushes the old data), more than the read under test."""

    def __init__(self, path: Path):
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def write_bytes(self, data: bytes) -> None:
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def close(self) -> None:
        os.close(self._fd)

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"ScratchFile({self.path})"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    scratch = ScratchFile(tmp_path_factory.mktemp("fuzz") / "plan.mds")
    yield scratch
    scratch.close()


TALLY = Tally("plan")
count = TALLY.count

report_counts = TALLY.fixture()


# --- mutations ----------------------------------------------------------------------------------


def target(original: Original) -> st.SearchStrategy[int]:
    """A byte position: anywhere, or inside one of the file's structures."""
    n = len(original.data)
    inside = st.sampled_from(original.regions).flatmap(lambda r: st.integers(r[1], r[2] - 1))
    return st.one_of(st.integers(0, n - 1), inside, inside)


def byte_ops(positions: st.SearchStrategy[int]) -> st.SearchStrategy[list[tuple]]:
    op = st.one_of(
        st.tuples(st.just("flip"), positions, st.integers(1, 255)),
        st.tuples(st.just("set"), positions, st.binary(min_size=1, max_size=9)),
        st.tuples(st.just("insert"), positions, st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("delete"), positions, st.integers(1, 64)),
        st.tuples(st.just("truncate"), positions),
        st.tuples(st.just("extend"), st.binary(min_size=1, max_size=64)),
    )
    return st.lists(op, min_size=1, max_size=3)


def apply_ops(data: bytes, ops: list[tuple]) -> bytes:
    out = bytearray(data)
    for kind, *args in ops:
        at = min(args[0], len(out)) if kind != "extend" else 0
        if kind == "flip" and at < len(out):
            out[at] ^= args[1]
        elif kind == "set":
            out[at : at + len(args[1])] = args[1]
        elif kind == "insert":
            out[at:at] = args[1]
        elif kind == "delete":
            del out[at : at + args[1]]
        elif kind == "truncate":
            del out[at:]
        elif kind == "extend":
            out += args[0]
    return bytes(out)


def with_footer(data: bytes, offset: int, footer: bytes, *, rechecksum: bool = True) -> bytes:
    """`data` up to `offset`, then the footer JSON `footer` as stored (a zstd frame) and a
    trailer: valid for it, or the old one."""
    footer = stored_footer(footer)
    trailer = (
        TRAILER.pack(offset, len(footer), checksum(footer), MAGIC)
        if rechecksum
        else data[-TRAILER.size :]
    )
    return data[:offset] + footer + trailer


INTERESTING = st.one_of(
    st.sampled_from(
        [0, 1, -1, 2, 3, 8, 9, 255, 256, 1 << 31, 1 << 32, 1 << 40, 1 << 53]
        + [(1 << 63) - 1, 1 << 63, 1 << 64, -(1 << 63), 10**30, -(10**30)]
    ),
    st.sampled_from([0.5, -0.0, 1e308, float("nan"), float("inf"), float("-inf")]),
    st.sampled_from(
        ["", "|O", "O", "<i8", "<f8", ">i8", "|u1", "<u2", "V0", "V8", "S0", "<U4", "<M8"]
        + ["(2,3)<i8", "(4,)<f8", "i8,O", "i8,i8", "zz", "00" * 8, "ff" * 8, "a" * 5000]
        + ["../x", "/etc/passwd", "\x00", "\ud800", "1e999", "NaN"]
    ),
    st.sampled_from([None, True, False, [], {}, [0], [[]], {"a": 1}, [1, 2, 3, 4, 5], DEEP]),
    st.sampled_from([[1 << 40], [-1, 90], [-10, -9], [1 << 32, 1 << 32, 9], [0, 1 << 62]]),
    st.sampled_from([[0, 0, 0, "00" * 8, 1], [0, 1 << 62, 16, "00" * 8, 1]]),
    st.integers(),
    st.text(max_size=12),
)


def footer_edit(original: Original, layout_only: bool = False) -> st.SearchStrategy[tuple]:
    """One structural edit of the footer JSON, mostly inside `layout`."""
    layout = [("layout", *p) for p in paths_of(original.footer["layout"])]
    layout.append(("layout",))
    everything = paths_of(original.footer)
    where = st.sampled_from(layout)
    if not layout_only:
        where = st.one_of(where, where, st.sampled_from(everything))
    return st.one_of(
        st.tuples(st.just("replace"), where, INTERESTING),
        st.tuples(st.just("shift"), where, st.integers(-4096, 4096).filter(bool)),
        st.tuples(st.just("scale"), where, st.sampled_from([2, 3, 1 << 20, 1 << 40, -1])),
        st.tuples(st.just("delete"), where),
        st.tuples(st.just("duplicate"), where),
        st.tuples(st.just("swap"), where, st.integers(0, 8)),
        st.tuples(st.just("reverse"), where),
    )


def encode(footer: dict[str, Any]) -> bytes:
    text = json.dumps(footer, sort_keys=True, separators=(",", ":"))
    return text.replace(json.dumps(DEEP), "[" * 100_000 + "]" * 100_000).encode(
        "utf-8", "surrogatepass"
    )


# --- the contract -------------------------------------------------------------------------------


def assert_original_or_error(result: Contents | MdsError, original: Original) -> None:
    if not isinstance(result, MdsError):
        assert result == original.contents, "a corrupt plan read back different data"


@fuzz("bytes")
@given(data=st.data())
def test_byte_mutations_are_caught_or_harmless(original, scratch, data):
    """Flipped, overwritten, inserted and deleted bytes anywhere (header, trailer, footer,
    directories, blocks, sections), truncation and trailing junk: every byte the reader uses
    is checksummed, so the plan reads exactly as before or raises MdsError."""
    ops = data.draw(original.byte_ops)
    scratch.write_bytes(apply_ops(original.data, ops))
    test = "bytes"
    assert_original_or_error(outcome(scratch, test), original)


NUMBER = re.compile(rb"-?\d+")


@fuzz("footer_text")
@given(data=st.data())
def test_spliced_footer_numbers_fail_the_footer_checksum(original, scratch, data):
    """A number in the footer replaced by a huge or negative one, trailer left as written (a
    stale footer size, or the size of the new footer): the footer checksum catches it."""
    footer = original.footer_text
    spans = [m.span() for m in NUMBER.finditer(footer)]
    start, end = data.draw(st.sampled_from(spans))
    value = data.draw(st.sampled_from([-1, -(1 << 63), 1 << 40, 1 << 64, 10**40, 0]))
    new = stored_footer(footer[:start] + str(value).encode() + footer[end:])
    fixed_size = data.draw(st.booleans())
    trailer = original.data[-TRAILER.size :]
    if fixed_size:  # the trailer claims the new size, but keeps the old checksum
        trailer = TRAILER.pack(original.footer_offset, len(new), trailer[16:24], MAGIC)
    scratch.write_bytes(original.data[: original.footer_offset] + new + trailer)
    test = "footer_text"
    result = outcome(scratch, test)
    if new != stored_footer(footer):
        assert isinstance(result, MdsError), result


@fuzz("forged_footer")
@given(data=st.data())
def test_forged_footers_are_refused_or_consistent(original, scratch, data):
    """Structural edits of the footer JSON (huge, negative, NaN or wrongly typed values,
    missing keys, reordered or duplicated chunks, dtypes with objects, overflowing shapes,
    deep nesting) with a recomputed trailer checksum: the layout validation behind the
    checksum refuses it, or what is read is self-consistent; no large allocation."""
    changes = data.draw(st.lists(original.footer_edit, min_size=1, max_size=3))
    footer = original.footer
    for change in changes:
        try:
            footer = edit(footer, change)
        except (KeyError, IndexError, TypeError):  # the path vanished in an earlier edit
            pass
    raw = encode(footer)
    scratch.write_bytes(with_footer(original.data, original.footer_offset, raw))
    test = "forged_footer"
    result = outcome(scratch, test, memory=True)
    if json.dumps(footer.get("layout"), sort_keys=True) == json.dumps(
        original.footer["layout"], sort_keys=True
    ):
        assert_original_or_error(result, original)


@fuzz("forged_footer_bytes")
@given(data=st.data())
def test_forged_footer_bytes_are_refused_or_consistent(original, scratch, data):
    """Byte edits inside the footer (broken JSON, invalid UTF-8, other types) with a
    recomputed trailer checksum."""
    footer = original.footer_text
    positions = st.integers(0, len(footer) - 1)
    raw = data.draw(
        st.one_of(
            byte_ops(positions).map(lambda ops: apply_ops(footer, ops)),
            st.sampled_from(
                [b"", b"null", b"[]", b"1", b'"layout"', b"{}", b'{"layout":[]}', b"\xff"]
                + [b'{"layout":{"chunks":[],"sections":[]}}', b"[" * 200_000, b"1" * 5000]
                + [b'{"layout":{"dp_size":1,"micro_batches":1,"id_width":1,"chunks":{}}}']
            ),
        )
    )
    scratch.write_bytes(with_footer(original.data, original.footer_offset, raw))
    test = "forged_footer_bytes"
    result = outcome(scratch, test, memory=True)
    if raw == footer:
        assert_original_or_error(result, original)


def forge_block(original: Original, c: int, r: int, block: bytes, entry: tuple | None) -> bytes:
    """The plan with (chunk c, rank r)'s directory entry replaced, every checksum above it
    recomputed. `entry` (offset, size) points anywhere; None appends `block` and points at it."""
    data = bytearray(original.data[: original.footer_offset])
    footer = json.loads(json.dumps(original.footer))
    chunk = footer["layout"]["chunks"][c]
    dir_offset = chunk[2]
    if entry is None:
        offset, size = len(data), len(block)
        data += block
    else:
        offset, size = entry
    end = offset + size
    pointed = original.data[offset:end] if 0 <= offset and end <= len(data) else block
    at = dir_offset + DIR_ENTRY.size * r
    data[at : at + DIR_ENTRY.size] = DIR_ENTRY.pack(offset, size, checksum(pointed))
    directory = data[dir_offset : dir_offset + DIR_ENTRY.size * (original.contents.shape[0] + 1)]
    chunk[3] = checksum(directory).hex()
    raw = json.dumps(footer, sort_keys=True, separators=(",", ":")).encode()
    return with_footer(bytes(data), len(data), raw)


@fuzz("forged_blocks")
@given(data=st.data())
def test_forged_blocks_are_refused_or_consistent(original, scratch, data):
    """A rank block or a chunk's file table edited (counts that do not add up, a packed frame
    cut, extended or changed), or a directory entry pointing anywhere (another block, the
    footer, outside the file, huge sizes), with the block, directory and footer checksums
    recomputed: the block validation refuses it, or the block is self-consistent."""
    dp = original.contents.shape[0]
    c = data.draw(st.integers(0, len(original.contents.chunks) - 1))
    r = data.draw(st.integers(0, dp))  # dp: the chunk's file table
    name = f"block {c}/{r}" if r < dp else f"file table {c}"
    start, end = next((s, e) for n, s, e in original.regions if n == name)
    block = original.data[start:end]
    if data.draw(st.booleans()):
        ops = data.draw(byte_ops(st.integers(0, len(block) - 1)))
        scratch.write_bytes(forge_block(original, c, r, apply_ops(block, ops), None))
    else:
        n = len(original.data)
        region = data.draw(st.sampled_from(original.regions))
        anywhere = st.tuples(st.integers(0, n), st.integers(0, n))
        huge = st.tuples(
            st.sampled_from([0, 16, n - 1, n, 1 << 40, (1 << 64) - 1]),
            st.sampled_from([0, 1, 1 << 40, (1 << 64) - 1 - n]),
        )
        offset, size = data.draw(
            st.one_of(st.just((region[1], region[2] - region[1])), anywhere, huge)
        )
        entry = (offset, min(size, (1 << 64) - 1 - offset))  # the u64 fields must hold it
        scratch.write_bytes(forge_block(original, c, r, block, entry))
    test = "forged_blocks"
    outcome(scratch, test, memory=True)


# --- the executor on mutated plans --------------------------------------------------------------


class PlannedIds(dict):
    def __repr__(self) -> str:
        return f"PlannedIds(ranks={len(self)})"


@pytest.fixture(scope="module")
def planned_ids(original) -> dict[int, list[bytes]]:
    """Every rank's sample ids of every (step, micro-batch), from the intact plan."""
    out = PlannedIds()
    for rank in range(original.contents.shape[0]):
        with open_executor(original.path, rank, verify="none") as ex:
            out[rank] = [
                ex.sample_ids(s, m).tobytes()
                for s in range(ex.steps)
                for m in range(ex.micro_batches)
            ]
    return out


@fuzz("executor")
@given(data=st.data())
def test_executor_on_mutated_plans(original, scratch, planned_ids, data):
    """PlanExecutor on a mutated plan (byte edits, or a forged layout): construction and
    `sample_ids` of every step give this rank's original ids, or raise MdsError. A forged
    layout may be accepted with other ids; it must still not raise anything else."""
    forged = data.draw(st.booleans())
    if forged:
        footer = original.footer
        try:
            footer = edit(footer, data.draw(original.layout_edit))
        except (KeyError, IndexError, TypeError):
            pass
        mutated = with_footer(original.data, original.footer_offset, encode(footer))
    else:
        mutated = apply_ops(original.data, data.draw(original.byte_ops))
    scratch.write_bytes(mutated)
    rank = data.draw(st.integers(0, original.contents.shape[0] - 1))
    with watchdog():
        try:
            got = executor_ids(scratch, rank)
        except MdsError:
            count("executor", True)
            return
    count("executor", False)
    if not forged:
        assert got == planned_ids[rank]


def executor_ids(plan: os.PathLike, rank: int) -> list[bytes]:
    """Every (step, micro-batch)'s sample ids of `rank`, and the first micro-batch built
    (which places the ids in the plan's sources: a forged id beyond them is a PlanError,
    "corrupt plan")."""
    with open_executor(plan, rank, verify="none") as ex:
        got = [
            ex.sample_ids(s, m).tobytes()
            for s in range(min(ex.steps, 10_000))
            for m in range(ex.micro_batches)
        ]
        if ex.total:
            batch = ex.micro_batch_at(0)
            assert batch["sample_id"].numpy().astype("<u8").tobytes() == got[0]
    return got


# --- what the fuzzing found -----------------------------------------------------------------------


def forged_footer(original: Original, scratch: ScratchFile, change) -> None:
    footer = json.loads(json.dumps(original.footer))
    change(footer)
    scratch.write_bytes(with_footer(original.data, original.footer_offset, encode(footer)))


def section(name: str, **meta: Any):
    return lambda f: f["layout"]["sections"][name].update(meta)


# Forged footers that passed the old layout checks; the comment says what happened before.
FOUND = {
    # accepted; PlanExecutor.sample_ids then indexed its block with a negative position
    # (IndexError, or silently another step's ids)
    "chunks reversed": (lambda f: f["layout"]["chunks"].reverse(), "bad layout"),
    "first chunk missing": (lambda f: f["layout"]["chunks"].pop(0), "bad layout"),
    "overlapping chunks": (lambda f: f["layout"]["chunks"][1].__setitem__(0, 8), "bad layout"),
    # OverflowError: cannot convert float infinity to integer
    "chunk end Infinity": (
        lambda f: f["layout"]["chunks"][0].__setitem__(1, float("inf")),
        "corrupt plan footer",
    ),
    "section shape Infinity": (section("stats", shape=[float("inf")]), "corrupt plan footer"),
    # RecursionError in json.loads
    "deep nesting": (lambda f: f.update(config=DEEP), "corrupt plan footer"),
    # ValueError: cannot reshape (a sub-array dtype of the right total size)
    "sub-array dtype": (section("stats", dtype="(9,)<i8", shape=[64]), "corrupt shape or dtype"),
    # ValueError: can only specify one unknown dimension (product of two negatives)
    "negative shape": (section("stats", shape=[-64, -9]), "corrupt shape"),
    # accepted: the section came back as datetimes / strings
    "datetime dtype": (section("stats", dtype="<M8"), "corrupt shape or dtype"),
    "string dtype": (section("stats", dtype="<U2"), "corrupt shape or dtype"),
}


SECTIONS_ONLY = {"section shape Infinity", "sub-array dtype", "negative shape"}
SECTIONS_ONLY |= {"datetime dtype", "string dtype"}  # the executor never reads sections


@pytest.mark.parametrize("case", sorted(FOUND))
def test_forged_footers_that_crashed_the_reader(original, scratch, case):
    change, message = FOUND[case]
    forged_footer(original, scratch, change)
    result = outcome(scratch, "found")
    assert isinstance(result, PlanError) and message in str(result), result
    if case not in SECTIONS_ONLY:
        with pytest.raises(PlanError, match=re.escape(message)):
            executor_ids(scratch, 0)


@pytest.mark.parametrize(
    "change",
    [
        section("stats", size=1 << 40, shape=[1 << 37]),
        section("stats", offset=(1 << 64) - 8, size=1 << 40),
        lambda f: f["layout"].update(dp_size=1 << 40),
        lambda f: f["layout"].update(micro_batches=1 << 40),
        lambda f: f["layout"]["chunks"][0].__setitem__(1, 1 << 62),
    ],
    ids=["section", "section at 2^64", "dp_size", "micro_batches", "chunk steps"],
)
def test_huge_claims_allocate_nothing(original, scratch, change):
    """A footer claiming 2^40 bytes of something is refused before anything is allocated."""
    forged_footer(original, scratch, change)
    assert isinstance(outcome(scratch, "found", memory=True), PlanError)


def test_a_forged_id_beyond_the_index_is_a_corrupt_plan(original, tmp_path):
    """A block naming a sample id past every source's rows, checksums valid: the executor
    places ids with the plan's own source table, so this is a corrupt plan."""
    rows = sum(int(s["rows"]) for s in original.footer["index"]["sources"])
    beyond = (1 << (8 * original.contents.shape[2])) - 1
    assert beyond >= rows

    def block(c: int, r: int, got: RankChunk) -> RankChunk | None:
        if (c, r) != (0, 0):
            return None
        ids = got.ids.copy()
        ids[0] = beyond
        return dataclasses.replace(got, ids=ids)

    forged = rewrite_plan(original.path, tmp_path / "forged.mds", block=block)
    with pytest.raises(PlanError, match=r"corrupt plan \(a sample"):
        executor_ids(forged, 0)
