"""Fault matrix: paths that are not data, outputs that are inputs, non-regular files.

Every row starts from the built data root of tests/faults/conftest.py (index at root/index,
plan at root/plan.mds) and asserts the one `error:` line, the exit code and the files on disk.

| row | how | expected outcome |
|---|---|---|
| **an index never ingests itself** | | |
| self-ingest-glob | `path = "**/*.parquet"`, count `n_tokens`, index at root/index, indexed 3 times | exit 0, rows 10, 10, 10 (the index's own tables are not data) |
| stray-file-in-index | index/notes.jsonl, forum `path = "**/*.jsonl"` | exit 0, forum rows stay 12 |
| directory-pattern-other-index | a second index at web/old-index, web `path = "web"` | exit 0, web rows stay 20 (it holds an mds manifest.json) |
| explicit-path-into-index | web `path = "index/sources"` | exit 1, `` `path` 'index/sources' is inside the mds index <root>/index `` |
| **outputs that are inputs** (refused before anything runs, inputs byte-identical) | | |
| plan-o-config | `mds plan mds.toml -o mds.toml` | exit 1, `-o <root>/mds.toml is the config file <root>/mds.toml; choose another output` |
| plan-o-symlink-config | `-o` a symlink to mds.toml | exit 1, `is the config file` |
| plan-o-hardlink-source | `-o` a hard link to forum.jsonl | exit 1, `is the source file` |
| plan-o-manifest / plan-o-index | `-o index/manifest.json`, `-o index` | exit 1, `is the index manifest` / `is the index directory` |
| index-o-source / index-o-root | `mds index -o forum/forum.jsonl`, `-o <root>` | exit 1, `is the source file` / `is the data root` |
| export-o-plan | `mds export plan.mds -o plan.mds` | exit 1, `is the plan file` |
| inspect-html-plan | `mds inspect plan.mds --html plan.mds` | exit 1, `is the inspected file` |
| **non-regular files** | | |
| fifo-in-glob | a FIFO `forum/extra.jsonl`, forum `path = "forum/*.jsonl"` | exit 0 at once (skipped), rows unchanged |
| fifo-explicit | forum `path = "forum/pipe.jsonl"`, a FIFO | exit 1, `forum/pipe.jsonl: a FIFO, not a regular file` |
| dir-named-like-file | forum `path = "forum/a.jsonl"`, an empty directory | exit 1, `is a directory with no data files in it` |
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from builders import config_file, write_parquet
from cli_helpers import mds, one_error_line
from fault_builders import names, tree


def _set_path(root: Path, source: str, path: str) -> None:
    """Point one [[source]]'s `path` elsewhere in root/mds.toml."""
    toml = root / "mds.toml"
    lines = toml.read_text().splitlines()
    current = None
    for i, line in enumerate(lines):
        if line.startswith("name = "):
            current = line.split('"')[1]
        if current == source and line.startswith("path = "):
            lines[i] = f"path = {json.dumps(path)}"
    toml.write_text("\n".join(lines) + "\n")


def _rows(root: Path, index: str = "index") -> dict[str, int]:
    result = mds("index", root / "mds.toml", "-o", root / index, "--json")
    assert result.exit_code == 0, result.output
    return {s["name"]: s["rows"] for s in json.loads(result.stdout)["sources"]}


# --- an index never ingests itself --------------------------------------------------------------


SELF_TOML = """
[index]
output = "index"

[[source]]
name = "all"
path = "**/*.parquet"
count = "n_tokens"
"""


def test_self_ingest_glob(tmp_path: Path) -> None:
    """The index's own tables have an `n_tokens` column: a glob over the root would take
    them as data and the rows would grow with every run (10 -> 20 -> 30)."""
    write_parquet(tmp_path / "a/x.parquet", {"n_tokens": list(range(1, 11))})
    config_file(tmp_path, SELF_TOML)
    assert [_rows(tmp_path)["all"] for _ in range(3)] == [10, 10, 10]


def test_stray_file_inside_the_index_is_not_data(root: Path) -> None:
    (root / "index" / "notes.jsonl").write_text('{"ids": [1, 2]}\n')
    _set_path(root, "forum", "**/*.jsonl")
    assert _rows(root)["forum"] == 12


def test_directory_pattern_skips_another_index(root: Path) -> None:
    assert mds("index", root / "mds.toml", "-o", root / "web/old-index").exit_code == 0
    _set_path(root, "web", "web")  # a directory: every data file under it
    assert _rows(root)["web"] == 20
    assert _rows(root)["web"] == 20


def test_explicit_path_into_index(root: Path) -> None:
    before = tree(root / "index")
    _set_path(root, "web", "index/sources")
    result = mds("index", root / "mds.toml")
    one_error_line(result, "`path` 'index/sources' is inside the mds index", str(root / "index"))
    assert tree(root / "index") == before


# --- outputs that are inputs --------------------------------------------------------------------


def _refused(root: Path, args: list, *needles: str) -> None:
    before = tree(root)
    result = mds(*args)
    line = one_error_line(result, *needles, "choose another output")
    assert tree(root) == before, line


def test_plan_o_config(root: Path) -> None:
    cfg = root / "mds.toml"
    _refused(root, ["plan", cfg, "-o", cfg], f"-o {cfg} is the config file {cfg};")


def test_plan_o_symlink_to_config(root: Path) -> None:
    (root / "link.toml").symlink_to(root / "mds.toml")
    _refused(root, ["plan", root / "mds.toml", "-o", root / "link.toml"], "is the config file")


def test_plan_o_hardlink_to_source(root: Path) -> None:
    os.link(root / "forum/forum.jsonl", root / "hard.jsonl")
    _refused(root, ["plan", root / "mds.toml", "-o", root / "hard.jsonl"], "is the source file")


@pytest.mark.parametrize(
    "target, role",
    [("index/manifest.json", "is the index manifest"), ("index", "is the index directory")],
)
def test_plan_o_index(root: Path, target: str, role: str) -> None:
    _refused(root, ["plan", root / "mds.toml", "-o", root / target], role)


@pytest.mark.parametrize(
    "target, role", [("forum/forum.jsonl", "is the source file"), (".", "is the data root")]
)
def test_index_o_input(root: Path, target: str, role: str) -> None:
    _refused(root, ["index", root / "mds.toml", "-o", root / target], role)


def test_export_o_plan(root: Path) -> None:
    plan = root / "plan.mds"
    _refused(root, ["export", plan, "-o", plan], f"-o {plan} is the plan file")


def test_inspect_html_plan(root: Path) -> None:
    plan = root / "plan.mds"
    _refused(root, ["inspect", plan, "--html", plan], f"--html {plan} is the inspected file")


# --- non-regular files --------------------------------------------------------------------------


def test_fifo_in_glob_is_skipped(root: Path) -> None:
    os.mkfifo(root / "forum/extra.jsonl")
    _set_path(root, "forum", "forum/*.jsonl")
    assert _rows(root)["forum"] == 12


def test_fifo_explicit_is_an_error(root: Path) -> None:
    os.mkfifo(root / "forum/pipe.jsonl")
    _set_path(root, "forum", "forum/pipe.jsonl")
    before = tree(root / "index")
    one_error_line(mds("index", root / "mds.toml"), "forum/pipe.jsonl: a FIFO, not a regular file")
    assert tree(root / "index") == before
    assert not any(".tmp-" in n for n in names(root / "index"))


def test_directory_named_like_a_file(root: Path) -> None:
    (root / "forum/a.jsonl").mkdir()
    _set_path(root, "forum", "forum/a.jsonl")
    one_error_line(mds("index", root / "mds.toml"), "is a directory with no data files in it")
