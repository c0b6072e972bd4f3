"""src/mds/planner/index/history.py: the manifests a re-index replaced, kept under history/
with the tables they name, the newest HISTORY_KEEP of them."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mds.core.index_manifest import HISTORY, history_name, read_manifest, read_manifest_of
from mds.planner.index.build import build_index
from mds.planner.index.config import load_config
from mds.planner.index.history import HISTORY_KEEP, manifest_tables, prune


def _corpus(root: Path, n: int) -> None:
    (root / "d").mkdir(parents=True)
    for i in range(n):
        (root / f"d/f{i:03d}.jsonl").write_text(f'{{"tokens": [{i}, 1]}}\n')
    (root / "mds.toml").write_text('[[source]]\nname = "d"\npath = "d/*.jsonl"\ntokens = "tokens"\n')


def test_the_tables_a_manifest_names_are_read_from_its_bytes(tmp_path: Path):
    root = tmp_path / "data"
    _corpus(root, 3)
    (root / "e").mkdir()
    (root / "e/x.jsonl").write_text('{"tokens": [1]}\n')
    with open(root / "mds.toml", "a") as f:
        f.write('[[source]]\nname = "e"\npath = "e/*.jsonl"\ntokens = "tokens"\n')
    build_index(load_config(root / "mds.toml"), tmp_path / "index", workers=1)
    text = (tmp_path / "index/manifest.json").read_bytes()
    assert manifest_tables(text) == {
        s[k] for s in json.loads(text)["sources"] for k in ("table", "files_table")
    }
    assert len(manifest_tables(text)) == 4  # a table and a file list per source


def test_the_newest_manifests_are_kept():
    kept = [(f"{i}.json", 100 + i) for i in range(HISTORY_KEEP + 2)]
    retained, dropped = prune(kept)
    assert dropped == ["1.json", "0.json"]
    assert retained[0] == f"{HISTORY_KEEP + 1}.json" and len(retained) == HISTORY_KEEP
    assert prune([("b", 1), ("a", 1)]) == (["a", "b"], [])


def test_a_re_index_keeps_the_manifest_it_replaced_and_its_tables(tmp_path: Path):
    root = tmp_path / "data"
    _corpus(root, 4)
    config = load_config(root / "mds.toml")
    index = tmp_path / "index"
    first = build_index(config, index, workers=1)
    old = read_manifest(index)
    build_index(config, index, workers=1)  # nothing changed: nothing kept
    assert not (index / HISTORY).exists() or not any((index / HISTORY).iterdir())
    (root / "d/f100.jsonl").write_text('{"tokens": [5]}\n')
    second = build_index(config, index, workers=1)
    assert second.fingerprint != first.fingerprint
    kept = read_manifest_of(index, first.fingerprint)
    assert kept.data == old.data and kept.path == index
    assert (index / old.sources[0]["table"]).is_file()  # the old table stays with it
    assert read_manifest_of(index, second.fingerprint).fingerprint == second.fingerprint
    assert read_manifest_of(index, "blake2b:" + "0" * 32).fingerprint == second.fingerprint


def test_tables_go_once_no_kept_manifest_names_them(tmp_path: Path):
    root = tmp_path / "data"
    _corpus(root, 2)
    config = load_config(root / "mds.toml")
    index = tmp_path / "index"
    builds = []
    for i in range(HISTORY_KEEP + 2):
        (root / f"d/g{i:03d}.jsonl").write_text(f'{{"tokens": [{i}]}}\n')
        builds.append(build_index(config, index, workers=1).fingerprint)
        # distinct modification times, whatever the filesystem's resolution
        for k, p in enumerate(sorted((index / HISTORY).glob("*.json"), key=os.path.getmtime)):
            os.utime(p, ns=(10**18 + k * 10**9, 10**18 + k * 10**9))
    kept = sorted(p.name for p in (index / HISTORY).iterdir())
    assert len(kept) == HISTORY_KEEP
    assert history_name(builds[0]).split("/")[1] not in kept  # the oldest is gone ...
    first = [p for p in (index / "sources").iterdir()]
    named = {read_manifest(index).sources[0][k] for k in ("table", "files_table")}
    for fp in builds[:-1]:
        if (index / history_name(fp)).is_file():
            named |= manifest_tables((index / history_name(fp)).read_bytes())
    # ... with its table; every table left is one a kept manifest names
    assert {f"sources/{p.name}" for p in first} == named
    assert len(named) == 2 * (HISTORY_KEEP + 1)  # tables and file lists
