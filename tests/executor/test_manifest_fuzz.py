"""Fuzzing the index manifest: a mutated manifest.json is read, and a plan of the intact
index is replayed from it, either with exactly the original batches or with an MdsError.
Never another exception, never a hang.

The index is tiny and real: Parquet in two files (several row groups), JSONL and Megatron,
all token ids, so a whole rank replays in milliseconds. Mutations are byte edits of the JSON
text and structural edits of the parsed manifest (wrong types, missing keys, negative or huge
rows, NaN, `../` and absolute paths, very long strings, duplicated or reordered entries).

The plan records the index fingerprint, so most edits stop at the fingerprint check. The
*forged* variants recompute the manifest `fingerprint` with `index_fingerprint(sources)` and
write a plan that records it (its footer checksum recomputed), so the check passes and the
validation behind it is what answers.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest
from builders import write_jsonl, write_megatron, write_parquet
from executor_builders import batch_digest
from fuzzing import DEEP, Tally, edit, paths_of, watchdog
from fuzzing import fuzz as fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from plan_builders import index_data, plan_config

from mds.executor import PlanExecutor
from mds.executor.errors import DataChangedError, IndexFormatError, MdsError
from mds.executor.manifest import index_fingerprint, read_manifest
from mds.executor.planfile import MAGIC, checksum

TRAILER = struct.Struct("<QQ8s8s")
EXAMPLES = {
    "manifest_bytes": 400,
    "manifest_edits": 600,
    "executor_bytes": 100,
    "executor_edits": 250,
    "executor_forged": 400,
}


def fuzz(test: str):
    return fuzz_settings(EXAMPLES[test])


TALLY = Tally("manifest")
count = TALLY.count


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    TALLY.report()


# --- the index and plan under test ---------------------------------------------------------------


def tiny_data(root: Path) -> dict[str, Any]:
    """Three sources in three formats under `root`; returns the config (as a dict)."""
    for part in range(2):
        tokens = [list(range(part * 50 + r, part * 50 + r + 1 + (r * 7) % 13)) for r in range(14)]
        write_parquet(root / f"web/part-{part}.parquet", {"tokens": tokens}, row_group_size=5)
    write_jsonl(
        root / "chat/chat.jsonl", [{"ids": list(range(1 + (r * 5) % 17))} for r in range(12)]
    )
    write_megatron(root / "math/doc", [[7] * (1 + (r * 3) % 11) for r in range(10)])
    (root / "loop").symlink_to("loop")  # a symlink loop, and a link out of the root
    (root / "out.parquet").symlink_to(root.parent / "plan.mds")
    return {
        "index": {"output": "index"},
        "source": [
            {"name": "web", "path": "web/*.parquet", "tokens": "tokens", "weight": 2},
            {"name": "chat", "path": "chat/chat.jsonl", "tokens": "ids", "weight": 1},
            {"name": "math", "path": "math/doc", "weight": 1},
        ],
        "train": {
            "steps": 8,
            "dp_size": 2,
            "micro_batches": 2,
            "samples_per_step": 8,
            "max_tokens_per_micro_batch": 64,
            "seed": 5,
        },
        "plan": {"chunk_steps": 3},
    }


class World:
    """The intact index and plan, every rank's batch digests, and scratch copies to mutate."""

    def __init__(self, base: Path):
        from mds.planner.plan import build_plan

        self.root = base / "data"
        config = tiny_data(self.root)
        self.index = index_data(self.root, config)
        self.plan = base / "plan.mds"
        build_plan(plan_config(self.root, config), self.plan, workers=1)
        self.manifest_text = (self.index / "manifest.json").read_text()
        self.manifest = json.loads(self.manifest_text)
        self.plan_bytes = self.plan.read_bytes()
        offset, size, _, _ = TRAILER.unpack(self.plan_bytes[-TRAILER.size :])
        self.footer_offset = offset
        self.footer = json.loads(self.plan_bytes[offset : offset + size])
        self.digests = {}
        for rank in range(self.footer["layout"]["dp_size"]):
            with PlanExecutor(self.plan, rank) as ex:
                self.digests[rank] = [batch_digest(b) for b in ex]
        # The scratch index: the same tables (hard links), a manifest rewritten per example.
        self.scratch = base / "scratch"
        (self.scratch / "sources").mkdir(parents=True)
        for table in (self.index / "sources").iterdir():
            os.link(table, self.scratch / "sources" / table.name)
        self.scratch_manifest = self.scratch / "manifest.json"
        self.scratch_plan = base / "scratch.mds"
        for path in (self.scratch_manifest, self.scratch_plan):
            path.touch()

    def __repr__(self) -> str:  # hypothesis prints fixtures of a failing example
        return f"World({self.root})"

    def write_manifest(self, data: bytes) -> None:
        rewrite(self.scratch_manifest, data)

    def write_plan(self, fingerprint: Any) -> Path:
        """The plan with `fingerprint` recorded as its index's, footer checksum recomputed."""
        footer = json.loads(json.dumps(self.footer))
        footer["index"]["fingerprint"] = fingerprint
        raw = json.dumps(footer, sort_keys=True, separators=(",", ":")).encode()
        trailer = TRAILER.pack(self.footer_offset, len(raw), checksum(raw), MAGIC)
        rewrite(self.scratch_plan, self.plan_bytes[: self.footer_offset] + raw + trailer)
        return self.scratch_plan


def rewrite(path: Path, data: bytes) -> None:
    """Replace a file's content in place (re-creating it with O_TRUNC flushes, on ext4)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    world = World(tmp_path_factory.mktemp("manifest-fuzz"))
    # Strategies over this manifest, built once (building them per example is the slow part).
    world.edits = edits(world)
    world.byte_edits = byte_edits(world.manifest_text.encode())
    return world


def test_the_world_replays(world):
    world.write_manifest(world.manifest_text.encode())
    assert read_manifest(world.scratch).data == world.manifest
    for rank, digests in world.digests.items():
        assert len(digests) == 16
        assert replay(world.plan, rank, world.scratch) == digests


# --- mutations ----------------------------------------------------------------------------------


def interesting(world: World) -> st.SearchStrategy[Any]:
    """Values to put anywhere: wrong types, extremes, and paths that leave the root."""
    files = [f["path"] for s in world.manifest["sources"] for f in s["files"]]
    tables = [s["table"] for s in world.manifest["sources"]]
    outside = os.path.relpath(world.plan, world.root)  # a real file outside the data root
    return st.one_of(
        st.sampled_from(
            [0, 1, -1, 2, 13, 14, 15, 1 << 31, 1 << 63, 1 << 64, -(1 << 63), 10**30, True]
        ),
        st.sampled_from([0.5, -0.0, 1e308, float("nan"), float("inf"), float("-inf")]),
        st.sampled_from([None, False, [], {}, [0], {"a": 1}, [None], DEEP]),
        st.sampled_from(files + tables + [outside, str(world.plan), str(world.root / files[0])]),
        st.sampled_from(
            ["", ".", "..", "/", "../" * 5 + "etc/passwd", "/etc/passwd", "web/../" + files[0]]
            + ["./" + files[0], files[0] + "\x00", "sources", "manifest.json", "sources/.."]
            + ["a" * 5000, "é" * 300, "\ud800", "NaN", "blake2b:" + "0" * 32, "sampled:00"]
            + ["parquet", "jsonl", "jsonl.zst", "arrow", "megatron", "csv", "text", "token_ids"]
            + ["tokenizer", "estimate", "count", "tokens", "mds-index", "/", "\\..\\x"]
            + ["loop", "loop/web/part-0.parquet", "out.parquet", "web", "math/doc.idx"]
        ),
        st.sampled_from(
            [{"kind": "text", "column": "tokens"}, {"kind": "token_ids"}, {"kind": None}]
            + [{"kind": "tokenizer", "exact": True}, {"kind": "estimate", "exact": False}]
            + [{"kind": "token_ids", "column": ["tokens"]}, {"exact": "yes"}]
        ),
        st.integers(),
        st.text(max_size=10),
    )


def edit_strategy(world: World) -> st.SearchStrategy[tuple]:
    everything = paths_of(world.manifest)
    files = [p for p in everything if "files" in p]
    sources = [p for p in everything if p[:1] == ("sources",) and "files" not in p]
    where = st.one_of(st.sampled_from(everything), st.sampled_from(files), st.sampled_from(sources))
    values = interesting(world)
    return st.one_of(
        st.tuples(st.just("replace"), where, values),
        st.tuples(st.just("shift"), where, st.integers(-40, 40).filter(bool)),
        st.tuples(st.just("delete"), where),
        st.tuples(st.just("duplicate"), where),
        st.tuples(st.just("swap"), where, st.integers(1, 8)),
        st.tuples(st.just("reverse"), where),
        st.tuples(st.just("rekey"), where, st.sampled_from(["", "path ", "Path", "name"])),
    )


def edits(world: World) -> st.SearchStrategy[dict[str, Any]]:
    """The manifest after one to three structural edits."""

    def apply(changes: list[tuple]) -> dict[str, Any]:
        manifest = world.manifest
        for change in changes:
            with contextlib.suppress(KeyError, IndexError, TypeError):  # path gone
                manifest = edit(manifest, change)
        return manifest

    return st.lists(edit_strategy(world), min_size=1, max_size=3).map(apply)


def encode(manifest: Any) -> bytes:
    text = json.dumps(manifest, indent=2, sort_keys=True)
    text = text.replace(json.dumps(DEEP), "[" * 50_000 + "]" * 50_000)
    return text.encode("utf-8", "surrogatepass")


def byte_edits(text: bytes) -> st.SearchStrategy[bytes]:
    position = st.integers(0, len(text) - 1)
    op = st.one_of(
        st.tuples(st.just("flip"), position, st.integers(1, 255)),
        st.tuples(st.just("set"), position, st.binary(min_size=1, max_size=6)),
        st.tuples(st.just("delete"), position, st.integers(1, 40)),
        st.tuples(st.just("truncate"), position, st.just(0)),
        st.tuples(st.just("insert"), position, st.sampled_from([b"-", b"9" * 30, b"[", b"\\"])),
    )

    def apply(ops: list[tuple]) -> bytes:
        out = bytearray(text)
        for kind, at, arg in ops:
            at = min(at, len(out))
            if kind == "flip" and at < len(out):
                out[at] ^= arg
            elif kind == "set":
                out[at : at + len(arg)] = arg
            elif kind == "delete":
                del out[at : at + arg]
            elif kind == "truncate":
                del out[at:]
            elif kind == "insert":
                out[at:at] = arg
        return bytes(out)

    return st.lists(op, min_size=1, max_size=3).map(apply)


def recomputed(manifest: Any) -> tuple[Any, Any]:
    """The manifest with its fingerprint recomputed over its (edited) sources, and that
    fingerprint; unchanged if the sources are too broken to fingerprint."""
    try:
        fingerprint = index_fingerprint(manifest["sources"])
    except (KeyError, TypeError, IndexError, ValueError, AttributeError):
        return manifest, None
    if isinstance(manifest, dict):
        manifest = {**manifest, "fingerprint": fingerprint}
    return manifest, fingerprint


# --- the contract -------------------------------------------------------------------------------


def replay(plan: Path, rank: int, index: Path, verify: str = "stat") -> list[str]:
    with PlanExecutor(plan, rank, index=index, verify=verify) as ex:
        return [batch_digest(b) for b in ex]


def check_manifest(world: World, test: str) -> None:
    """read_manifest works, or raises MdsError."""
    with watchdog():
        try:
            manifest = read_manifest(world.scratch)
        except MdsError:
            count(test, True)
            return
    count(test, False)
    assert isinstance(manifest.sources, list) and isinstance(manifest.fingerprint, str)


def check_replay(world: World, plan: Path, test: str, rank: int, verify: str) -> None:
    """The executor replays the original batches, or raises MdsError."""
    with watchdog():
        try:
            got = replay(plan, rank, world.scratch, verify)
        except MdsError:
            count(test, True)
            return
    count(test, False)
    assert got == world.digests[rank], "a mutated manifest replayed other batches"


@fuzz("manifest_bytes")
@given(data=st.data())
def test_manifest_byte_edits(world, data):
    world.write_manifest(data.draw(world.byte_edits))
    check_manifest(world, "manifest_bytes")


@fuzz("manifest_edits")
@given(data=st.data())
def test_manifest_structure_edits(world, data):
    manifest = data.draw(world.edits)
    if data.draw(st.booleans()):
        manifest, _ = recomputed(manifest)
    world.write_manifest(encode(manifest))
    check_manifest(world, "manifest_edits")


VERIFY = st.sampled_from(["stat", "stat", "full"])


def verify_mode(world: World, manifest: Any, drawn: str) -> str:
    """`drawn`, except "stat" for a manifest whose tables were renamed: with "full", the
    executor lets the OSError of a missing table escape (test_full_verify_of_a_missing_table)."""
    tables = [s.get("table") for s in world.manifest["sources"]]
    try:
        same = [s.get("table") for s in manifest["sources"]] == tables
    except (KeyError, TypeError, AttributeError):
        same = False
    return drawn if same else "stat"


@fuzz("executor_bytes")
@given(data=st.data())
def test_executor_on_manifest_byte_edits(world, data):
    text = data.draw(world.byte_edits)
    world.write_manifest(text)
    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError):
        manifest = None
    rank, verify = data.draw(st.integers(0, 1)), verify_mode(world, manifest, data.draw(VERIFY))
    check_replay(world, world.plan, "executor_bytes", rank, verify)


@fuzz("executor_edits")
@given(data=st.data())
def test_executor_on_manifest_edits(world, data):
    """Edited manifests against the plan of the intact index: the fingerprint check refuses
    the edits it covers; the others must not change a batch."""
    manifest = data.draw(world.edits)
    world.write_manifest(encode(manifest))
    rank, verify = data.draw(st.integers(0, 1)), verify_mode(world, manifest, data.draw(VERIFY))
    check_replay(world, world.plan, "executor_edits", rank, verify)


@fuzz("executor_forged")
@given(data=st.data())
def test_executor_on_forged_manifests(world, data):
    """Edited manifests with a recomputed fingerprint, and a plan that records it: the
    executor's own validation of the manifest (paths inside the root, types, rows, formats)
    refuses the edit, or the batches are the original ones."""
    manifest, fingerprint = recomputed(data.draw(world.edits))
    world.write_manifest(encode(manifest))
    plan = world.write_plan(fingerprint) if fingerprint is not None else world.plan
    rank, verify = data.draw(st.integers(0, 1)), verify_mode(world, manifest, data.draw(VERIFY))
    check_replay(world, plan, "executor_forged", rank, verify)


def test_recomputed_fingerprint_passes_the_check(world):
    """The forged variant does reach past the fingerprint: an edit outside the fingerprint's
    inputs (a file's `tokens`) with a recomputed fingerprint replays the original batches."""
    manifest = edit(world.manifest, ("replace", ("sources", 0, "files", 0, "tokens"), -5))
    manifest, fingerprint = recomputed(manifest)
    assert fingerprint == world.manifest["fingerprint"]
    fake = "sampled:" + "0" * 32
    manifest = edit(world.manifest, ("replace", ("sources", 0, "files", 0, "fingerprint"), fake))
    manifest, fingerprint = recomputed(manifest)
    assert fingerprint != world.manifest["fingerprint"]
    world.write_manifest(encode(manifest))
    plan = world.write_plan(fingerprint)
    assert replay(plan, 1, world.scratch) == world.digests[1]  # "stat" does not read content
    with pytest.raises(DataChangedError, match="web/part-0.parquet: content changed"):
        replay(plan, 1, world.scratch, "full")


# --- what the fuzzing found -----------------------------------------------------------------------


def at(name: str, *path: Any):
    """A path into the manifest, by source name."""

    def locate(manifest: dict[str, Any]) -> tuple[Any, Any]:
        node: Any = next(s for s in manifest["sources"] if s["name"] == name)
        for key in path[:-1]:
            node = node[key]
        return node, path[-1]

    return locate


def setting(where, value):
    def change(manifest):
        node, key = where(manifest)
        node[key] = value

    return change


def deleting(where):
    def change(manifest):
        node, key = where(manifest)
        del node[key]

    return change


# Manifest edits the fuzzing reached past a recomputed fingerprint, now refused by
# manifest.py's validation; the comment says what the executor did before.
FOUND = {
    # ValueError: unknown source format (readers.open_reader)
    "unknown format": (setting(at("web", "format"), "qarquet"), "format 'qarquet' is not one"),
    # KeyError: 'format' (sources._Source.fmt)
    "no format": (deleting(at("web", "format")), "format None"),
    # AttributeError: 'str' object has no attribute 'get' (sources._Source.payload)
    "payload not an object": (setting(at("chat", "payload"), "ids"), "payload 'ids'"),
    # ValueError: a parquet reader needs the payload column (readers.open_reader)
    "payload without column": (
        setting(at("web", "payload"), {"kind": "token_ids", "column": ""}),
        "is not a parquet payload",
    ),
    # ConfigError asking for tokenize= for a Megatron source (misleading, not a crash)
    "text from megatron": (
        setting(at("math", "payload"), {"kind": "text", "column": ""}),
        "is not a megatron payload",
    ),
    # ValueError: a Megatron reader needs the .idx companion (readers.open_reader)
    "megatron without .idx": (
        deleting(at("math", "files", 0, "index_path")),
        "files[0].index_path is missing",
    ),
    # KeyError: 'first_row' (sources.SourceCatalog._source)
    "no first_row": (deleting(at("web", "files", 1, "first_row")), "files[1] rows 14 from"),
    # ValueError: invalid literal for int() (sources.SourceCatalog._source)
    "first_row NaN": (setting(at("web", "files", 1, "first_row"), "NaN"), "first_row 'NaN'"),
    # TypeError: int() argument must be ... not 'list' (sources.SourceCatalog._source)
    "first_row a list": (setting(at("chat", "files", 0, "first_row"), [0]), "first_row [0]"),
    # samples read from the wrong file row; caught by luck by the token-count check
    "first_row shifted": (setting(at("web", "files", 0, "first_row"), 1), "first_row 1"),
    # accepted (the executor takes rows from the plan)
    "rows negative": (setting(at("web", "files", 1, "rows"), -1), "rows -1"),
    "rows do not add up": (setting(at("chat", "rows"), 13), "files hold 12 rows, the source 13"),
    # AttributeError: 'str' object has no attribute 'get' (sources._Source.exact)
    "length not an object": (setting(at("web", "length"), "tokens"), "length 'tokens'"),
    # RuntimeError: Symlink loop (datacheck.safe_path, Path.resolve)
    "path through a symlink loop": (
        setting(at("web", "files", 0, "path"), "loop/part-0.parquet"),
        "'loop/part-0.parquet' cannot be resolved",
    ),
}


@pytest.mark.parametrize("case", sorted(FOUND))
def test_forged_manifests_that_crashed_the_executor(world, case):
    change, message = FOUND[case]
    manifest = json.loads(world.manifest_text)
    change(manifest)
    manifest, fingerprint = recomputed(manifest)
    world.write_manifest(encode(manifest))
    plan = world.write_plan(fingerprint)
    with pytest.raises(IndexFormatError) as err:
        replay(plan, 0, world.scratch)
    assert message in str(err.value)


def test_deeply_nested_manifest(world):
    world.write_manifest(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(IndexFormatError, match="unreadable manifest"):
        read_manifest(world.scratch)


def test_full_verify_of_a_missing_table(world):
    manifest = json.loads(world.manifest_text)
    manifest["sources"][0]["table"] = "sources/missing.parquet"
    world.write_manifest(encode(manifest))  # the fingerprint does not cover `table`
    with pytest.raises(MdsError, match="missing.parquet"):
        replay(world.plan, 0, world.scratch, "full")
