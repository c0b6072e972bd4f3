"""`build_index` end to end: the manifest and tables of a multi-source build, incremental
re-runs, atomic failure, and the errors a user can cause."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from builders import (
    CODE,
    FORUM,
    MATH,
    MULTI_TOML,
    WIKI,
    config_file,
    multi_source,
    snapshot,
    web_part,
    write_jsonl,
    write_parquet,
)
from index_files import manifest_with_files, write_v1

from mds.core.fingerprint import fingerprint
from mds.errors import ConfigError, IndexFormatError, SourceDataError
from mds.planner.index import build, publish, source_table
from mds.planner.index.build import build_index
from mds.planner.index.config import load_config
from mds.planner.index.tables import index_fingerprint, index_tables, read_manifest, source_frame

WEB = [web_part(i) for i in range(3)]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    multi_source(tmp_path / "data")
    return tmp_path / "data"


@pytest.fixture
def scanned(monkeypatch) -> list[str]:
    """Records the relative path of every file a scanner is called on."""
    seen: list[str] = []
    lock = threading.Lock()
    for fmt, scan in list(source_table.SCANNERS.items()):

        def wrapper(file, ctx, _scan=scan):
            with lock:
                seen.append(file.rel)
            return _scan(file, ctx)

        monkeypatch.setitem(source_table.SCANNERS, fmt, wrapper)
    for fmt, scan in list(source_table.BATCH_SCANNERS.items()):

        def batch_wrapper(files, ctx, _scan=scan):
            got = _scan(files, ctx)
            if got is not None:
                with lock:
                    seen.extend(f.rel for f in files)
            return got

        monkeypatch.setitem(source_table.BATCH_SCANNERS, fmt, batch_wrapper)
    return seen


def _build(root: Path, **kwargs):
    return build_index(load_config(root / "mds.toml"), **kwargs)


def _manifest(index: Path) -> dict:
    return manifest_with_files(index)


def _table(index: Path, name: str) -> pl.DataFrame:
    return source_frame(read_manifest(index), name).collect()


def _per_file_rows(index: Path, name: str) -> dict[str, list[dict]]:
    """Rows of one source grouped by file path (file_id dropped), to compare across builds."""
    entry = read_manifest(index).source(name)
    paths = {f["id"]: f["path"] for f in entry["files"]}
    table = _table(index, name)
    out: dict[str, list[dict]] = {}
    for row in table.iter_rows(named=True):
        out.setdefault(paths[row.pop("file_id")], []).append(row)
    return out


def _rewrite(path: Path, data: bytes) -> None:
    """Replace the content and make sure the mtime moves too (coarse clocks)."""
    old = path.stat().st_mtime_ns
    path.write_bytes(data)
    if path.stat().st_mtime_ns == old:
        os.utime(path, ns=(old + 1_000_000, old + 1_000_000))


# --- a full build ----------------------------------------------------------------------------


def test_multi_source_build_and_manifest(root: Path, scanned: list[str]) -> None:
    summary = _build(root, workers=2)
    index = root / "index"  # [index] output, relative to the config file
    assert summary.path == str(index)
    assert sorted(scanned) == sorted(
        [f"web/part-{i:05d}.parquet" for i in range(3)]
        + ["forum/forum.jsonl", "code/code-00000.jsonl.zst", "code/code-00001.jsonl.zst"]
        + ["wiki/data-00000-of-00001.arrow", "math/math_text_document.bin"]
    )

    m = _manifest(index)
    assert m["format"] == "mds-index"
    assert m["version"] == 2
    assert m["root"] == str(root.resolve())
    assert m["fingerprint_mode"] == "sampled"
    assert m["fingerprint"] == summary.fingerprint == index_fingerprint(m["sources"])
    assert [s["name"] for s in m["sources"]] == ["web", "forum", "code", "wiki", "math"]
    by_name = {s["name"]: s for s in m["sources"]}

    for entry in m["sources"]:
        table_path = index / entry["table"]
        data = table_path.read_bytes()
        assert (
            entry["table_checksum"]
            == "blake2b:" + hashlib.blake2b(data, digest_size=16).hexdigest()
        )
        table = pl.read_parquet(table_path)
        assert entry["rows"] == table.height == sum(f["rows"] for f in entry["files"])
        assert (
            entry["tokens"] == table["n_tokens"].sum() == sum(f["tokens"] for f in entry["files"])
        )
        first = 0
        for i, f in enumerate(entry["files"]):
            assert f["id"] == i
            assert f["first_row"] == first
            rows = table.filter(pl.col("file_id") == i)
            assert f["rows"] == rows.height
            assert f["tokens"] == rows["n_tokens"].sum()
            assert rows["file_row"].to_list() == list(range(rows.height))  # no blank lines here
            data_path = root / f["path"]
            assert f["size"] == data_path.stat().st_size
            assert f["mtime_ns"] == data_path.stat().st_mtime_ns
            expected_fp = fingerprint(data_path)
            if "index_path" in f:
                expected_fp += "+" + fingerprint(root / f["index_path"]).split(":", 1)[1]
            assert f["fingerprint"] == expected_fp
            first += f["rows"]
        # Rows are in file order.
        assert table["file_id"].to_list() == sorted(table["file_id"].to_list())
        assert entry["length_stats"]["max"] == table["n_tokens"].max()

    web = by_name["web"]
    assert [f["path"] for f in web["files"]] == [f"web/part-{i:05d}.parquet" for i in range(3)]
    table = _table(index, "web")
    assert table.columns == ["file_id", "file_row", "offset", "n_tokens", "lang", "quality"]
    assert table["n_tokens"].to_list() == [
        len(t) for part in WEB for t in part["tokens"].to_pylist()
    ]
    assert table["lang"].to_list() == [x for part in WEB for x in part["lang"]]
    assert table["file_id"].to_list() == [0] * 4 + [1] * 4 + [2] * 4
    assert web["length"] == {"kind": "tokens", "exact": True, "column": "tokens"}
    assert web["payload"] == {"kind": "token_ids", "column": "tokens", "offsets": "row_group"}
    assert web["keep"] == {"lang": "String", "quality": "Float64"}

    forum = _table(index, "forum")
    assert forum.columns == ["file_id", "file_row", "offset", "length", "n_tokens", "lang"]
    raw = (root / "forum/forum.jsonl").read_bytes()
    assert [
        json.loads(raw[o : o + n]) for o, n in zip(forum["offset"], forum["length"], strict=True)
    ] == FORUM
    assert by_name["forum"]["payload"] == {"kind": "text", "column": "text"}
    assert by_name["forum"]["length"]["exact"] is True

    code = by_name["code"]
    assert code["length"] == {
        "kind": "estimate",
        "exact": False,
        "column": "content",
        "rule": "bytes/4",
    }
    assert code["payload"] == {"kind": "text", "column": "content"}
    expected = [-(-len(r["content"].encode()) // 4) for part in CODE for r in part]
    assert _table(index, "code")["n_tokens"].to_list() == expected

    assert _table(index, "wiki")["n_tokens"].to_list() == [len(r["input_ids"]) for r in WIKI]
    assert by_name["wiki"]["payload"] == {"kind": "token_ids", "column": "input_ids"}

    math = by_name["math"]
    assert math["format"] == "megatron"
    assert math["files"][0]["path"] == "math/math_text_document.bin"
    assert math["files"][0]["index_path"] == "math/math_text_document.idx"
    assert math["length"] == {"kind": "megatron", "exact": True}
    assert _table(index, "math")["n_tokens"].to_list() == [len(s) for s in MATH]

    # The summary agrees with the manifest.
    js = summary.to_json()
    assert js["rows"] == sum(s["rows"] for s in m["sources"])
    assert js["tokens"] == sum(s["tokens"] for s in m["sources"])
    assert js["files"] == js["files_scanned"] == 8
    assert [s.exact for s in summary.sources] == [True, True, False, True, True]
    # Only live tables are in the index directory, and no temporary files.
    assert sorted(p.name for p in (index / "sources").iterdir()) == sorted(
        Path(s[k]).name for s in m["sources"] for k in ("table", "files_table")
    )


def test_output_argument_wins_and_defaults_to_root_index(root: Path, tmp_path: Path) -> None:
    summary = _build(root, output=tmp_path / "elsewhere")
    assert summary.path == str(tmp_path / "elsewhere")
    assert (tmp_path / "elsewhere/manifest.json").is_file()
    config_file(root, MULTI_TOML.replace('output = "index"\n', ""), "noout.toml")
    build_index(load_config(root / "noout.toml"))
    assert read_manifest(root / "index").data["version"] == 2


@pytest.mark.parametrize("linked", ["out/inside.jsonl", "out/deeper/inside.jsonl"])
def test_an_output_inside_the_root_that_holds_a_source_file_is_refused(
    tmp_path: Path, linked: str
) -> None:
    """A file reached through a symlink into the output (a directory under the data root,
    left out by discovery) is a source the build would overwrite: refused by name."""
    for name in ("data/a.jsonl", "data/z.jsonl", linked, "outside/b.jsonl"):
        write_jsonl(tmp_path / name, [{"text": "x y"}])
    (tmp_path / "data/m.jsonl").symlink_to(tmp_path / linked)
    (tmp_path / "data/o.jsonl").symlink_to(tmp_path / "outside/b.jsonl")
    toml = '[[source]]\nname = "s"\npath = "data/*.jsonl"\nestimate = "bytes/4"\ntext = "text"\n'
    config_file(tmp_path, toml)
    with pytest.raises(ConfigError, match=f"holds the source file {tmp_path / linked}; choose"):
        build_index(load_config(tmp_path / "mds.toml"), tmp_path / "out")
    (tmp_path / "data/m.jsonl").unlink()
    shutil.rmtree(tmp_path / "out")
    build_index(load_config(tmp_path / "mds.toml"), tmp_path / "out")  # "outside" is no output
    assert [f["path"] for f in _manifest(tmp_path / "out")["sources"][0]["files"]] == [
        "data/a.jsonl", "data/z.jsonl", "outside/b.jsonl"
    ]


def test_full_fingerprint_mode(root: Path) -> None:
    config_file(root, MULTI_TOML.replace("[index]\n", '[index]\nfingerprint = "full"\n'))
    _build(root)
    m = _manifest(root / "index")
    assert m["fingerprint_mode"] == "full"
    assert all(f["fingerprint"].startswith("full:") for s in m["sources"] for f in s["files"])


# --- incremental -----------------------------------------------------------------------------


def test_second_run_scans_nothing_and_changes_nothing(root: Path, scanned: list[str]) -> None:
    first = _build(root)
    before = snapshot(root / "index")
    scanned.clear()
    second = _build(root)
    assert scanned == []
    assert [s.files_scanned for s in second.sources] == [0] * 5
    assert second.bytes_scanned == 0
    assert second.fingerprint == first.fingerprint
    assert snapshot(root / "index") == before


def test_rewritten_file_is_the_only_one_rescanned(root: Path, scanned: list[str]) -> None:
    _build(root)
    old_rows = _per_file_rows(root / "index", "web")
    old_forum = _table(root / "index", "forum")
    target = root / "web/part-00001.parquet"
    write_parquet(target, web_part(1, rows=6, offset=5))
    scanned.clear()
    summary = _build(root)
    assert scanned == ["web/part-00001.parquet"]
    assert [s.files_scanned for s in summary.sources] == [1, 0, 0, 0, 0]
    rows = _per_file_rows(root / "index", "web")
    assert rows["web/part-00000.parquet"] == old_rows["web/part-00000.parquet"]
    assert rows["web/part-00002.parquet"] == old_rows["web/part-00002.parquet"]
    assert [r["n_tokens"] for r in rows["web/part-00001.parquet"]] == [
        len(t) for t in web_part(1, rows=6, offset=5)["tokens"].to_pylist()
    ]
    files = read_manifest(root / "index").source("web")["files"]
    assert [f["first_row"] for f in files] == [0, 4, 10]
    assert [f["rows"] for f in files] == [4, 6, 4]
    assert _table(root / "index", "forum").equals(old_forum)
    # A table and a file list per source, and the old web table and file list, which the
    # replaced manifest (kept under history/ for plans made from it) still names.
    assert len(list((root / "index/sources").iterdir())) == 12
    assert len(list((root / "index/history").iterdir())) == 1


def test_same_size_rewrite_is_detected(root: Path, scanned: list[str]) -> None:
    _build(root)
    path = root / "forum/forum.jsonl"
    data = path.read_bytes()
    _rewrite(path, data.replace(b'"n": 5', b'"n": 7'))
    scanned.clear()
    _build(root)
    assert scanned == ["forum/forum.jsonl"]
    assert _table(root / "index", "forum")["n_tokens"].to_list() == [7, 0, 12]


def test_added_file(root: Path, scanned: list[str]) -> None:
    _build(root)
    old_rows = _per_file_rows(root / "index", "web")
    write_parquet(root / "web/part-00000a.parquet", web_part(9, rows=2))
    scanned.clear()
    _build(root)
    assert scanned == ["web/part-00000a.parquet"]
    entry = read_manifest(root / "index").source("web")
    assert [f["path"] for f in entry["files"]] == [
        "web/part-00000.parquet",
        "web/part-00000a.parquet",
        "web/part-00001.parquet",
        "web/part-00002.parquet",
    ]
    rows = _per_file_rows(root / "index", "web")
    for path, old in old_rows.items():
        assert rows[path] == old
    table = _table(root / "index", "web")
    assert table["file_id"].to_list() == [0] * 4 + [1] * 2 + [2] * 4 + [3] * 4
    assert entry["rows"] == 14


def test_removed_file(root: Path, scanned: list[str]) -> None:
    _build(root)
    old_rows = _per_file_rows(root / "index", "web")
    (root / "web/part-00000.parquet").unlink()
    scanned.clear()
    _build(root)
    assert scanned == []
    entry = read_manifest(root / "index").source("web")
    assert [f["path"] for f in entry["files"]] == [
        "web/part-00001.parquet",
        "web/part-00002.parquet",
    ]
    assert [f["first_row"] for f in entry["files"]] == [0, 4]
    rows = _per_file_rows(root / "index", "web")
    assert rows == {k: v for k, v in old_rows.items() if k != "web/part-00000.parquet"}
    assert _table(root / "index", "web")["file_id"].to_list() == [0] * 4 + [1] * 4


@pytest.mark.parametrize(
    ("old", "new", "rescanned"),
    [
        ('keep = ["lang", "quality"]', 'keep = ["quality"]', "web"),
        ('keep = ["lang"]\n\n[[source]]\nname = "code"', '\n[[source]]\nname = "code"', "forum"),
        ('estimate = "bytes/4"', 'estimate = "chars/3"', "code"),
        ('count = "n"', 'estimate = "bytes/4"', "forum"),
    ],
    ids=["keep-web", "keep-forum", "estimate-rule", "length-kind"],
)
def test_changed_source_settings_rescan_that_source(
    root: Path, scanned: list[str], old: str, new: str, rescanned: str
) -> None:
    _build(root)
    text = (root / "mds.toml").read_text()
    assert old in text
    config_file(root, text.replace(old, new, 1))
    scanned.clear()
    summary = _build(root)
    counts = {s.name: s.files_scanned for s in summary.sources}
    files = {s.name: s.files for s in summary.sources}
    assert counts == {name: (files[name] if name == rescanned else 0) for name in counts}
    assert len(scanned) == files[rescanned]


def test_changed_keep_changes_the_table(root: Path) -> None:
    _build(root)
    text = (root / "mds.toml").read_text()
    config_file(root, text.replace('keep = ["lang", "quality"]', 'keep = ["quality", "lang"]'))
    _build(root)
    assert _table(root / "index", "web").columns == [
        "file_id",
        "file_row",
        "offset",
        "n_tokens",
        "quality",
        "lang",
    ]


def test_changed_tokenizer_rescans(tmp_path: Path, scanned: list[str]) -> None:
    pytest.importorskip("tokenizers")
    from builders import write_tokenizer

    write_tokenizer(tmp_path / "tok.json", ["a", "b"])
    write_jsonl(tmp_path / "d.jsonl", [{"text": "a b c"}, {"text": "a"}])
    config_file(
        tmp_path,
        '[[source]]\nname = "t"\npath = "d.jsonl"\ntext = "text"\ntokenizer = "tok.json"\n',
    )
    build_index(load_config(tmp_path / "mds.toml"))
    scanned.clear()
    build_index(load_config(tmp_path / "mds.toml"))
    assert scanned == []
    write_tokenizer(tmp_path / "tok.json", ["a", "b", "c", "d"])
    build_index(load_config(tmp_path / "mds.toml"))
    assert scanned == ["d.jsonl"]
    assert _table(tmp_path / "index", "t")["n_tokens"].to_list() == [3, 1]


# --- atomicity -------------------------------------------------------------------------------


def _fail_after_first(monkeypatch, fmt: str) -> None:
    real = source_table.SCANNERS[fmt]
    calls = {"n": 0}
    lock = threading.Lock()

    def flaky(file, ctx):
        with lock:
            calls["n"] += 1
            n = calls["n"]
        if n > 1:
            raise SourceDataError(f"{file.rel}: injected failure")
        return real(file, ctx)

    monkeypatch.setitem(source_table.SCANNERS, fmt, flaky)


def _change_every_web_file(root: Path) -> None:
    for i in range(3):
        write_parquet(root / f"web/part-{i:05d}.parquet", web_part(i, rows=5, offset=1))


def test_scanner_failure_leaves_the_previous_index_untouched(root: Path, monkeypatch) -> None:
    _build(root)
    before = snapshot(root / "index")
    _change_every_web_file(root)
    write_jsonl(root / "forum/forum.jsonl", FORUM[:2])  # a second source is rewritten too
    _fail_after_first(monkeypatch, "parquet")
    with pytest.raises(SourceDataError, match="injected failure"):
        _build(root, workers=1)
    assert snapshot(root / "index") == before


def test_scanner_failure_leaves_no_fresh_output(root: Path, tmp_path: Path, monkeypatch) -> None:
    _fail_after_first(monkeypatch, "parquet")
    with pytest.raises(SourceDataError, match="injected failure"):
        _build(root, output=tmp_path / "fresh", workers=1)
    assert not (tmp_path / "fresh").exists()


def _interrupt(path, manifest):
    raise KeyboardInterrupt


def test_interrupt_before_the_manifest_leaves_the_previous_index(root: Path, monkeypatch) -> None:
    _build(root)
    before = snapshot(root / "index")
    _change_every_web_file(root)
    monkeypatch.setattr(build, "write_manifest", _interrupt)
    rolled_back: list[Path] = []
    real_rollback = publish.TableWriter.rollback

    def rollback(self) -> None:
        rolled_back.extend(self.created)
        real_rollback(self)

    monkeypatch.setattr(publish.TableWriter, "rollback", rollback)
    with pytest.raises(KeyboardInterrupt):
        _build(root)
    # The new web table and file list were written, then removed again; the old ones are
    # still there.
    assert [p.name.split("-")[0] for p in rolled_back] == ["web", "web"]
    assert not any(p.exists() for p in rolled_back)
    assert snapshot(root / "index") == before
    monkeypatch.undo()
    _build(root)
    assert _table(root / "index", "web").height == 15


def test_interrupt_leaves_no_fresh_output(root: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(build, "write_manifest", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        _build(root, output=tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


def test_error_after_discovery_leaves_an_existing_empty_dir(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "empty-out"
    out.mkdir()
    (root / "math/math_text_document.bin").write_bytes(b"\0")  # wrong size
    with pytest.raises(SourceDataError, match="math_text_document.bin: Megatron .bin is 1 bytes"):
        _build(root, output=out)
    assert out.is_dir()
    assert snapshot(out) == {}


# --- errors end to end -----------------------------------------------------------------------


def _one_source(tmp_path: Path, body: str) -> Path:
    return config_file(tmp_path, "[[source]]\n" + body)


def test_empty_source(tmp_path: Path) -> None:
    table = pa.table({"tokens": pa.array([], pa.list_(pa.int32()))})
    write_parquet(tmp_path / "e/empty.parquet", table)
    _one_source(tmp_path, 'name = "e"\npath = "e/*.parquet"\ntokens = "tokens"\n')
    with pytest.raises(SourceDataError) as info:
        build_index(load_config(tmp_path / "mds.toml"))
    assert "source 'e': no samples in its 1 file(s)" in str(info.value)
    assert "e/empty.parquet" in str(info.value)
    assert not (tmp_path / "index").exists()


def test_an_empty_file_in_a_source_is_fine(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d/a.jsonl", [{"n": 1, "lang": "en"}])
    (tmp_path / "d/b.jsonl").write_bytes(b"")
    write_jsonl(tmp_path / "d/c.jsonl", [{"n": 2, "lang": "fr"}])
    _one_source(tmp_path, 'name = "d"\npath = "d"\ncount = "n"\nkeep = ["lang"]\n')
    build_index(load_config(tmp_path / "mds.toml"))
    entry = read_manifest(tmp_path / "index").source("d")
    assert [f["rows"] for f in entry["files"]] == [1, 0, 1]
    assert _table(tmp_path / "index", "d")["lang"].to_list() == ["en", "fr"]


def test_schema_drift_between_files_names_both(tmp_path: Path) -> None:
    write_parquet(tmp_path / "w/a.parquet", {"n": [1, 2], "lang": ["en", "fr"]})
    write_parquet(tmp_path / "w/b.parquet", {"n": [3], "lang": pa.array([7], pa.int64())})
    _one_source(tmp_path, 'name = "w"\npath = "w/*.parquet"\ncount = "n"\nkeep = ["lang"]\n')
    with pytest.raises(SourceDataError) as info:
        build_index(load_config(tmp_path / "mds.toml"))
    message = str(info.value)
    assert message.startswith("w/b.parquet: column `lang` has type Int64 but String in w/a.parquet")
    assert "schema drift inside source 'w'" in message


def test_all_null_kept_column_adapts(tmp_path: Path) -> None:
    write_parquet(tmp_path / "w/a.parquet", {"n": [1], "lang": pa.array([None], pa.null())})
    write_parquet(tmp_path / "w/b.parquet", {"n": [3], "lang": ["en"]})
    _one_source(tmp_path, 'name = "w"\npath = "w/*.parquet"\ncount = "n"\nkeep = ["lang"]\n')
    build_index(load_config(tmp_path / "mds.toml"))
    assert _table(tmp_path / "index", "w")["lang"].to_list() == [None, "en"]


def test_output_that_is_not_an_index(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError) as info:
        _build(root, output=out)
    assert str(info.value) == (
        f"{out}: exists, is not empty and is not an mds index; pick another --output"
    )
    assert snapshot(out) == {"notes.txt": b"keep me"}


@pytest.mark.parametrize("manifest", [b"{ not json", b'{"format": "other-tool"}'])
def test_output_with_a_manifest_of_another_tool(root: Path, tmp_path: Path, manifest) -> None:
    """A manifest.json that is not an mds index's is someone's file, not an index to replace."""
    out = tmp_path / "precious"
    (out / "sources").mkdir(parents=True)
    (out / "manifest.json").write_bytes(manifest)
    (out / "sources/notes.parquet").write_bytes(b"keep me")
    with pytest.raises(ConfigError) as info:
        _build(root, output=out)
    assert str(info.value) == (
        f"{out}: exists, is not empty and is not an mds index; pick another --output"
    )
    assert snapshot(out) == {"manifest.json": manifest, "sources/notes.parquet": b"keep me"}


def test_tables_mds_did_not_write_survive_every_re_index(root: Path, tmp_path: Path) -> None:
    """Only tables a previous manifest named are removed when no longer needed (history.py
    tests when): a file under `sources/` that no manifest named (a user's, or a crashed
    run's) is never deleted."""
    out = tmp_path / "idx"
    (out / "sources").mkdir(parents=True)
    (out / "sources/notes.parquet").write_bytes(b"keep me")
    _build(root, output=out)
    first = _manifest(out)
    (root / "web/part-00000.parquet").unlink()  # the web table changes
    _build(root, output=out)
    second = _manifest(out)
    old = {s["table"] for s in first["sources"]} - {s["table"] for s in second["sources"]}
    assert old and all((out / rel).exists() for rel in old)  # the kept manifest names them
    assert all((out / s["table"]).exists() for s in second["sources"])
    assert (out / "sources/notes.parquet").read_bytes() == b"keep me"


def test_output_that_is_a_file(root: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="output exists and is not a directory"):
        _build(root, output=tmp_path / "file")


def test_manifest_from_a_newer_version(root: Path) -> None:
    _build(root)
    index = root / "index"
    m = _manifest(index)
    m["version"] = 99
    (index / "manifest.json").write_text(json.dumps(m))
    before = snapshot(index)
    with pytest.raises(IndexFormatError) as info:
        _build(root)
    assert "index format version 99 is newer than this mds supports (2)" in str(info.value)
    assert str(index / "manifest.json") in str(info.value)
    assert snapshot(index) == before


def test_unreadable_old_manifest_is_rebuilt(root: Path) -> None:
    _build(root)
    text = (root / "index/manifest.json").read_text()
    (root / "index/manifest.json").write_text(text[: len(text) // 2])  # cut short: damaged
    summary = _build(root)
    assert all(s.files_scanned == s.files for s in summary.sources)
    assert read_manifest(root / "index").data["version"] == 2


def test_bad_glob_fails_before_any_work(root: Path, scanned: list[str]) -> None:
    config_file(root, MULTI_TOML.replace('path = "forum/forum.jsonl"', 'path = "forum/*.json"'))
    with pytest.raises(
        ConfigError, match="source 'forum': `path` 'forum/\\*.json' matches no files"
    ):
        _build(root)
    assert scanned == []
    assert not (root / "index").exists()


def test_missing_tokenizer(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}])
    _one_source(tmp_path, 'name = "t"\npath = "d.jsonl"\ntext = "text"\ntokenizer = "nope.json"\n')
    with pytest.raises(ConfigError, match="source 't': `tokenizer` .*nope.json not found"):
        build_index(load_config(tmp_path / "mds.toml"))


def test_source_data_error_names_file_and_line(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d/x.jsonl", [{"n": 1}, "{oops", {"n": 2}])
    _one_source(tmp_path, 'name = "d"\npath = "d/*.jsonl"\ncount = "n"\n')
    with pytest.raises(SourceDataError, match=r"^d/x.jsonl line 2: malformed JSON"):
        build_index(load_config(tmp_path / "mds.toml"))


# --- read_manifest ---------------------------------------------------------------------------


@pytest.fixture
def index(root: Path) -> Path:
    _build(root)
    return root / "index"


def _write_manifest(index: Path, data) -> None:
    text = data if isinstance(data, str) else json.dumps(data)
    (index / "manifest.json").write_text(text)


def test_read_manifest_round_trip(index: Path) -> None:
    m = read_manifest(index)
    assert m.path == index
    assert [s["name"] for s in m.sources] == ["web", "forum", "code", "wiki", "math"]
    assert m.fingerprint.startswith("blake2b:")
    with pytest.raises(IndexFormatError, match="no source named 'nope'; the index has web, forum"):
        m.source("nope")


def test_read_manifest_missing(tmp_path: Path) -> None:
    with pytest.raises(
        IndexFormatError, match=r"not an mds index \(no manifest.json\); run `mds index`"
    ):
        read_manifest(tmp_path)


def test_read_manifest_corrupt(index: Path) -> None:
    _write_manifest(index, '{"format": "mds-index", ')
    with pytest.raises(IndexFormatError) as info:
        read_manifest(index)
    assert str(info.value).startswith(f"{index / 'manifest.json'}: unreadable manifest (")


def test_read_manifest_table_outside_the_index(index: Path) -> None:
    m = _manifest(index)
    m["sources"][1]["table"] = "../../etc/passwd"
    _write_manifest(index, m)
    with pytest.raises(IndexFormatError) as info:
        read_manifest(index)
    assert "sources[1].table '../../etc/passwd' leaves the index directory" in str(info.value)
    m["sources"][1]["table"] = "/abs/table.parquet"
    _write_manifest(index, m)
    with pytest.raises(IndexFormatError, match="leaves the index directory"):
        read_manifest(index)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda m: m.update(format="other"), "not an mds index manifest"),
        (lambda m: m.pop("version"), "manifest has no integer `version`"),
        (lambda m: m.update(version=0), "invalid index format version 0"),
        (lambda m: m.update(sources={}), "manifest `sources` must be a list of objects"),
        (lambda m: m["sources"][0].pop("table_checksum"), "sources[0].table_checksum is missing"),
        (lambda m: m["sources"][2].update(rows="3"), "sources[2].rows is missing or not a int"),
        (lambda m: m.pop("fingerprint"), "manifest has no `fingerprint`"),
    ],
)
def test_read_manifest_invalid(index: Path, mutate, expected: str) -> None:
    m = _manifest(index)
    mutate(m)
    _write_manifest(index, m)
    with pytest.raises(IndexFormatError) as info:
        read_manifest(index)
    assert expected in str(info.value)
    assert str(index / "manifest.json") in str(info.value)


def test_read_manifest_not_an_object(index: Path) -> None:
    _write_manifest(index, "[1, 2]")
    with pytest.raises(IndexFormatError, match="not an mds index manifest"):
        read_manifest(index)


def test_source_frame_missing_table(index: Path) -> None:
    m = read_manifest(index)
    (index / m.source("web")["table"]).unlink()
    with pytest.raises(IndexFormatError, match="index table of source 'web' is missing"):
        source_frame(m, "web")


def test_damaged_previous_table_is_rescanned_not_reused(root: Path, scanned: list[str]) -> None:
    _build(root)
    before = snapshot(root / "index")
    table = root / "index" / _manifest(root / "index")["sources"][0]["table"]
    table.write_bytes(table.read_bytes()[:-20])  # footer cut: the old rows cannot be reused
    scanned.clear()
    summary = _build(root)
    assert sorted(scanned) == sorted(
        f["path"] for f in _manifest(root / "index")["sources"][0]["files"]
    )
    assert [s.files_scanned for s in summary.sources][1:] == [0, 0, 0, 0]
    assert snapshot(root / "index") == before  # rebuilt byte for byte, damaged file replaced


def test_progress_adds_up_to_the_bytes_it_announced(root: Path, monkeypatch) -> None:
    """Chunk-by-chunk reports from the scanners plus the rest of each task add up to the
    total announced at start, once per byte, from whichever thread scanned."""
    monkeypatch.setattr(build, "ScanContext", _small_chunks(build.ScanContext))
    events: list[tuple[str, int]] = []
    lock = threading.Lock()

    class Recorder(build.Progress):
        def start(self, total_bytes: int, total_files: int) -> None:
            events.append(("start", total_bytes))

        def advance(self, nbytes: int) -> None:
            with lock:
                events.append(("advance", nbytes))

    _build(root, workers=2, progress=Recorder())
    (start,) = [n for kind, n in events if kind == "start"]
    advanced = [n for kind, n in events if kind == "advance"]
    assert start > 0 and sum(advanced) == start
    assert all(n >= 0 for n in advanced)


def _small_chunks(cls):
    def make(*args, **kwargs):
        return cls(*args, chunk_bytes=4096, **kwargs)

    return make


def test_interrupt_just_after_the_manifest_keeps_the_new_index(root: Path, monkeypatch) -> None:
    """Ctrl-C once manifest.json is renamed into place: the tables it names stay, so the
    index in place is the new one, whole (not rolled back under its manifest)."""
    _build(root)
    _change_every_web_file(root)
    real = build.write_manifest

    def then_interrupt(path, manifest):
        real(path, manifest)
        raise KeyboardInterrupt

    monkeypatch.setattr(build, "write_manifest", then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        _build(root)
    manifest = read_manifest(root / "index")
    assert all((root / "index" / s["table"]).exists() for s in manifest.sources)
    assert _table(root / "index", "web").height == 15


def test_a_signal_during_the_manifest_rename_keeps_the_new_index(root: Path, monkeypatch) -> None:
    """SIGINT arriving while manifest.json is renamed into place (before the rename is
    recorded) waits until it is: the new index is kept whole, never rolled back under its
    manifest."""
    import signal

    _build(root)
    _change_every_web_file(root)
    real = os.replace

    def replace(src, dst):
        real(src, dst)
        if os.path.basename(dst) == "manifest.json":
            signal.raise_signal(signal.SIGINT)  # lands between the rename and its record

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        _build(root)
    manifest = read_manifest(root / "index")
    assert all((root / "index" / s["table"]).exists() for s in manifest.sources)
    assert _table(root / "index", "web").height == 15


# --- a re-index costs what changed ----------------------------------------------------------


def _tiny_corpus(root: Path, n: int) -> None:
    (root / "d").mkdir(parents=True)
    for i in range(n):
        (root / f"d/f{i:03d}.jsonl").write_text(f'{{"tokens": [{i}, 1, 2]}}\n{{"tokens": [{i}]}}\n')
    (root / "mds.toml").write_text('[[source]]\nname = "d"\npath = "d/*.jsonl"\ntokens = "tokens"\n')


def _tree(directory: Path) -> dict[str, bytes]:
    """The index as a full build makes it: what the manifest names, without history/ and
    the tables only the replaced manifests kept there name."""
    named = set(index_tables(read_manifest(directory)))
    return {
        rel: p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
        and not p.name.startswith(".")
        and not (rel := p.relative_to(directory).as_posix()).startswith("history/")
        and (not rel.startswith("sources/") or rel in named)
    }


def test_a_grown_and_changed_corpus_reads_only_what_changed(
    tmp_path: Path, scanned: list[str], monkeypatch
) -> None:
    from mds.planner.index import reuse

    root = tmp_path / "data"
    _tiny_corpus(root, 40)
    config = load_config(root / "mds.toml")
    build_index(config, tmp_path / "index", workers=1)
    (root / "d/f040.jsonl").write_text('{"tokens": [7, 7]}\n')  # added
    _rewrite(root / "d/f003.jsonl", b'{"tokens": [5]}\n')  # changed
    (root / "d/f010.jsonl").unlink()  # removed
    read: list[str] = []
    hashed = reuse.fingerprint
    monkeypatch.setattr(reuse, "fingerprint", lambda p, m: (read.append(Path(p).name), hashed(p, m))[1])
    scanned.clear()
    summary = build_index(config, tmp_path / "index", workers=1)
    # unchanged files are known by size and mtime: neither fingerprinted nor scanned
    assert sorted(read) == ["f003.jsonl", "f040.jsonl"]
    assert sorted(scanned) == ["d/f003.jsonl", "d/f040.jsonl"]
    assert summary.sources[0].files_scanned == 2
    full = build_index(config, tmp_path / "full", workers=1)
    assert full.fingerprint == summary.fingerprint
    assert _tree(tmp_path / "index") == _tree(tmp_path / "full")
    assert "d/f010.jsonl" not in (tmp_path / "index/manifest.json").read_text()


def test_a_file_rewritten_with_its_old_size_and_mtime_back_keeps_its_fingerprint(
    tmp_path: Path, scanned: list[str]
) -> None:
    """The stat is the check of an unchanged file; the documented limit of skipping its
    read (docs/index-format.md): a same-size rewrite that restores the mtime is not seen."""
    root = tmp_path / "data"
    _tiny_corpus(root, 3)
    config = load_config(root / "mds.toml")
    build_index(config, tmp_path / "index", workers=1)
    path = root / "d/f001.jsonl"
    st = path.stat()
    path.write_text(path.read_text().replace("[1, 1, 2]", "[1, 1, 3]"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    scanned.clear()
    build_index(config, tmp_path / "index", workers=1)
    assert scanned == []
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # any move of the mtime: read
    build_index(config, tmp_path / "index", workers=1)
    assert scanned == ["d/f001.jsonl"]


def test_an_unchanged_file_costs_one_stat_and_no_pool_task(tmp_path: Path, monkeypatch) -> None:
    """Discovery's stat of a local file is the one its reuse is decided by: an unchanged
    file is not stat-ed again, and only new or changed files go to the workers."""
    from mds.planner.index import reuse

    root = tmp_path / "data"
    _tiny_corpus(root, 30)
    config = load_config(root / "mds.toml")
    build_index(config, tmp_path / "index", workers=1)
    (root / "d/f030.jsonl").write_text('{"tokens": [7, 7]}\n')
    stats: list[str] = []
    sent: list[str] = []
    signature, batch = reuse.stat_signature, build.fingerprint_batch
    monkeypatch.setattr(reuse, "stat_signature", lambda p: (stats.append(str(p)), signature(p))[1])
    monkeypatch.setattr(
        build,
        "fingerprint_batch",
        lambda files, *a: (sent.extend(f.rel for f in files), batch(files, *a))[1],
    )
    summary = build_index(config, tmp_path / "index", workers=1)
    assert stats == [] and sent == ["d/f030.jsonl"]
    assert summary.sources[0].files_scanned == 1
    assert _tree(tmp_path / "index") == _tree(_full(config, tmp_path / "full"))


def _full(config, out: Path) -> Path:
    build_index(config, out, workers=1)
    return out


def test_an_unchanged_source_keeps_its_table_unread(root: Path, tmp_path: Path, monkeypatch) -> None:
    """A re-index reads and writes the table of a source that changed, and no other: an
    unchanged source's entry and table are the previous index's; the bytes are a full
    index's all the same."""
    _build(root)
    write_parquet(root / "web/part-00001.parquet", web_part(1, rows=6, offset=5))
    read: list[str] = []
    written: list[str] = []
    reading, writing = source_table.read_table, publish.TableWriter.write_table
    monkeypatch.setattr(
        source_table, "read_table", lambda p, *a: (read.append(Path(p).name), reading(p, *a))[1]
    )
    monkeypatch.setattr(
        publish.TableWriter,
        "write_table",
        lambda self, name, frame: (written.append(name), writing(self, name, frame))[1],
    )
    summary = _build(root)
    assert [p.split("-")[0] for p in read] == ["web"] and written == ["web"]
    assert [s.files_scanned for s in summary.sources] == [1, 0, 0, 0, 0]
    monkeypatch.undo()
    _build(root, output=tmp_path / "full")
    assert _tree(root / "index") == _tree(tmp_path / "full")


# --- format VERSION 1 indexes -------------------------------------------------------------------


def _to_v1(index: Path) -> None:
    """Rewrite the index in `index` as VERSION 1 wrote it: file entries in the manifest, no
    file-list tables."""
    data = manifest_with_files(index)
    write_v1(index, data)
    for s in data["sources"]:
        if "files_table" in s:
            (index / s["files_table"]).unlink()
    assert read_manifest(index).data["version"] == 1


@pytest.mark.parametrize("start", ["v2", "v1"])
@pytest.mark.parametrize("change", ["unchanged", "added", "changed", "removed"])
def test_a_re_index_is_the_full_index_of_the_same_files(
    tmp_path: Path, scanned: list[str], change: str, start: str
) -> None:
    """Whatever changed, and from an index of either version: the re-index's manifest, tables
    and file lists are byte for byte a full index's, with the same fingerprint."""
    root = tmp_path / "data"
    _tiny_corpus(root, 12)
    config = load_config(root / "mds.toml")
    first = build_index(config, tmp_path / "index", workers=1)
    if start == "v1":
        _to_v1(tmp_path / "index")
        assert read_manifest(tmp_path / "index").fingerprint == first.fingerprint
    if change == "added":
        (root / "d/f012.jsonl").write_text('{"tokens": [7, 7]}\n')
    elif change == "changed":
        _rewrite(root / "d/f003.jsonl", b'{"tokens": [5]}\n')
    elif change == "removed":
        (root / "d/f010.jsonl").unlink()
    scanned.clear()
    summary = build_index(config, tmp_path / "index", workers=1)
    assert len(scanned) == (change in ("added", "changed"))
    full = build_index(config, tmp_path / "full", workers=1)
    assert summary.fingerprint == full.fingerprint
    assert (summary.fingerprint == first.fingerprint) == (change == "unchanged")
    assert _tree(tmp_path / "index") == _tree(tmp_path / "full")
    assert read_manifest(tmp_path / "index").data["version"] == 2


def test_a_v1_index_is_planned_from_verified_and_re_indexed(tmp_path: Path) -> None:
    """An index an older mds wrote (VERSION 1) is read, planned from and verified as it is;
    a re-index writes VERSION 2 with the same fingerprint, and the plans still verify."""
    from plan_builders import sample_workdir

    from mds.planner.plan.build import build_plan, with_overrides
    from mds.planner.plan.config import load_plan_config
    from mds.planner.report.verify import verify_plan

    work = sample_workdir(tmp_path)
    index, config = work / "index", work / "data" / "mds.toml"
    fingerprint = read_manifest(index).fingerprint
    _to_v1(index)
    assert read_manifest(index).fingerprint == fingerprint
    result = verify_plan(work / "plan.mds", full=True)  # made from the VERSION 2 index
    assert result.ok, result.first_failure
    build_plan(with_overrides(load_plan_config(config), index=index), work / "v1.mds")
    result = verify_plan(work / "v1.mds", full=True)
    assert result.ok, result.first_failure
    summary = build_index(load_config(config), index, workers=1)
    assert summary.fingerprint == fingerprint
    assert all(s.files_scanned == 0 for s in summary.sources)
    assert read_manifest(index).data["version"] == 2
    for plan in ("plan.mds", "v1.mds"):
        result = verify_plan(work / plan, full=True)
        assert result.ok, result.first_failure
    build_index(load_config(config), tmp_path / "full", workers=1)
    assert _tree(index) == _tree(tmp_path / "full")


def test_a_damaged_file_list_rescans_its_source(root: Path, scanned: list[str]) -> None:
    """A file list whose bytes differ from its checksum: commands that need it fail in one
    line naming it; a re-index rescans that source and replaces the file."""
    _build(root)
    before = snapshot(root / "index")
    entry = read_manifest(root / "index").source("forum")
    listed = root / "index" / entry["files_table"]
    listed.write_bytes(listed.read_bytes()[:-3] + b"xyz")
    with pytest.raises(IndexFormatError) as info:
        read_manifest(root / "index").source("forum")["files"]
    assert str(info.value).startswith(f"{listed}: checksum ")
    assert "\n" not in str(info.value)
    scanned.clear()
    summary = _build(root)
    assert scanned == ["forum/forum.jsonl"]
    assert [s.files_scanned for s in summary.sources] == [0, 1, 0, 0, 0]
    assert snapshot(root / "index") == before  # rebuilt byte for byte, damaged file replaced


def test_the_cyclic_collector_is_paused_for_a_build_only(root: Path, monkeypatch) -> None:
    """Paused while a build runs (its objects are freed by reference counts), enabled again
    after it, whether it succeeds or fails; left off if the caller had it off."""
    import gc

    during: list[bool] = []
    real = build._build_dir

    def spy(*args, **kwargs):
        during.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "_build_dir", spy)
    assert gc.isenabled()
    _build(root)
    assert during == [False] and gc.isenabled()
    monkeypatch.setattr(build, "_build_locked", _interrupt_locked)
    with pytest.raises(KeyboardInterrupt):
        _build(root)
    assert gc.isenabled()
    gc.disable()
    try:
        monkeypatch.undo()
        _build(root)
        assert not gc.isenabled()
    finally:
        gc.enable()


def _interrupt_locked(*args, **kwargs):
    raise KeyboardInterrupt
