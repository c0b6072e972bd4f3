"""Formats beyond Parquet and JSONL read from object storage, against a real S3-protocol
server on 127.0.0.1 (moto): each is indexed from objects into the index of the same files,
replays the same batches as local disk, and a missing or changed object is one error line
naming it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from builders import jsonl_bytes, write_arrow, write_megatron, write_zst
from cli_helpers import mds, one_error_line
from index_files import manifest_with_files
from s3_store import s3_server
from store_corpus import assert_replays_as_local, index_and_plan, replay

from mds.core.storage import DATA_ROOT_ENV
from mds.errors import DataChangedError

PLAN = """
[train]
steps = 6
dp_size = 2
micro_batches = 2
samples_per_step = 8
max_tokens_per_micro_batch = 400
seed = 7
"""


def _source(name: str, path: str, extra: str = "") -> str:
    return f'[[source]]\nname = "{name}"\npath = "{path}"\nweight = 1.0\n{extra}\n'


@pytest.fixture(scope="module")
def store():
    with pytest.MonkeyPatch.context() as patch, s3_server(patch) as server:
        patch.delenv(DATA_ROOT_ENV, raising=False)
        yield server


def _index_and_plan(top: Path, name: str, root: str, sources: str) -> Path:
    return index_and_plan(top, name, f'[index]\nroot = "{root}"\n\n{sources}\n{PLAN}')


def _same_index(top: Path, a: str, b: str) -> None:
    left = manifest_with_files(top / f"{a}-index")
    right = manifest_with_files(top / f"{b}-index")
    assert left["fingerprint"] == right["fingerprint"]
    strip = ("size", "mtime_ns")
    files = [
        [{k: v for k, v in f.items() if k not in strip} for f in s["files"]]
        for s in left["sources"]
    ]
    assert files == [
        [{k: v for k, v in f.items() if k not in strip} for f in s["files"]]
        for s in right["sources"]
    ]


@pytest.fixture(scope="module")
def megatron(store, tmp_path_factory):
    top = tmp_path_factory.mktemp("megatron")
    rng = np.random.default_rng(2)
    for part in range(2):
        sequences = [rng.integers(0, 60_000, int(rng.integers(3, 90))) for _ in range(50)]
        write_megatron(top / "local" / "math" / f"part{part}_text_document", sequences)
    url = store.upload(top / "local", "megatron")
    sources = _source("math", "math/*.bin")
    local = _index_and_plan(top, "local", str(top / "local"), sources)
    s3 = _index_and_plan(top, "s3", url, sources)
    return top, url, local, s3


def test_megatron_objects_index_and_replay_as_local_files(megatron):
    top, url, local, s3 = megatron
    _same_index(top, "local", "s3")
    manifest = manifest_with_files(top / "s3-index")
    assert manifest["sources"][0]["files"][0]["index_path"] == "math/part0_text_document.idx"
    assert_replays_as_local(local, s3, url)


def test_a_missing_megatron_idx_object_is_an_error_naming_it(megatron, store):
    top, url, _local, s3 = megatron
    key = "megatron/math/part1_text_document.idx"
    original = store.get(key)
    try:
        store.delete(key)
        with pytest.raises(DataChangedError, match=r"math/part1_text_document.idx: missing"):
            replay(s3, 0)
        one_error_line(
            mds("index", top / "s3.toml", "-o", top / "broken-index"),
            f"{url}/math/part1_text_document.idx: missing",
        )
    finally:
        store.put(key, original)


def test_a_changed_megatron_bin_object_is_an_error_naming_it(megatron, store):
    _top, _url, _local, s3 = megatron
    key = "megatron/math/part0_text_document.bin"
    original = store.get(key)
    try:
        raw = bytearray(original)
        raw[10] ^= 0xFF  # same size, one token changed
        store.put(key, bytes(raw))
        with pytest.raises(
            DataChangedError, match=r"math/part0_text_document.bin: content changed"
        ):
            replay(s3, 0, verify="full")  # the store's mtime has whole seconds
    finally:
        store.put(key, original)


@pytest.fixture(scope="module")
def zst(store, tmp_path_factory):
    top = tmp_path_factory.mktemp("zst")
    rng = np.random.default_rng(3)
    for part in range(2):
        records = [
            {"ids": rng.integers(0, 500, int(rng.integers(3, 60))).tolist()} for _ in range(60)
        ]
        write_zst(top / "local" / "code" / f"code-{part}.jsonl.zst", jsonl_bytes(records), frames=4)
    url = store.upload(top / "local", "zst")
    sources = _source("code", "code/*.jsonl.zst", 'tokens = "ids"')
    local = _index_and_plan(top, "local", str(top / "local"), sources)
    s3 = _index_and_plan(top, "s3", url, sources)
    return top, url, local, s3


def test_zstd_jsonl_objects_index_and_replay_as_local_files(zst):
    top, url, local, s3 = zst
    _same_index(top, "local", "s3")
    assert_replays_as_local(local, s3, url)


def test_a_missing_or_changed_zstd_object_is_an_error_naming_it(zst, store):
    _top, _url, _local, s3 = zst
    key = "zst/code/code-1.jsonl.zst"
    original = store.get(key)
    try:
        store.delete(key)
        with pytest.raises(DataChangedError, match=r"code/code-1.jsonl.zst: missing"):
            replay(s3, 0)
        store.put(key, original[:-3] + bytes(b ^ 0xFF for b in original[-3:]))
        # verify="full": the store's mtime has whole seconds, the rewrite may keep it
        with pytest.raises(DataChangedError, match=r"code/code-1.jsonl.zst: content changed"):
            replay(s3, 0, verify="full")
    finally:
        store.put(key, original)


@pytest.fixture(scope="module", params=["file", "stream"])
def arrow(request, store, tmp_path_factory):
    top = tmp_path_factory.mktemp(f"arrow-{request.param}")
    rng = np.random.default_rng(4)
    for part in range(2):
        rows = [rng.integers(0, 500, int(rng.integers(3, 60))).tolist() for _ in range(70)]
        table = pa.table({"tokens": rows, "lang": ["en", "de"] * 35})
        write_arrow(
            top / "local" / "books" / f"data-{part}.arrow",
            pa.Table.from_batches(table.to_batches(max_chunksize=16)),  # 5 record batches
            stream=request.param == "stream",
        )
    url = store.upload(top / "local", f"arrow-{request.param}")
    sources = _source("books", "books/*.arrow", 'tokens = "tokens"\nkeep = ["lang"]')
    local = _index_and_plan(top, "local", str(top / "local"), sources)
    s3 = _index_and_plan(top, "s3", url, sources)
    return top, url, local, s3, request.param


def test_arrow_objects_index_and_replay_as_local_files(arrow):
    top, url, local, s3, _kind = arrow
    _same_index(top, "local", "s3")
    assert_replays_as_local(local, s3, url)


def test_a_missing_or_changed_arrow_object_is_an_error_naming_it(arrow, store):
    _top, _url, _local, s3, kind = arrow
    key = f"arrow-{kind}/books/data-1.arrow"
    original = store.get(key)
    try:
        store.delete(key)
        with pytest.raises(DataChangedError, match=r"books/data-1.arrow: missing"):
            replay(s3, 0)
        store.put(key, original[:-40] + bytes(b ^ 0x55 for b in original[-40:]))
        with pytest.raises(DataChangedError, match=r"books/data-1.arrow: content changed"):
            replay(s3, 0, verify="full")
    finally:
        store.put(key, original)
