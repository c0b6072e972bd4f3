"""Fuzzing the index manifest: a mutated manifest.json is read by `read_manifest` (which
`mds plan`, `mds verify` and `mds inspect` use before anything else) into a valid manifest,
or refused with an MdsError. Never another exception, never a hang.

The index is tiny and real: Parquet in two files (several row groups), JSONL and Megatron,
its manifest forged as VERSION 1 writes it (file entries inline, which every reader reads),
all token ids. Mutations are byte edits of the JSON text and structural edits of the parsed
manifest (wrong types, missing keys, negative or huge rows, NaN, `../` and absolute paths,
very long strings, duplicated or reordered entries), half of them with the manifest
`fingerprint` recomputed over the edited sources, as a forger would.

The executor no longer reads the manifest: the plan carries what it needs (fetch records,
fuzzed in test_sources_fuzz.py). Forged manifests that once crashed the executor are kept
below (`FOUND`): `read_manifest` refuses each, so no plan is made from them.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from executor_builders import tiny_data
from fuzzing import DEEP, Tally, edit, paths_of, watchdog
from fuzzing import fuzz as fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from index_files import v1_manifest
from plan_builders import index_data

from mds.core.index_manifest import index_fingerprint, read_manifest
from mds.errors import IndexFormatError, MdsError

EXAMPLES = {"manifest_bytes": 400, "manifest_edits": 600}


def fuzz(test: str):
    return fuzz_settings(EXAMPLES[test])


TALLY = Tally("manifest")
count = TALLY.count

report_counts = TALLY.fixture()


# --- the index under test ----------------------------------------------------------------------


class World:
    """The intact index, and a scratch index directory whose manifest.json is rewritten per
    example (read_manifest reads no table)."""

    def __init__(self, base: Path):
        self.root = base / "data"
        self.index = index_data(self.root, tiny_data(self.root))
        self.plan = base / "plan.mds"  # outside the data root (interesting() names it)
        # forged as VERSION 1, whose file entries are in the manifest (every reader reads it)
        self.manifest = v1_manifest(
            json.loads((self.index / "manifest.json").read_text()), self.index
        )
        self.manifest_text = json.dumps(self.manifest, indent=2, sort_keys=True)
        self.scratch = base / "scratch"
        self.scratch.mkdir()
        self.scratch_manifest = self.scratch / "manifest.json"
        self.scratch_manifest.touch()

    def __repr__(self) -> str:  # hypothesis prints fixtures of a failing example
        return f"World({self.root})"

    def write_manifest(self, data: bytes) -> None:
        rewrite(self.scratch_manifest, data)


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


def test_the_world_reads(world):
    world.write_manifest(world.manifest_text.encode())
    assert read_manifest(world.scratch).data == world.manifest
    assert [s["format"] for s in world.manifest["sources"]] == ["parquet", "jsonl", "megatron"]
    assert len(world.manifest["sources"][0]["files"]) == 2


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


# Manifest edits the fuzzing reached past a recomputed fingerprint when the executor read the
# manifest, refused by manifest.py's validation since; the comment says what the executor
# did then. (A file path through a symlink loop, which read_manifest cannot see without
# resolving paths, is now a file record of the plan: test_sources_fuzz.py.)
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
}


@pytest.mark.parametrize("case", sorted(FOUND))
def test_forged_manifests_that_crashed_the_executor_are_refused(world, case):
    change, message = FOUND[case]
    manifest = json.loads(world.manifest_text)
    change(manifest)
    manifest, _ = recomputed(manifest)
    world.write_manifest(encode(manifest))
    with pytest.raises(IndexFormatError) as err:
        read_manifest(world.scratch)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_deeply_nested_manifest(world):
    world.write_manifest(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(IndexFormatError, match="unreadable manifest"):
        read_manifest(world.scratch)
