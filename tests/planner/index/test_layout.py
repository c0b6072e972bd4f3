"""One tree, the same sources on every backend: a source's `path` over a local directory,
an S3 prefix and a GCS prefix finds the same files in the same formats, or fails with the
same error (index/layout.py decides for both discovery paths)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from builders import source

from mds.errors import ConfigError, MdsError, SourceDataError
from mds.planner.index.discover import discover
from mds.planner.index.layout import Listing, directory_files
from mds.planner.index.objects import discover_objects, listing

STATE = {"_data_files": [{"filename": "data-00000-of-00002.arrow"}, {"filename": "data-00001-of-00002.arrow"}]}

TREE = {
    # a Hugging Face save_to_disk directory: its .json files are not data
    "hf/state.json": json.dumps(STATE).encode(),
    "hf/dataset_info.json": b"{}",
    "hf/data-00000-of-00002.arrow": b"a",
    "hf/data-00001-of-00002.arrow": b"b",
    # one that lost its state.json
    "hf_broken/dataset_info.json": b"{}",
    "hf_broken/data-00000-of-00001.arrow": b"a",
    # a save_to_disk directory whose state.json names a file that is not there
    "hf_short/state.json": json.dumps(STATE).encode(),
    "hf_short/data-00000-of-00002.arrow": b"a",
    # a Megatron dataset named by its prefix
    "m/meg.bin": b"bin",
    "m/meg.idx": b"idx",
    "m/half.bin": b"bin",
    "web/part-0.parquet": b"p0",
    "web/part-1.parquet": b"p1",
    "web/.part-2.parquet.tmp": b"hidden",
    "web/.cache/part-3.parquet": b"hidden",
    "forum/a.jsonl": b"{}\n",
    "forum/notes.txt": b"notes",
    # an mds index under the root: never a source
    "index/manifest.json": json.dumps({"format": "mds-index"}).encode(),
    "index/sources/web.parquet": b"t",
}

WEB = [("web/part-0.parquet", "parquet"), ("web/part-1.parquet", "parquet")]
FOUND = [
    ("hf", [("hf/data-00000-of-00002.arrow", "arrow"), ("hf/data-00001-of-00002.arrow", "arrow")]),
    ("hf/", [("hf/data-00000-of-00002.arrow", "arrow"), ("hf/data-00001-of-00002.arrow", "arrow")]),
    ("m/meg", [("m/meg.bin", "megatron")]),
    ("m/meg.idx", [("m/meg.bin", "megatron")]),
    ("web", WEB),
    ("web/*.parquet", WEB),
    ("**/*.parquet", WEB),
    ("forum", [("forum/a.jsonl", "jsonl")]),
]
REFUSED = [
    ("hf_broken", SourceDataError, "a save_to_disk directory without state.json"),
    ("hf_short", SourceDataError, "names 'data-00001-of-00002.arrow', which is missing"),
    ("m/half", SourceDataError, "m/half.idx: missing (a Megatron dataset needs both"),
    ("forum/notes.txt", ConfigError, "cannot tell the format of"),
    ("books/*.parquet", ConfigError, "matches no"),
    ("index", ConfigError, "is inside the mds index"),
    ("index/sources/web.parquet", ConfigError, "is inside the mds index"),
    (["web", "forum"], ConfigError, "of several formats (jsonl, parquet)"),
]


def _write(directory: Path) -> None:
    for rel, body in TREE.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)


@pytest.fixture(scope="module", params=["local", "s3", "gcs"])
def tree(request, tmp_path_factory) -> Iterator[tuple[str, Path | str]]:
    """The tree under a local directory, an S3 prefix or a GCS prefix."""
    local = tmp_path_factory.mktemp("tree")
    _write(local)
    if request.param == "local":
        yield "local", local
        return
    if request.param == "s3":
        from s3_store import s3_server as server
    else:
        from gcs_store import gcs_server as server
    with pytest.MonkeyPatch.context() as patch, server(patch) as store:
        yield request.param, store.upload(local, "corpus")


def _discover(tree, path) -> list[tuple[str, str]]:
    kind, root = tree
    spec = source(name="s", path=path, tokens="tokens")
    if kind == "local":
        files = discover(spec, root)  # type: ignore[arg-type]
    else:
        files = discover_objects(spec, str(root), listing(str(root)))
    return [(f.rel, f.format) for f in files]


@pytest.mark.parametrize(("path", "found"), FOUND, ids=[p for p, _ in FOUND])
def test_the_same_files_on_every_backend(tree, path, found):
    assert _discover(tree, path) == found


@pytest.mark.parametrize(
    ("path", "error", "message"), REFUSED, ids=[str(p) for p, _, _ in REFUSED]
)
def test_the_same_refusals_on_every_backend(tree, path, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
        _discover(tree, path)
    assert "\n" not in str(caught.value)


def test_a_megatron_pair_names_its_index_file_on_every_backend(tree):
    kind, root = tree
    spec = source(name="s", path="m/meg", tokens="tokens")
    if kind == "local":
        (file,) = discover(spec, root)  # type: ignore[arg-type]
        assert file.companion == Path(root) / "m" / "meg.idx"
    else:
        (file,) = discover_objects(spec, str(root), listing(str(root)))
        assert file.companion == f"{root}/m/meg.idx"


def test_directory_files_decides_from_the_listing_alone():
    files = Listing([("state.json", 120), ("dataset_info.json", 2), ("data-0.arrow", 9)])
    state = json.dumps({"_data_files": [{"filename": "data-0.arrow"}]}).encode()
    assert directory_files("d", files, lambda rel: state) == ["data-0.arrow"]
    plain = Listing([("a.jsonl", 1), ("b/.x.jsonl", 1), (".y.parquet", 1), ("c.txt", 1)])
    assert directory_files("d", plain, lambda rel: b"") == ["a.jsonl"]
    escape = json.dumps({"_data_files": [{"filename": "../x.arrow"}]}).encode()
    with pytest.raises(MdsError, match="outside its directory"):
        directory_files("d", files, lambda rel: escape)
