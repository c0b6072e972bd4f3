"""The planner's view of an index manifest: tables read checked, whole or by column; the
manifest written as json.dumps(indent=2, sort_keys=True); the tables a manifest names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plan_builders import synthetic

from mds.errors import IndexFormatError
from mds.planner.index.tables import (
    index_tables,
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


def test_write_manifest_writes_json_dumps_sorted_and_indented(tmp_path: Path) -> None:
    manifest = {
        "format": "mds-index",
        "version": 2,
        "root": "/data/ü",
        "sources": [{"b": 1, "a": "é"}],
    }
    write_manifest(tmp_path / "manifest.json", manifest)
    expected = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    assert (tmp_path / "manifest.json").read_bytes() == expected
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_index_tables_name_each_source_table_and_file_list(index: Path) -> None:
    m = read_manifest(index)
    entry = m.source("a")
    assert index_tables(m) == {
        entry["table"]: entry["table_checksum"],
        entry["files_table"]: entry["files_checksum"],
    }
