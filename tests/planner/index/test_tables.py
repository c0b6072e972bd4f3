"""The planner's view of an index manifest: tables read checked, whole or by column; the
manifest writer gives the same bytes as json.dumps(indent=2, sort_keys=True)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_builders import synthetic

from mds.errors import IndexFormatError
from mds.planner.index.tables import (
    manifest_chunks,
    read_manifest,
    source_frame,
    source_table,
    write_manifest,
)

SOURCES = {"a": {"lengths": [3, 1, 2], "weight": 1.0, "meta": {"lang": ["en", "fr", "en"]}}}
TRAIN = {"steps": 1, "dp_size": 1, "samples_per_step": 1, "max_tokens_per_micro_batch": 8}


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("manifest")
    synthetic(root, SOURCES, TRAIN)
    return root / "index"


def test_source_table_decodes_only_the_columns_picked(index: Path) -> None:
    m = read_manifest(index)
    seen = []

    def pick(schema):
        seen.append(list(schema))
        return ["n_tokens"]

    table = source_table(m, "a", pick)
    assert table.columns == ["n_tokens"] and table["n_tokens"].to_list() == [3, 1, 2]
    assert "lang" in seen[0] and "file_row" in seen[0]
    assert source_table(m, "a", lambda schema: None).columns == seen[0]
    assert source_frame(m, "a").collect().columns == seen[0]


def test_source_table_refuses_a_damaged_table(tmp_path: Path) -> None:
    synthetic(tmp_path, SOURCES, TRAIN)
    m = read_manifest(tmp_path / "index")
    table = tmp_path / "index" / m.source("a")["table"]
    table.write_bytes(table.read_bytes()[:-1] + b"x")
    with pytest.raises(IndexFormatError, match="differs from the manifest"):
        source_table(m, "a", lambda schema: ["n_tokens"])


def _file(i: int, **extra) -> dict:
    return {
        "id": i,
        "path": f"d/f{i}.jsonl",
        "size": 10 + i,
        "mtime_ns": 1_700_000_000_000_000_000 + i,
        "fingerprint": f"sampled:{i:032x}",
        "first_row": 4 * i,
        "rows": 4,
        "tokens": 2**40 + i,
        **extra,
    }


def _manifest() -> tuple[dict, list[list[dict]]]:
    files = [
        [_file(0), _file(1, index_path="d/f1.idx"), _file(2, path='ünï "quoted" \\ \t.jsonl')],
        [],
        [_file(0)],
    ]
    sources = [
        {"name": name, "rows": 1, "keep": {"lang": "String"}, "length_stats": {}, "payload": None}
        for name in ("a", "b\u00e9", "c")
    ]
    manifest = {"format": "mds-index", "version": 1, "root": "/data/ü", "sources": sources}
    return manifest, files


def test_chunks_equal_json_dumps() -> None:
    manifest, files = _manifest()
    full = {
        **manifest,
        "sources": [{**s, "files": f} for s, f in zip(manifest["sources"], files, strict=True)],
    }
    expected = json.dumps(full, indent=2, sort_keys=True) + "\n"
    assert "".join(manifest_chunks(manifest, [iter(f) for f in files])) == expected


def test_write_manifest_writes_the_same_bytes(tmp_path: Path) -> None:
    manifest, files = _manifest()
    full = {
        **manifest,
        "sources": [{**s, "files": f} for s, f in zip(manifest["sources"], files, strict=True)],
    }
    write_manifest(tmp_path / "manifest.json", manifest, [iter(f) for f in files])
    expected = (json.dumps(full, indent=2, sort_keys=True) + "\n").encode()
    assert (tmp_path / "manifest.json").read_bytes() == expected
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


_SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.text(),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.sampled_from(["id", "path", "size", "x%s", 'q"k', "é", "%"]), _SCALARS, min_size=1),
        max_size=6,
    )
)
def test_chunks_equal_json_dumps_for_any_flat_entries(entries: list[dict]) -> None:
    manifest = {"format": "mds-index", "sources": [{"name": "a"}]}
    expected = json.dumps({**manifest, "sources": [{"name": "a", "files": entries}]}, indent=2, sort_keys=True)
    assert "".join(manifest_chunks(manifest, [iter(entries)])) == expected + "\n"
