"""Index table bytes as the executor and planner read them: checked in the same read; a
source's file list (VERSION 2) as a table, read back as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mds.core.datacheck import escapes
from mds.core.index_manifest import (
    FILE_COLUMNS,
    OPTIONAL_FILE_COLUMNS,
    IndexManifest,
    file_list_bytes,
    file_list_table,
    identity_fingerprint,
    index_fingerprint,
    index_sources,
    read_manifest,
    read_table_bytes,
    table_checksum,
)
from mds.errors import IndexFormatError


def test_read_table_bytes_returns_the_bytes_it_checked(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    path.write_bytes(b"PAR1 table bytes PAR1")
    assert read_table_bytes(path, table_checksum(path)) == b"PAR1 table bytes PAR1"


def test_read_table_bytes_refuses_other_bytes(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    path.write_bytes(b"PAR1 table bytes PAR1")
    recorded = table_checksum(path)
    path.write_bytes(b"PAR1 table byteZ PAR1")
    with pytest.raises(IndexFormatError) as info:
        read_table_bytes(path, recorded)
    assert str(info.value) == (
        f"{path}: checksum {table_checksum(path)} differs from the manifest's {recorded}; "
        "the index is damaged: re-run `mds index` to rebuild the table from its sources, "
        "or delete the index"
    )


def test_read_table_bytes_of_a_missing_table(tmp_path: Path) -> None:
    with pytest.raises(IndexFormatError, match="gone.parquet: cannot read index table"):
        read_table_bytes(tmp_path / "gone.parquet", "blake2b:00")


def test_index_sources_give_each_source_its_global_id_range() -> None:
    manifest = IndexManifest(
        Path("idx"),
        {
            "sources": [
                {"name": "a", "rows": 3, "table_checksum": "x", "format": "jsonl"},
                {"name": "b", "rows": 5, "table_checksum": "y"},
            ]
        },
    )
    assert index_sources(manifest) == [
        {"name": "a", "base": 0, "rows": 3, "table_checksum": "x"},
        {"name": "b", "base": 3, "rows": 5, "table_checksum": "y"},
    ]


def test_identity_fingerprint_is_the_index_fingerprint_of_the_same_files() -> None:
    files = [("a/ü.jsonl", "sampled:01"), ('b "q".jsonl', "full:02")]
    sources = [
        {"name": "web", "table_checksum": "blake2b:aa", "rows": 3,
         "files": [{"path": p, "fingerprint": f, "id": i} for i, (p, f) in enumerate(files)]},
        {"name": "empty", "table_checksum": "blake2b:bb", "files": []},
    ]  # fmt: skip
    ident = [("web", "blake2b:aa", files), ("empty", "blake2b:bb", [])]
    assert identity_fingerprint(ident) == index_fingerprint(sources)
    assert identity_fingerprint(ident[:1]) != index_fingerprint(sources)


# --- VERSION 2: a source's file list as a table ------------------------------------------------


def _v2_index(tmp_path: Path, files: list[dict], **entry) -> Path:
    """An index directory whose one source's file list is the table of `files`."""
    columns = {n: [f.get(n) for f in files] for n in (*FILE_COLUMNS, *OPTIONAL_FILE_COLUMNS)}
    for n in OPTIONAL_FILE_COLUMNS:
        if all(v is None for v in columns[n]):
            columns[n] = None
    data = file_list_bytes(file_list_table(columns))
    (tmp_path / "sources").mkdir(parents=True, exist_ok=True)
    (tmp_path / "sources/s-files.parquet").write_bytes(data)
    (tmp_path / "sources/s.parquet").write_bytes(b"table")
    source = {
        "name": "s", "format": "jsonl", "table": "sources/s.parquet",
        "table_checksum": table_checksum(tmp_path / "sources/s.parquet"),
        "files_table": "sources/s-files.parquet",
        "files_checksum": table_checksum(tmp_path / "sources/s-files.parquet"),
        "rows": sum(f["rows"] for f in files), **entry,
    }  # fmt: skip
    manifest = {"format": "mds-index", "version": 2, "fingerprint": "blake2b:00", "root": "/r",
                "sources": [source]}  # fmt: skip
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path


# The keys of a file's dict, in a VERSION 1 manifest's order.
ORDER = ("id", "path", "index_path", "size", "mtime_ns", "fingerprint", "first_row", "rows",
         "tokens", "dropped_bad_images")  # fmt: skip

_FILES = st.lists(
    st.tuples(
        st.text(min_size=1, max_size=12).filter(lambda p: not escapes(p)),
        st.integers(0, 2**62),
        st.integers(-(2**62), 2**62),
        st.integers(0, 5),
        st.one_of(
            st.none(),
            st.text(max_size=5).map(lambda p: f"{p}.idx").filter(lambda p: not escapes(p)),
        ),
        st.one_of(st.none(), st.integers(0, 9)),
    ),
    max_size=8,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(_FILES, st.booleans(), st.booleans())
def test_a_file_list_reads_back_as_written(tmp_path: Path, drawn, idx: bool, drop: bool) -> None:
    """Any paths (unicode, quotes, separators), the optional columns or not: the dicts read
    from the table are the ones written, and the same files give the same bytes."""
    files, first = [], 0
    for i, (path, size, mtime, rows, index_path, dropped) in enumerate(drawn):
        item = {"id": i, "path": path, "size": size, "mtime_ns": mtime,
                "fingerprint": f"sampled:{i:032x}", "first_row": first, "rows": rows,
                "tokens": 3 * rows}  # fmt: skip
        if idx and index_path is not None:
            item["index_path"] = index_path
        if drop:
            item["dropped_bad_images"] = dropped or 0
        files.append(item)
        first += rows
    index = _v2_index(tmp_path / f"i{len(list(tmp_path.iterdir()))}", files)
    before = (index / "sources/s-files.parquet").read_bytes()
    manifest = read_manifest(index)
    expected = [{k: f[k] for k in ORDER if k in f} for f in files]
    assert manifest.source("s")["files"] == expected
    assert list(manifest.source("s")["files"][0]) == list(expected[0]) if files else True
    assert file_list_bytes(manifest.source("s").file_table()) == before


def test_a_v2_manifest_reads_its_file_list_only_when_asked(tmp_path: Path) -> None:
    files = [{"id": 0, "path": "a.jsonl", "size": 1, "mtime_ns": 2, "fingerprint": "sampled:x",
              "first_row": 0, "rows": 2, "tokens": 5}]  # fmt: skip
    index = _v2_index(tmp_path, files)
    (index / "sources/s-files.parquet").write_bytes(b"damaged")
    manifest = read_manifest(index)  # the manifest alone: read and checked
    assert index_sources(manifest)[0]["rows"] == 2
    with pytest.raises(IndexFormatError) as info:
        manifest.source("s")["files"]
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{index / 'sources/s-files.parquet'}: checksum ")
    assert "differs from the manifest's" in message


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"rows": 3}, "files hold 2 rows, the source 3"),
        ({"files_table": "../x.parquet"}, "files_table '../x.parquet' leaves the index directory"),
    ],
)
def test_a_v2_file_list_that_does_not_fit_its_source(tmp_path: Path, edit, says) -> None:
    files = [{"id": 0, "path": "a.jsonl", "size": 1, "mtime_ns": 2, "fingerprint": "sampled:x",
              "first_row": 0, "rows": 2, "tokens": 5}]  # fmt: skip
    index = _v2_index(tmp_path, files, **edit)
    with pytest.raises(IndexFormatError, match=re.escape(says)):
        read_manifest(index).source("s")["files"]


def test_a_v2_file_list_path_that_escapes_the_root_is_refused(tmp_path: Path) -> None:
    files = [{"id": 0, "path": "../../etc/passwd", "size": 1, "mtime_ns": 2,
              "fingerprint": "sampled:x", "first_row": 0, "rows": 2, "tokens": 5}]  # fmt: skip
    index = _v2_index(tmp_path, files)
    with pytest.raises(IndexFormatError, match="escapes the index root; refused, not read"):
        read_manifest(index).source("s")["files"]
