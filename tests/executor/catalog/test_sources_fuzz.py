"""Fuzzing the plan's fetch records, the executor's only way to the data: a plan whose rank
blocks carry mutated fetch records, or whose footer carries a mutated `fetch` section, is
replayed either with exactly the original batches or with an MdsError. Never another
exception, never a hang, never a file opened outside the data root.

The world is tiny and real: Parquet in two files (several row groups), JSONL and Megatron,
all token ids, so a whole rank replays in milliseconds. Every mutated plan is *forged*: its
blocks are read and written back with valid checksums (`rewrite_plan`), so the executor's
own checks of the records are what answers, in each verify mode (stat, full, none).

A forged plan is a different plan. Records the executor cannot check against the data
(another row, file, token count or byte range, another file index, and with verify="none"
another path) may replay other batches; those edits must still raise nothing but MdsError.
Every other edit (file-record values checked against the files, source indices, the footer's
root, formats, payloads and length rules) must replay the original batches or be refused.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from executor_builders import batch_digest, rewrite_plan, tiny_data
from fuzzing import Tally, Tripwire, edit, paths_of, watchdog
from fuzzing import fuzz as fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from plan_builders import index_data, plan_config

from mds.core.planfile import FETCH_COLUMNS, Fetch, RankChunk
from mds.core.planfile_reader import PlanReader
from mds.errors import (
    ConfigError,
    DataChangedError,
    MdsError,
    PlanError,
    SourceDataError,
)
from mds.executor import PlanExecutor
from mds.planner.plan.fetch import FILE_KEYS

EXAMPLES = {"blocks": 300, "footer": 150}
VERIFY = ("stat", "full", "none")
# Edits the executor cannot tell from another plan: they may replay other batches.
TRUSTED = ("column", "file", "swap", "duplicate")


def fuzz(test: str):
    return fuzz_settings(EXAMPLES[test])


TALLY = Tally("fetch records")
count = TALLY.count

report_counts = TALLY.fixture()


# --- the world under test -----------------------------------------------------------------------


class World:
    """The intact data, index and plan, every rank's blocks and batch digests, and a scratch
    plan path rewritten per example."""

    def __init__(self, base: Path):
        from mds.planner.plan.build import build_plan

        self.base = base
        self.root = base / "data"
        config = tiny_data(self.root)
        index_data(self.root, config)
        self.plan = base / "plan.mds"
        build_plan(plan_config(self.root, config), self.plan, workers=1)
        with PlanReader(self.plan) as reader:
            self.dp = reader.dp
            self.chunks = len(reader.chunks)
            self.footer = json.loads(json.dumps(reader.footer))
            self.blocks = {
                (c, r): reader.rank_chunk(c, r) for c in range(self.chunks) for r in range(self.dp)
            }
        self.digests = {rank: replay(self.plan, rank, "stat") for rank in range(self.dp)}
        self.scratch = base / "scratch.mds"
        self.outside = base / "plan.mds"  # a real file outside the data root
        self.fifo = self.root / "fifo"  # opening it for reading blocks until a writer comes
        os.mkfifo(self.fifo)
        # Outside the root, a FIFO that records any open (a link in the root leads to it).
        self.secret = base / "secret"
        os.mkfifo(self.secret)
        (self.root / "secret.parquet").symlink_to(self.secret)

    def __repr__(self) -> str:  # hypothesis prints fixtures of a failing example
        return f"World({self.root})"

    def records(self) -> list[dict[str, Any]]:
        return [e for b in self.blocks.values() for _, _, e in b.fetch.files]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    world = World(tmp_path_factory.mktemp("sources-fuzz"))
    world.block_edits = block_edit_strategy(world)
    world.footer_edits = footer_edit_strategy(world)
    return world


def replay(plan: Path, rank: int, verify: str) -> list[str]:
    with PlanExecutor(plan, rank, verify=verify) as ex:
        return [batch_digest(b) for b in ex]


def test_the_world_replays(world):
    assert world.dp == 2 and world.chunks == 3
    fmts = {f["format"] for f in world.footer["fetch"]["sources"].values()}
    assert fmts == {"parquet", "jsonl", "megatron"}
    for rank, digests in world.digests.items():
        assert len(digests) == 16
        for verify in VERIFY:
            assert replay(world.plan, rank, verify) == digests
    # A rewrite without edits is the same plan, batch for batch.
    rewrite_plan(world.plan, world.scratch)
    assert replay(world.scratch, 1, "full") == world.digests[1]


# --- mutations ----------------------------------------------------------------------------------


def interesting(world: World) -> st.SearchStrategy[Any]:
    """Values to put anywhere: wrong types, extremes, and paths that leave the root."""
    paths = sorted({e["path"] for e in world.records()} | {"math/doc.idx"})
    outside = os.path.relpath(world.outside, world.root)
    secret = [os.path.relpath(world.secret, world.root), str(world.secret), "secret.parquet"]
    return st.one_of(
        st.sampled_from(
            [0, 1, -1, 2, 13, 14, 15, 1 << 31, 1 << 63, 1 << 64, -(1 << 63), 10**30, True]
        ),
        st.sampled_from([0.5, -0.0, 1e308, float("nan"), float("inf"), float("-inf")]),
        st.sampled_from([None, False, [], {}, [0], {"a": 1}, [None]]),
        st.sampled_from(paths + [outside, str(world.outside), str(world.root / paths[0])]),
        st.sampled_from(secret + ["web/../secret.parquet", "./secret.parquet"]),
        st.sampled_from(
            ["", ".", "..", "/", "../" * 5 + "etc/passwd", "/etc/passwd", "web/../" + paths[0]]
            + ["./" + paths[0], paths[0] + "\x00", "index", "index/manifest.json", "web/.."]
            + ["a" * 5000, "é" * 300, "\ud800", "NaN", "blake2b:" + "0" * 32, "sampled:00"]
            + ["full:00", "sampled:", "parquet", "megatron", "/dev/zero", "/proc/self/mem"]
            + ["loop", "loop/web/part-0.parquet", "out.parquet", "web", "math", "\\..\\x"]
        ),
        st.integers(),
        st.text(max_size=10),
    )


def column_value(n: int) -> st.SearchStrategy[int]:
    """A value a fetch column can hold (unsigned, at most 8 bytes)."""
    return st.one_of(
        st.sampled_from([0, 1, 2, 5, 13, 14, 16, 17, 100, 255, 256, 1 << 31, 1 << 32]),
        st.sampled_from([(1 << 62) + 1, 1 << 63, (1 << 63) + 1, (1 << 64) - 1]),
        st.integers(0, max(n, 1) * 2),
        st.integers(0, (1 << 64) - 1),
    )


def block_edit_strategy(world: World) -> st.SearchStrategy[tuple]:
    """One edit of a block's fetch records; indexes are taken modulo the block's sizes."""
    values = interesting(world)
    ints = st.one_of(
        st.sampled_from([-1, 0, 1, 2, 3, 1 << 31, 1 << 32, 1 << 63, 10**30, -(10**30)]),
        st.integers(),
    )
    index = st.integers(0, 63)
    key = st.sampled_from(FILE_KEYS + ("first_row", "rows", ""))
    return st.one_of(
        st.tuples(st.just("entry"), index, key, values),
        st.tuples(st.just("entry"), index, st.sampled_from(("path", "index_path")), values),
        st.tuples(st.just("unset"), index, key),
        st.tuples(st.just("record"), index, values),
        st.tuples(st.just("source"), index, ints),
        st.tuples(st.just("drop"), index),
        st.tuples(st.just("file"), index, ints),
        st.tuples(st.just("swap"), index, index),
        st.tuples(st.just("duplicate"), index),
        st.tuples(st.just("column"), st.sampled_from(FETCH_COLUMNS), index, column_value(64)),
    )


def apply_block_edits(block: RankChunk, edits: list[tuple]) -> RankChunk:
    """The block with its fetch records edited (a deep copy; the original is untouched)."""
    rec = block.fetch
    columns = {name: np.array(getattr(rec, name), dtype=np.uint64) for name in FETCH_COLUMNS}
    files = [[s, f, json.loads(json.dumps(e))] for s, f, e in rec.files]
    n = len(block.ids)
    for kind, *args in edits:
        if kind == "column":
            name, k, value = args
            if n:
                columns[name][k % n] = value
            continue
        if not files:
            continue
        i = args[0] % len(files)
        entry = files[i][2]
        # a drawn value is installed as a copy: hypothesis hands the same object to several
        # edits, and one edited in place could come to hold itself
        if kind == "entry" and isinstance(entry, dict):
            entry[args[1]] = copy.deepcopy(args[2])
        elif kind == "unset" and isinstance(entry, dict):
            entry.pop(args[1], None)
        elif kind == "record":
            files[i][2] = copy.deepcopy(args[1])
        elif kind == "source":
            files[i][0] = args[1]
        elif kind == "file":
            files[i][1] = args[1]
        elif kind == "drop":
            del files[i]
        elif kind == "swap":
            j = args[1] % len(files)
            files[i], files[j] = files[j], files[i]
        elif kind == "duplicate":
            files.append(json.loads(json.dumps(files[i])))
    fetch = Fetch(**columns, files=[tuple(f) for f in files])
    return dataclasses.replace(block, fetch=fetch)


def trusted(edits: list[tuple], verify: str) -> bool:
    """Whether the edits may legitimately replay other batches (see the module docstring)."""
    return any(
        kind in TRUSTED
        or (kind == "entry" and verify == "none" and args[1] in ("path", "index_path"))
        for kind, *args in edits
    )


def footer_values(world: World) -> st.SearchStrategy[Any]:
    root = world.root
    roots = [str(root.parent), "/", "data", str(root / "web"), f"{root}/", f"{root}/."]
    roots += [str(root / "loop"), str(root / "missing"), str(root / "out.parquet"), "", "."]
    facts = list(world.footer["fetch"]["sources"].values())
    return st.one_of(
        interesting(world),
        st.sampled_from(roots),
        st.sampled_from(facts + [f["payload"] for f in facts] + [f["length"] for f in facts]),
        st.sampled_from(["parquet", "jsonl", "jsonl.zst", "arrow", "megatron", "csv"]),
        st.sampled_from(
            [{"kind": "text", "column": "tokens"}, {"kind": "token_ids"}, {"kind": None}]
            + [{"kind": "token_ids", "column": "ids"}, {"kind": "token_ids", "column": ""}]
            + [{"kind": "token_ids", "column": ["tokens"]}, {"kind": "text", "column": "ids"}]
            + [{"kind": "tokenizer", "exact": True, "tokenizer": "loop"}, {"exact": "yes"}]
            + [{"kind": "estimate", "exact": False}, {"exact": True}, {"exact": 0}]
            + [{"kind": "tokenizer", "exact": True, "tokenizer": "/dev/zero"}]
        ),
    )


def footer_edit_strategy(world: World) -> st.SearchStrategy[list[tuple]]:
    """One to three structural edits of the footer's `fetch` section."""
    fetch = world.footer["fetch"]
    where = st.sampled_from([("fetch",), *(("fetch", *p) for p in paths_of(fetch))])
    names = sorted(fetch["sources"])
    one = st.one_of(
        st.tuples(st.just("replace"), where, footer_values(world)),
        st.tuples(st.just("delete"), where),
        st.tuples(st.just("rekey"), where, st.sampled_from([*names, "", "Web", "index"])),
        st.tuples(
            st.just("replace"),
            st.sampled_from([("fetch", "sources", n, "format") for n in names]),
            st.sampled_from(["parquet", "jsonl", "jsonl.zst", "arrow", "megatron"]),
        ),
    )
    return st.lists(one, min_size=1, max_size=3)


def apply_footer_edits(footer: dict[str, Any], edits: list[tuple]) -> None:
    edited = footer
    for change in edits:
        try:
            edited = edit(edited, change)
        except (KeyError, IndexError, TypeError):  # the path vanished in an earlier edit
            pass
    footer.clear()
    footer.update(edited)


# --- the contract -------------------------------------------------------------------------------


def check_replay(world: World, test: str, rank: int, verify: str, strict: bool) -> None:
    """The forged plan replays (the original batches, if `strict`), or raises MdsError; the
    file outside the root is never opened."""
    tripwire = Tripwire(world.secret)
    try:
        with watchdog():
            try:
                got = replay(world.scratch, rank, verify)
            except MdsError:
                got = None
    finally:
        assert not tripwire.close(), "a file outside the data root was opened"
    count(test, got is None)
    if got is None:
        return
    if strict:
        assert got == world.digests[rank], "forged fetch records replayed other batches"
    else:
        assert len(got) == len(world.digests[rank])


@fuzz("blocks")
@given(data=st.data())
def test_forged_fetch_records(world, data):
    """One or more of a rank's blocks with edited fetch records: file-record values (paths out
    of the root, absolute, `..`, through a symlink loop or a link out of the root, wrong
    types, huge or negative numbers, NaN), source and file indices out of range, records
    dropped, swapped or duplicated, and per-sample columns (file, row, tokens, byte range)."""
    rank = data.draw(st.integers(0, world.dp - 1))
    verify = data.draw(st.sampled_from(VERIFY))
    chosen = data.draw(st.sets(st.integers(0, world.chunks - 1), min_size=1, max_size=3))
    edits = {c: data.draw(st.lists(world.block_edits, min_size=1, max_size=3)) for c in chosen}

    def block(c: int, r: int, got: RankChunk) -> RankChunk | None:
        return apply_block_edits(got, edits[c]) if r == rank and c in edits else None

    rewrite_plan(world.plan, world.scratch, block=block, version=2)
    strict = not any(trusted(e, verify) for e in edits.values())
    check_replay(world, "blocks", rank, verify, strict)


@fuzz("footer")
@given(data=st.data())
def test_forged_fetch_footer(world, data):
    """The footer's `fetch` section edited: the data root (another directory, relative,
    through a symlink loop, a file), formats swapped, payloads and length rules replaced
    or removed, sources renamed or dropped, wrong types anywhere."""
    rank = data.draw(st.integers(0, world.dp - 1))
    verify = data.draw(st.sampled_from(VERIFY))
    edits = data.draw(world.footer_edits)
    rewrite_plan(world.plan, world.scratch, footer=lambda f: apply_footer_edits(f, edits))
    check_replay(world, "footer", rank, verify, strict=True)


# --- what the fuzzing found, and the refusals it relies on ---------------------------------------


def forge(world: World, *edits: tuple, chunk: int = 0, rank: int = 0) -> Path:
    """The plan with `edits` applied to (chunk, rank)'s fetch records."""

    def block(c: int, r: int, got: RankChunk) -> RankChunk | None:
        return apply_block_edits(got, list(edits)) if (c, r) == (chunk, rank) else None

    return rewrite_plan(world.plan, world.scratch, block=block, version=2)


def record_of(world: World, name: str, chunk: int = 0, rank: int = 0) -> int:
    """The position, in (chunk, rank)'s file records, of a file of source `name`."""
    block = world.blocks[(chunk, rank)]
    sources = [s["name"] for s in world.footer["index"]["sources"]]
    return next(i for i, (s, _, _) in enumerate(block.fetch.files) if sources[s] == name)


@pytest.mark.parametrize("verify", VERIFY)
def test_a_record_path_leaving_the_root_is_refused(world, verify):
    """One line naming the record, refused before any open (the FIFO outside the root
    records one)."""
    i = record_of(world, "web")
    for rel, says in [
        ("../secret", "escapes the index root"),
        (str(world.secret), "escapes the index root"),
        ("secret.parquet", "leads outside the index root"),
        ("out.parquet", "leads outside the index root"),
        ("loop/part-0.parquet", "cannot be resolved"),
    ]:
        forge(world, ("entry", i, "path", rel))
        error = PlanError if verify == "none" else DataChangedError
        tripwire = Tripwire(world.secret)
        try:
            with watchdog(), pytest.raises(error) as err:
                replay(world.scratch, 0, verify)
        finally:
            assert not tripwire.close(), "the file outside the root was opened"
        message = str(err.value)
        assert f"web files[0]: path {rel!r}" in message and says in message, message
        assert "refused, not read" in message and "\n" not in message


def test_a_record_naming_an_unplanned_or_missing_source_is_refused(world):
    i = record_of(world, "web")
    for sid in (-1, 3, 10**30):
        forge(world, ("source", i, sid))
        with pytest.raises(PlanError, match=f"corrupt plan \\(a block names source {sid}\\)"):
            replay(world.scratch, 0, "stat")


def test_a_sample_pointing_at_another_sources_file_is_refused(world):
    web, chat = record_of(world, "web"), record_of(world, "chat")
    block = world.blocks[(0, 0)]
    k = int(np.flatnonzero(block.fetch.file == web)[0])
    forge(world, ("column", "file", k, chat))
    with pytest.raises(PlanError, match="a sample's file is of another source"):
        replay(world.scratch, 0, "none")


def test_a_changed_token_count_is_refused(world):
    forge(world, ("column", "tokens", 0, 1 << 40))
    with pytest.raises(SourceDataError, match="the index says 1099511627776"):
        replay(world.scratch, 0, "none")


def test_a_file_index_beyond_the_records_is_refused(world):
    n = len(world.blocks[(0, 0)].fetch.files)
    forge(world, ("column", "file", 0, n))
    with pytest.raises(PlanError, match="a sample names a file the block does not list"):
        replay(world.scratch, 0, "none")


def forge_footer(world: World, change) -> Path:
    return rewrite_plan(world.plan, world.scratch, footer=change)


def facts(name: str, **changes: Any):
    """A footer change: source `name`'s reading facts updated with `changes`."""

    def change(footer: dict[str, Any]) -> None:
        footer["fetch"]["sources"][name].update(changes)

    return change


# Forged plans the fuzzing found crashing or hanging the executor; the comment says what it
# did before. (case -> forge(world) -> plan, verify, error class, message)
FOUND = {
    # ValueError: a parquet reader needs the payload column (readers.open_reader)
    "payload without column": (
        lambda w: forge_footer(w, facts("web", payload={"kind": "token_ids"})),
        "none",
        PlanError,
        "a parquet reader needs the payload column",
    ),
    # ValueError: a Megatron reader needs the .idx companion (readers.open_reader)
    "megatron record without .idx": (
        lambda w: forge(w, ("unset", record_of(w, "math"), "index_path")),
        "stat",
        PlanError,
        "corrupt plan (math files[0]: a Megatron reader needs the .idx companion",
    ),
    "parquet read as megatron": (
        lambda w: forge_footer(w, facts("web", format="megatron")),
        "none",
        PlanError,
        "a Megatron reader needs the .idx companion",
    ),
    # MemoryError: offset + length wrapped around int64 past the end-of-file check, and the
    # read asked for ~2^62 bytes (readers.jsonl._LineReader.fetch)
    "jsonl byte range wrapping around": (
        lambda w: forge(
            w,
            ("column", "offset", first_sample(w, "chat"), (1 << 62) + 1),
            ("column", "length", first_sample(w, "chat"), 1 << 62),
        ),
        "none",
        SourceDataError,
        "chat/chat.jsonl line 1 (byte 4611686018427387905) is beyond the end of the file",
    ),
    # hang: the reader opened a FIFO inside the root and waited for a writer for ever
    "jsonl record naming a FIFO": (
        lambda w: forge(w, ("entry", record_of(w, "chat"), "path", "fifo")),
        "none",
        PlanError,
        "chat files[0]: path 'fifo' is not a regular file; refused, not read",
    ),
    "megatron .idx naming a FIFO": (
        lambda w: forge(w, ("entry", record_of(w, "math"), "index_path", "fifo")),
        "none",
        PlanError,
        "math files[0]: path 'fifo' is not a regular file; refused, not read",
    ),
    # hang: verify="full" fingerprinted the FIFO (its stat is not compared first)
    "full check of a FIFO": (
        lambda w: forge(w, ("entry", record_of(w, "web"), "path", "fifo")),
        "full",
        DataChangedError,
        "web files[0]: path 'fifo' is not a regular file; refused, not read",
    ),
    # hang: the tokenizer's recorded fingerprint was checked (reading the FIFO) before the
    # tokenizer file was found not to be a regular file
    "tokenizer a FIFO": (
        lambda w: forge_footer(
            w,
            facts(
                "web",
                payload={"kind": "text", "column": "tokens"},
                length={"kind": "tokenizer", "exact": True, "tokenizer": "fifo"},
                tokenizer_fingerprint="full:" + "0" * 32,
            ),
        ),
        "none",
        ConfigError,
        "fifo not found",
    ),
}


def first_sample(world: World, name: str, chunk: int = 0, rank: int = 0) -> int:
    """The position in (chunk, rank)'s block of its first sample of source `name`."""
    block = world.blocks[(chunk, rank)]
    return int(np.flatnonzero(block.fetch.file == record_of(world, name, chunk, rank))[0])


@pytest.mark.parametrize("case", sorted(FOUND))
def test_forged_plans_that_crashed_or_hung_the_executor(world, case):
    make, verify, error, message = FOUND[case]
    make(world)
    with watchdog(), pytest.raises(error) as err:
        replay(world.scratch, 0, verify)
    assert message in str(err.value) and "\n" not in str(err.value), err.value


def test_a_directory_as_a_record_path_is_refused_before_opening(world):
    forge(world, ("entry", record_of(world, "web"), "path", "web"))
    with pytest.raises(PlanError, match="web files\\[0\\]: path 'web' is not a regular file"):
        replay(world.scratch, 0, "none")


@pytest.mark.parametrize("verify", VERIFY)
def test_a_record_that_differs_between_blocks_is_refused(world, verify):
    """Found by the fuzzing: chunk 1's record of a file chunk 0 also reads, its `path`
    removed. The file was checked and opened through chunk 0's record, so chunk 1's went
    unchecked, and the token-count error message then raised KeyError: 'path'."""
    sources = [s["name"] for s in world.footer["index"]["sources"]]
    first = {(s, f) for s, f, _ in world.blocks[(0, 0)].fetch.files}
    later = world.blocks[(1, 0)].fetch.files
    i = next(i for i, (s, f, _) in enumerate(later) if (s, f) in first)
    name, fid = sources[later[i][0]], later[i][1]
    k = int(np.flatnonzero(world.blocks[(1, 0)].fetch.file == i)[0])
    forge(world, ("unset", i, "path"), ("column", "tokens", k, 0), chunk=1)
    with watchdog(), pytest.raises(PlanError) as err:
        replay(world.scratch, 0, verify)
    assert f"corrupt plan (blocks disagree on {name} files[{fid}])" in str(err.value)
