"""src/mds/planner/index/reuse.py: which files keep their rows from the previous index, and
which outputs a build refuses to replace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import data_file, source
from hypothesis import given, settings
from hypothesis import strategies as st

from mds.core.fingerprint import hashes_every_byte
from mds.core.index_manifest import file_list_table
from mds.errors import ConfigError
from mds.planner.index.discover import DataFile
from mds.planner.index.reuse import (
    Recorded,
    known_fingerprints,
    previous_index,
    recorded_fingerprint,
    reused_files,
    spec_key,
)

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


# Per-file statements of what known_fingerprints and reused_files compute as columns.
def _known_one(f, old, mode, sig):
    j = old.by_path.get(f.rel) if old is not None else None
    if j is None or not old.fingerprints[j].startswith(f"{mode}:"):
        return None, (sig, None)
    before = (old.sizes[j], old.mtimes[j], old.fingerprints[j])
    fp = recorded_fingerprint(f, mode, sig, before)
    return fp, None if fp is not None else (sig, before)


def _reused_one(f, fp, old):
    size, mtime, print_, nbytes = fp
    j = old.by_path.get(f.rel)
    if j is None or old.sizes[j] != size or old.fingerprints[j] != print_:
        return None
    if old.mtimes[j] == mtime or hashes_every_byte(print_, size, nbytes - size):
        return old.ids[j]
    return None


_PATHS = st.sampled_from(["a.jsonl", "b.jsonl", "c/d.jsonl", "e.jsonl", "ü.jsonl"])
_SIZE = st.sampled_from([0, SMALL, BIG])
_MTIME = st.sampled_from([0, 1, 2])
_PRINT = st.sampled_from(["sampled:aa", "sampled:bb", "full:aa", "full:cc"])


@settings(max_examples=300, deadline=None)
@given(
    recorded=st.lists(st.tuples(_PATHS, _SIZE, _PRINT, _MTIME), max_size=6),
    found=st.lists(
        st.tuples(_PATHS, st.none() | st.tuples(_SIZE, _MTIME), _PRINT, st.booleans()),
        max_size=6,
        unique_by=lambda t: t[0],
    ),
    mode=st.sampled_from(["sampled", "full"]),
    companion=st.booleans(),
    empty=st.booleans(),
)
def test_files_compared_as_columns_as_one_by_one(recorded, found, mode, companion, empty) -> None:
    """known_fingerprints and reused_files (columns) give what the per-file rules give, on
    drawn file lists: paths recorded twice, no stat, mtime 0, a Megatron companion, a
    previous file list that is empty (`empty`) or missing."""
    old = _old("k", *recorded) if recorded or empty else None
    files = [
        DataFile(Path("/r") / p, p, "jsonl", Path("/r/x.idx") if companion else None, sig)
        for p, sig, _, _ in found
    ]
    fps, hints = known_fingerprints(files, old, mode)
    want = [_known_one(f, old, mode, f.signature) for f in files]
    assert fps == [w[0] for w in want]
    assert hints == [w[1] for w in want if w[1] is not None]
    if old is None or not old.unique:
        return
    # every file fingerprinted: what it has now, or what the listing said, and a fingerprint
    done = [
        fp or (*(f.signature or (SMALL, 1)), print_, (f.signature or (SMALL, 1))[0] + more)
        for f, fp, (_, _, print_, more) in zip(files, fps, found, strict=True)
    ]
    got = reused_files(source(count="n"), files, done, "k", old)
    assert [g.reuse for g in got] == [_reused_one(f, fp, old) for f, fp in zip(files, done, strict=True)]
    assert [(g.data, g.size, g.mtime_ns, g.fingerprint, g.nbytes) for g in got] == [
        (f, *fp) for f, fp in zip(files, done, strict=True)
    ]
