"""File discovery: globs, directories, save_to_disk, Megatron prefixes, and the errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from builders import source, write_megatron, write_save_to_disk
from literal_names import IDS, NAMES

from mds.errors import ConfigError, SourceDataError
from mds.planner.index.discover import DataFile, detect_format, discover


def _touch(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")


def _rels(root: Path, **table) -> list[str]:
    if not {"tokens", "count", "format"} & table.keys():
        table["tokens"] = "tokens"
    return [f.rel for f in discover(source(**table), root)]


def test_glob(tmp_path: Path) -> None:
    _touch(tmp_path, "web/b.parquet", "web/a.parquet", "web/notes.txt", "web/sub/c.parquet")
    files = discover(source(path="web/*.parquet", tokens="t"), tmp_path)
    assert [f.rel for f in files] == ["web/a.parquet", "web/b.parquet"]
    assert files[0] == DataFile((tmp_path / "web/a.parquet").resolve(), "web/a.parquet", "parquet")


def test_recursive_glob(tmp_path: Path) -> None:
    _touch(tmp_path, "web/a.parquet", "web/x/b.parquet", "web/x/y/c.parquet", "other/d.parquet")
    assert _rels(tmp_path, path="web/**/*.parquet") == [
        "web/a.parquet",
        "web/x/b.parquet",
        "web/x/y/c.parquet",
    ]


def test_list_of_patterns(tmp_path: Path) -> None:
    _touch(tmp_path, "a/1.jsonl", "b/2.jsonl", "c/3.jsonl")
    assert _rels(tmp_path, path=["c/3.jsonl", "a/*.jsonl"], count="n") == ["a/1.jsonl", "c/3.jsonl"]


def test_directory_takes_every_data_file_under_it(tmp_path: Path) -> None:
    _touch(
        tmp_path,
        "d/b.jsonl",
        "d/sub/a.jsonl",
        "d/README.md",
        "d/.hidden.jsonl",
        "d/_SUCCESS",
    )
    assert _rels(tmp_path, path="d", count="n") == ["d/b.jsonl", "d/sub/a.jsonl"]


def test_save_to_disk_directory(tmp_path: Path) -> None:
    write_save_to_disk(tmp_path / "wiki", [{"x": [1]}, {"x": [2]}])
    _touch(tmp_path, "wiki/cache-123.arrow")  # not listed in state.json: not data
    files = discover(source(path="wiki", tokens="x"), tmp_path)
    assert [f.rel for f in files] == [
        "wiki/data-00000-of-00002.arrow",
        "wiki/data-00001-of-00002.arrow",
    ]
    assert {f.format for f in files} == {"arrow"}


def test_bad_save_to_disk_state(tmp_path: Path) -> None:
    _touch(tmp_path, "wiki/data.arrow")
    (tmp_path / "wiki/state.json").write_text('{"no_files": []}')
    with pytest.raises(SourceDataError) as info:
        discover(source(path="wiki", tokens="x"), tmp_path)
    assert str(tmp_path / "wiki/state.json") in str(info.value)
    assert "not a readable save_to_disk state file" in str(info.value)


def test_megatron_prefix_without_extension(tmp_path: Path) -> None:
    write_megatron(tmp_path / "math/doc", [[1, 2]])
    (file,) = discover(source(path="math/doc"), tmp_path)
    assert file.rel == "math/doc.bin"
    assert file.format == "megatron"
    assert file.path == (tmp_path / "math/doc.bin").resolve()
    assert file.companion == (tmp_path / "math/doc.idx").resolve()


def test_megatron_idx_glob_pairs_each_bin(tmp_path: Path) -> None:
    write_megatron(tmp_path / "m/b", [[1]])
    write_megatron(tmp_path / "m/a", [[1]])
    files = discover(source(path="m/*.idx"), tmp_path)
    assert [(f.rel, f.companion.name) for f in files] == [
        ("m/a.bin", "a.idx"),
        ("m/b.bin", "b.idx"),
    ]
    # Both halves matched by one glob still give one file per dataset.
    assert [f.rel for f in discover(source(path="m/*"), tmp_path)] == ["m/a.bin", "m/b.bin"]


def test_megatron_prefix_with_dots(tmp_path: Path) -> None:
    write_megatron(tmp_path / "m/wiki.en_text_document", [[1]])
    for pattern in ("m/wiki.en_text_document", "m/*.idx", "m"):
        (file,) = discover(source(path=pattern), tmp_path)
        assert file.rel == "m/wiki.en_text_document.bin"
        assert file.companion.name == "wiki.en_text_document.idx"


@pytest.mark.parametrize("missing", [".bin", ".idx"])
@pytest.mark.parametrize("pattern", ["m/doc", "m/*"])
def test_megatron_missing_half(tmp_path: Path, missing: str, pattern: str) -> None:
    write_megatron(tmp_path / "m/doc", [[1]])
    (tmp_path / f"m/doc{missing}").unlink()
    with pytest.raises(SourceDataError) as info:
        discover(source(path=pattern), tmp_path)
    message = str(info.value)
    assert f"{tmp_path / 'm/doc'}{missing}: missing" in message
    assert "needs both .bin and .idx" in message


def test_glob_matching_nothing(tmp_path: Path) -> None:
    _touch(tmp_path, "web/a.parquet")
    with pytest.raises(ConfigError) as info:
        discover(source(name="web", path="web/*.jsonl", count="n"), tmp_path)
    assert "source 'web': `path` 'web/*.jsonl' matches no files under" in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'nope.parquet' matches no files"):
        discover(source(path="nope.parquet", tokens="t"), tmp_path)


def test_unknown_extension_needs_format(tmp_path: Path) -> None:
    _touch(tmp_path, "data.txt")
    with pytest.raises(ConfigError, match="cannot tell the format of .*data.txt.*set `format`"):
        discover(source(path="data.txt", count="n"), tmp_path)
    (file,) = discover(source(path="data.txt", count="n", format="jsonl"), tmp_path)
    assert file.format == "jsonl"


def test_mixed_formats(tmp_path: Path) -> None:
    _touch(tmp_path, "d/a.parquet", "d/b.jsonl")
    with pytest.raises(ConfigError) as info:
        discover(source(name="mix", path="d", tokens="t"), tmp_path)
    assert "source 'mix': files of several formats (jsonl, parquet)" in str(info.value)


def test_relative_path_outside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _touch(tmp_path, "x.parquet", "root/in.parquet")
    with pytest.raises(ConfigError) as info:
        discover(source(path="../x.parquet", tokens="t"), root)
    assert "is outside the data root" in str(info.value)
    assert "x.parquet" in str(info.value)


def test_absolute_path_outside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _touch(tmp_path, "elsewhere/x.parquet", "root/in.parquet")
    with pytest.raises(ConfigError, match="outside the data root"):
        discover(source(path=str(tmp_path / "elsewhere/x.parquet"), tokens="t"), root)
    # An absolute path inside the root is fine and stored relative to it.
    assert _rels(root, path=str(root / "in.parquet")) == ["in.parquet"]


def test_symlink_out_of_the_root_is_outside(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _touch(tmp_path, "elsewhere/x.parquet", "root/in.parquet")
    (root / "link.parquet").symlink_to(tmp_path / "elsewhere/x.parquet")
    with pytest.raises(ConfigError, match="outside the data root"):
        discover(source(path="*.parquet", tokens="t"), root)


def test_sorted_and_deduplicated(tmp_path: Path) -> None:
    _touch(tmp_path, "d/c.jsonl", "d/a.jsonl", "d/b.jsonl")
    rels = _rels(tmp_path, path=["d/c.jsonl", "d/*.jsonl", "d", "./d/a.jsonl"], count="n")
    assert rels == ["d/a.jsonl", "d/b.jsonl", "d/c.jsonl"]


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("a.parquet", "parquet"),
        ("a.PQ", "parquet"),
        ("a.jsonl", "jsonl"),
        ("a.json", "jsonl"),
        ("a.ndjson", "jsonl"),
        ("a.jsonl.zst", "jsonl.zst"),
        ("a.json.zst", "jsonl.zst"),
        ("a.arrow", "arrow"),
        ("a.feather", "arrow"),
        ("a.idx", "megatron"),
        ("a.bin", "megatron"),
        ("a.csv", None),
        ("a.zst", None),
    ],
)
def test_detect_format(name: str, fmt: str | None) -> None:
    assert detect_format(Path(name)) == fmt


def test_an_mds_index_is_never_a_source(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data/a.jsonl").write_text('{"n": 1}\n')
    (tmp_path / "old").mkdir()
    (tmp_path / "old/manifest.json").write_text('{"format": "mds-index", "version": 1}')
    (tmp_path / "old/t.jsonl").write_text('{"n": 1}\n')
    files = discover(source(path="**/*.jsonl", count="n"), tmp_path)
    assert [f.rel for f in files] == ["data/a.jsonl"]
    with pytest.raises(ConfigError, match="is inside the mds index"):
        discover(source(path="old/t.jsonl", count="n"), tmp_path)


def test_fifo_skipped_by_glob_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"n": 1}\n')
    os.mkfifo(tmp_path / "b.jsonl")
    assert [f.rel for f in discover(source(path="*.jsonl", count="n"), tmp_path)] == ["a.jsonl"]
    with pytest.raises(SourceDataError, match="a FIFO, not a regular file"):
        discover(source(path="b.jsonl", count="n"), tmp_path)


def test_save_to_disk_without_state_json(tmp_path: Path) -> None:
    (tmp_path / "wiki").mkdir()
    (tmp_path / "wiki/dataset_info.json").write_text("{}")
    (tmp_path / "wiki/data-00000-of-00001.arrow").write_bytes(b"")
    with pytest.raises(SourceDataError, match="save_to_disk directory without state.json"):
        discover(source(path="wiki", tokens="x"), tmp_path)


@pytest.mark.parametrize(("stem", "decoy"), NAMES, ids=IDS)
def test_an_existing_name_is_that_file_even_with_glob_characters(
    tmp_path: Path, stem: str, decoy: str | None
) -> None:
    _touch(tmp_path, f"d/{stem}.parquet", *([f"d/{decoy}.parquet"] if decoy else []))
    assert _rels(tmp_path, path=f"d/{stem}.parquet") == [f"d/{stem}.parquet"]
    assert _rels(tmp_path, path=str(tmp_path / "d" / f"{stem}.parquet")) == [f"d/{stem}.parquet"]


def test_a_name_that_does_not_exist_is_a_pattern(tmp_path: Path) -> None:
    _touch(tmp_path, "p1.parquet", "p2.parquet", "p3.parquet")
    assert _rels(tmp_path, path="p[12].parquet") == ["p1.parquet", "p2.parquet"]
    _touch(tmp_path, "p[12].parquet")
    assert _rels(tmp_path, path="p[12].parquet") == ["p[12].parquet"]


def test_glob_characters_in_the_root_are_literal(tmp_path: Path) -> None:
    root = tmp_path / "set[1]"
    _touch(root, "a.parquet", "b.parquet")
    _touch(tmp_path, "set1/c.parquet")
    assert _rels(root, path="*.parquet") == ["a.parquet", "b.parquet"]


def test_a_megatron_prefix_with_glob_characters(tmp_path: Path) -> None:
    write_megatron(tmp_path / "m[1]", [[1, 2, 3]])
    write_megatron(tmp_path / "m1", [[4]])
    assert _rels(tmp_path, path="m[1]", format="megatron") == ["m[1].bin"]


def test_glob_on_a_tricky_tree(tmp_path: Path) -> None:
    """What a glob discovers: glob's regular files (symlinks followed, hidden names and
    FIFOs left out), each with the stat that decides its reuse."""
    _touch(tmp_path, "a/x.jsonl", "a/.y.jsonl", "a/b/c.jsonl", "a/.h/d.jsonl", "ü/é z.jsonl")
    os.symlink(tmp_path / "a/b", tmp_path / "ü/linkdir")
    os.symlink(tmp_path / "a/x.jsonl", tmp_path / "ü/link.jsonl")
    os.symlink(tmp_path / "gone.jsonl", tmp_path / "ü/dangling.jsonl")
    os.mkfifo(tmp_path / "a/fifo.jsonl")
    files = discover(source(path="**/*.jsonl", tokens="t"), tmp_path)
    # a symlink is the file it leads to: each file once, under its resolved path
    assert [f.rel for f in files] == ["a/b/c.jsonl", "a/x.jsonl", "ü/é z.jsonl"]
    for f in files:
        st = os.stat(f.path)
        assert f.signature == (st.st_size, st.st_mtime_ns)
        assert f.path == (tmp_path / f.rel).resolve()
        assert f.text == str(f.path)


def test_data_file_is_a_value(tmp_path: Path) -> None:
    import pickle

    (tmp_path / "a.jsonl").write_bytes(b"x")
    path = (tmp_path / "a.jsonl").resolve()
    lazy = DataFile.local(str(path), "a.jsonl", "jsonl", None, (1, 2))
    eager = DataFile(path, "a.jsonl", "jsonl")
    assert lazy == eager and hash(lazy) == hash(eager)
    assert isinstance(lazy.path, Path) and lazy.path == path
    back = pickle.loads(pickle.dumps(lazy))  # noqa: S301  (how a Ray worker gets it)
    assert back == lazy and back.signature == (1, 2)
    assert lazy != DataFile(path, "a.jsonl", "parquet")


def _by_glob(root: Path, pattern: str) -> list[tuple[str, str, str | None, tuple[int, int]]]:
    """What discover should find, from glob.glob and a Path per file: (rel, resolved
    path, format by the name glob gives, (size, mtime_ns)) of each regular file, after
    symlinks, once by its resolved path."""
    import glob
    import stat

    out = {}
    for g in sorted(glob.glob(pattern, root_dir=root, recursive=True)):
        full = root / g
        try:
            st = os.stat(full)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            resolved = full.resolve()
            rel = resolved.relative_to(root.resolve()).as_posix()
            out[str(resolved)] = (
                rel,
                str(resolved),
                detect_format(full.name),
                (st.st_size, st.st_mtime_ns),
            )
    return sorted(out.values())


_DIRS = ["a", "b", ".h", "ü", "sub dir"]
_FILES = ["x.jsonl", "X.JSONL", ".x.jsonl", "y.tar.jsonl", "z.parquet"]


def test_glob_files_by_directory_match_a_path_per_file(tmp_path_factory) -> None:
    """discover places a glob's plain files by their directory and their format by their
    extension: the same as glob, a resolved Path and detect_format per file, on random
    trees with symlinks to files and directories (hypothesis)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    compared = []

    @settings(
        max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(
        files=st.lists(
            st.tuples(st.lists(st.sampled_from(_DIRS), max_size=3), st.sampled_from(_FILES)),
            max_size=12,
        ),
        links=st.lists(st.tuples(st.integers(0, 11), st.booleans()), max_size=3),
        pattern=st.sampled_from(["**/*.jsonl", "*/*.jsonl", "**/*.*", "a/**/*.JSONL", "*.*"]),
    )
    def check(files, links, pattern) -> None:
        root = tmp_path_factory.mktemp("tree")
        made = []
        for dirs, name in files:
            path = root.joinpath(*dirs, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * len(dirs))
            made.append(path)
        for k, to_file in links:  # in "a" or "lnk": to a file, or its directory (no cycle)
            if made:
                target = made[k % len(made)]
                where = root / ("a" if k % 2 else "lnk") / (f"l{k}.jsonl" if to_file else f"d{k}")
                if not to_file and target.parent in (root, where.parent, *where.parent.parents):
                    continue
                where.parent.mkdir(exist_ok=True)
                if not os.path.lexists(where):
                    os.symlink(target if to_file else target.parent, where)
        want = _by_glob(root, pattern)
        if not want:
            return
        compared.append(len(want))
        got = discover(source(path=pattern, tokens="t", format="jsonl"), root)
        assert [(f.rel, f.text, f.signature) for f in got] == [(r, t, s) for r, t, _, s in want]
        if len({fmt for _, _, fmt, _ in want}) == 1:  # one format: told by the names
            got = discover(source(path=pattern, tokens="t"), root)
            assert [(f.rel, f.text, f.format, f.signature) for f in got] == want

    check()
    assert len(compared) > 10
