from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mds.errors import ConfigError
from mds.planner.runtime.outputs import check_output


def test_same_file_through_a_hard_link(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text("x")
    os.link(tmp_path / "a.toml", tmp_path / "b")
    with pytest.raises(ConfigError, match="is the config file .*a.toml; choose another output"):
        check_output("-o", tmp_path / "b", [("config file", tmp_path / "a.toml")])


def test_directory_output_holding_an_input(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d/x.jsonl").write_text("{}")
    with pytest.raises(ConfigError, match="holds the source file"):
        check_output("-o", tmp_path, [("source file", tmp_path / "d/x.jsonl")], directory=True)


def test_unrelated_output_passes(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text("x")
    check_output("-o", tmp_path / "plan.mds", [("config file", tmp_path / "a.toml"), ("x", None)])


def _many(directory: Path, n: int = 12) -> list[Path]:
    """n files in one directory: enough for check_output to list the directory once."""
    directory.mkdir(parents=True, exist_ok=True)
    files = [directory / f"part-{i:02d}.jsonl" for i in range(n)]
    for i, f in enumerate(files):
        f.write_text("{}\n" * (i + 1))
    return files


def test_hard_link_or_symlink_to_one_of_many_files_in_a_directory(tmp_path: Path) -> None:
    files = _many(tmp_path / "data")
    inputs = [("source file", f) for f in files]
    os.link(files[7], tmp_path / "plan.mds")
    with pytest.raises(ConfigError, match="is the source file .*part-07.jsonl"):
        check_output("-o", tmp_path / "plan.mds", inputs)
    (tmp_path / "link.mds").symlink_to(files[3])
    with pytest.raises(ConfigError, match="is the source file .*part-03.jsonl"):
        check_output("-o", tmp_path / "link.mds", inputs)
    (tmp_path / "other.mds").write_text("x")
    check_output("-o", tmp_path / "other.mds", inputs)


def test_a_symlinked_input_among_many_is_judged_by_its_target(tmp_path: Path) -> None:
    files = _many(tmp_path / "data")
    target = tmp_path / "elsewhere.jsonl"
    target.write_text("{}\n")
    (tmp_path / "data" / "linked.jsonl").symlink_to(target)
    inputs = [("source file", f) for f in [*files, tmp_path / "data" / "linked.jsonl"]]
    with pytest.raises(ConfigError, match="is the source file .*linked.jsonl"):
        check_output("-o", target, inputs)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "inside.jsonl").write_text("{}\n")
    (tmp_path / "data" / "into-out.jsonl").symlink_to(tmp_path / "out" / "inside.jsonl")
    inputs.append(("source file", tmp_path / "data" / "into-out.jsonl"))
    with pytest.raises(ConfigError, match="holds the source file .*into-out.jsonl"):
        check_output("-o", tmp_path / "out", inputs, directory=True)


def test_directory_output_holding_many_inputs_through_a_symlinked_directory(
    tmp_path: Path,
) -> None:
    files = _many(tmp_path / "real" / "d")
    (tmp_path / "via").symlink_to(tmp_path / "real")
    inputs = [("source file", tmp_path / "via" / "d" / f.name) for f in files]
    with pytest.raises(ConfigError, match="holds the source file"):
        check_output("-o", tmp_path / "real", inputs, directory=True)
    (tmp_path / "index").mkdir()
    check_output("-o", tmp_path / "index", inputs, directory=True)


def test_a_listing_that_disagrees_with_stat_falls_back_to_stat(tmp_path: Path) -> None:
    """Some overlay file systems list inode numbers that stat does not give."""
    from mds.planner.runtime.outputs import _Inputs

    files = _many(tmp_path / "data")

    class Entry:
        def inode(self) -> int:
            return os.stat(files[0]).st_ino + 1

    dev = os.stat(tmp_path / "data").st_dev
    assert not _Inputs._consistent(dev, {files[0].name: Entry()}, files)
    entries = {e.name: e for e in os.scandir(tmp_path / "data")}
    assert _Inputs._consistent(dev, entries, files)


def test_index_inputs_lists_source_files_only_for_an_existing_output(tmp_path: Path) -> None:
    from mds.planner.runtime.outputs import index_inputs

    index = tmp_path / "index"
    index.mkdir()
    files = [{"path": f"d/part-{i}.jsonl"} for i in range(3)]
    manifest = {"root": str(tmp_path / "data"), "sources": [{"files": files}]}
    (index / "manifest.json").write_text(json.dumps(manifest))
    roles = [role for role, _ in index_inputs(index, tmp_path / "new.mds")]
    assert roles == ["index directory", "index manifest"]
    (tmp_path / "old.mds").write_text("x")
    inputs = index_inputs(index, tmp_path / "old.mds")
    assert [Path(p) for role, p in inputs if role == "source file"] == [
        tmp_path / "data" / f["path"] for f in files
    ]
