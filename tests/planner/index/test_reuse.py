"""src/mds/planner/index/reuse.py: which files keep their rows from the previous index, and
which outputs a build refuses to replace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import data_file, source

from mds.core.index_manifest import file_list_table
from mds.errors import ConfigError
from mds.planner.index.reuse import Recorded, previous_index, reused_files, spec_key

SMALL, BIG = 100, 64 << 20  # a sampled fingerprint covers every byte of the small file only


def _files(tmp_path: Path, *names: str):
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    return [data_file(tmp_path / name) for name in names]


def _old(key: str, *entries: tuple) -> Recorded:
    columns = {
        "id": range(len(entries)),
        "path": [p for p, *_ in entries],
        "size": [e[1] for e in entries],
        "fingerprint": [e[2] for e in entries],
        "mtime_ns": [e[3] for e in entries],
        "first_row": [0] * len(entries),
        "rows": [0] * len(entries),
        "tokens": [0] * len(entries),
    }
    return Recorded(key, file_list_table(columns))


def test_a_file_hashed_whole_is_reused_by_content_whatever_its_mtime(tmp_path: Path):
    spec = source(count="n")
    key = spec_key(spec, "jsonl", None)
    files = _files(tmp_path, "a.jsonl", "b.jsonl", "c.jsonl", "d.jsonl")
    old = _old(
        key,
        ("a.jsonl", SMALL, "sampled:aa", 1),
        ("b.jsonl", BIG, "sampled:bb", 1),
        ("c.jsonl", BIG, "full:cc", 1),
        ("d.jsonl", SMALL, "sampled:dd", 1),
    )
    fps = [
        (SMALL, 9, "sampled:aa", SMALL),  # copied without its mtime: the same content
        (BIG, 9, "sampled:bb", BIG),  # sampled, not whole: the mtime must match too
        (BIG, 9, "full:cc", BIG),  # a full fingerprint covers every byte
        (SMALL, 1, "sampled:XX", SMALL),  # other content, same mtime
    ]
    got = reused_files(spec, files, fps, key, old)
    assert [f.reuse for f in got] == [0, None, 2, None]
    assert [(f.size, f.mtime_ns, f.fingerprint) for f in got] == [fp[:3] for fp in fps]
    assert all(f.reuse is None for f in reused_files(spec, files, fps, key + "x", old))
    twice = _old(key, ("a.jsonl", SMALL, "sampled:zz", 1), *[(e[0], *e[1:]) for e in [
        ("a.jsonl", SMALL, "sampled:aa", 1), ("b.jsonl", BIG, "sampled:bb", 1),
        ("c.jsonl", BIG, "full:cc", 1), ("d.jsonl", SMALL, "sampled:dd", 1)]])  # fmt: skip
    assert not twice.unique  # a path recorded twice: matched by its content too
    assert [f.reuse for f in reused_files(spec, files, fps, key, twice)] == [1, None, 3, None]


def test_settings_that_change_a_table_change_the_spec_key():
    base = spec_key(source(count="n"), "jsonl", None)
    assert base == spec_key(source(count="n"), "jsonl", None)
    assert base != spec_key(source(count="n", keep=["lang"]), "jsonl", None)
    assert base != spec_key(source(count="n"), "jsonl.zst", None)
    assert json.loads(spec_key(source(tokens="ids"), "parquet", None))["offsets"] == "row_group"


def test_only_an_mds_index_or_an_empty_directory_is_replaced(tmp_path: Path):
    assert previous_index(tmp_path / "missing") is None
    (tmp_path / "empty").mkdir()
    assert previous_index(tmp_path / "empty") is None
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not an mds index; pick another --output"):
        previous_index(tmp_path / "other")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="output exists and is not a directory"):
        previous_index(tmp_path / "file")
