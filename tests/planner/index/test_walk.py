"""glob_entries lists what glob.glob(recursive=True) lists, in its order, with entries that
stat the same files: hidden names, symlinks, nested and unicode directories; glob_groups
lists the same, a directory at a time."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mds.planner.index.walk import cat, glob_entries, glob_groups

PATTERNS = [
    "**/*.jsonl",
    "**",
    "**/",
    "*",
    "*/*.jsonl",
    "a/**/*.jsonl",
    "a/**",
    "**/b/*",
    ".hid/*",
    "**/.h*",
    ".*/**/*",
    "d?/*.jsonl",
    "[ab]/*",
    "a/x.jsonl",
    "a/",
    "missing/*.jsonl",
    "a//*.jsonl",
    "**/*ü*",
    "*/link*/*",
    "**/*.[jp]*",
]


def _tree(root: Path) -> None:
    for name in (
        "a/x.jsonl",
        "a/.y.jsonl",
        "a/b/c.jsonl",
        "a/b/.hid/d.jsonl",
        "a/b/e.parquet",
        ".hid/f.jsonl",
        "d1/g.jsonl",
        "d2/ünï/h ü.jsonl",
        "b/k.jsonl",
        "top.jsonl",
    ):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")
    os.symlink(root / "a/b", root / "d1/linkdir")  # followed by ** as glob does
    os.symlink(root / "a/x.jsonl", root / "d1/linkfile.jsonl")
    os.symlink(root / "nowhere.jsonl", root / "d1/dangling.jsonl")
    os.mkfifo(root / "a/fifo.jsonl")


def _check(root: Path, pattern: str) -> None:
    got = glob_entries(pattern, str(root))
    assert [g for g, _ in got] == glob.glob(pattern, root_dir=root, recursive=True), pattern
    for g, entry in got:
        if entry is not None:  # the entry is of the file the match names
            assert os.path.normpath(entry.path) == os.path.normpath(cat(str(root), g))
            assert entry.stat(follow_symlinks=False) == os.lstat(cat(str(root), g))
    groups = glob_groups(pattern, str(root))
    if groups is not None:  # the same matches, with the same entries, a directory at a time
        flat = [(cat(d, name), e and e.path) for d, found in groups for name, e in found]
        assert flat == [(g, e and e.path) for g, e in got], pattern


@pytest.mark.parametrize("pattern", PATTERNS)
def test_same_matches_as_glob(tmp_path: Path, pattern: str) -> None:
    _tree(tmp_path)
    _check(tmp_path, pattern)


def test_absolute_pattern(tmp_path: Path) -> None:
    _tree(tmp_path)
    pattern = f"{tmp_path}/**/*.jsonl"
    assert [g for g, _ in glob_entries(pattern, "")] == glob.glob(pattern, recursive=True)


def test_groups_only_for_a_plain_last_part(tmp_path: Path) -> None:
    _tree(tmp_path)
    for pattern in ("**/*.jsonl", "*/*.jsonl", "a/*", "*.jsonl", "missing/*.jsonl"):
        assert glob_groups(pattern, str(tmp_path)) is not None, pattern
    for pattern in ("**", "a/**", "a/x.jsonl", "a/", "a//*.jsonl"):
        assert glob_groups(pattern, str(tmp_path)) is None, pattern


def test_cat_is_join() -> None:
    for a, b in [("", "x"), ("/", "x"), ("/a", "x/y"), ("a/", "x"), ("a", "x")]:
        assert cat(a, b) == os.path.join(a, b)


_NAMES = st.sampled_from(["a", "b", ".h", "ü", "x.jsonl", ".x.jsonl", "y.parquet", "sub dir"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.lists(st.lists(_NAMES, min_size=1, max_size=4), max_size=12),
    pattern=st.sampled_from(PATTERNS),
)
def test_random_trees(tmp_path_factory: pytest.TempPathFactory, files, pattern: str) -> None:
    root = tmp_path_factory.mktemp("tree")
    for parts in files:
        path = root.joinpath(*parts)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            pass  # a name already taken by a file or a directory
    _check(root, pattern)
