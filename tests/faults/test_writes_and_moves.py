"""Fault matrix: outputs on a full disk, plans moved away from their index, racing writers.

Every row starts from the built data root of tests/conftest.py (index at root/index,
plan at root/plan.mds) and asserts the one `error:` line, the exit code and the files on disk.

| row | how | expected outcome |
|---|---|---|
| **disk full** (previous output byte-identical, no temporaries) | | |
| disk-full-export (fresh / over an old export) | ENOSPC (polars' error) after 100 bytes of the Parquet | exit 1, `<out>: cannot write the export (No space left on device (os error 28))` |
| disk-full-inspect-html (fresh / over an old report) | ENOSPC after 100 bytes of the HTML | exit 1, `<out>: cannot write the report (No space left on device)` |
| **a plan moved away from its index** | | |
| moved-plan (export, inspect --step) | plan.mds copied to another directory | exit 1: `<plan>: its index was expected at <dir> (recorded relative to the plan's directory as 'index'); if the plan or the index moved, pass --index`; with `--index` it works |
| moved-plan (executor) | the same copy | DataChangedError: `the data root <dir> (recorded relative to the plan's directory as '.') holds none of the indexed files (source 'web': web/part-0.parquet: missing); if the plan or the data moved, or the root is mistyped: pass data_root= ...`; with `data_root=` it works, and needs no index |
| **an index whose file path leaves the data root** | | |
| manifest-path-escapes (`../`, absolute, inner `..`; plan, export, verify, inspect --step) | web files[1].path forged, fingerprint recomputed | exit 1, `<index>/manifest.json: web files[1]: path '../secret.parquet' escapes the index root; refused, not read` |
| **racing writers** | | |
| concurrent-index (3 rounds) | two real `mds index` processes on one fresh output at once | each exits 0, or 1 with `is being written by pid`; at least one exits 0; the index is whole: `mds verify --full` of a plan made from it exits 0 |
| concurrent-plan (3 rounds) | two real `mds plan` processes on one output at once | the same; the plan is whole and byte-identical to a plan made alone |
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest
from cli_helpers import mds, one_error_line
from fault_builders import (
    MDS_BIN,
    NO_SPACE,
    FullDisk,
    full_disk_write_parquet,
    names,
    word_ids,
)
from index_files import manifest_with_files, write_v1

from mds.core.index_manifest import index_fingerprint
from mds.executor import DataChangedError, PlanExecutor
from mds.planner.runtime.atomic import is_temp


def no_temporaries(directory: Path) -> None:
    assert [p for p in directory.rglob("*") if is_temp(p)] == []


# --- disk full ---------------------------------------------------------------------------------


@pytest.mark.parametrize("old", [False, True], ids=["fresh", "over-old"])
def test_disk_full_while_exporting(root: Path, monkeypatch, old: bool) -> None:
    out = root / "plan.parquet"
    if old:
        assert mds("export", root / "plan.mds", "-o", out).exit_code == 0
    before, top = (out.read_bytes() if old else None), names(root)
    real = pl.DataFrame.write_parquet
    monkeypatch.setattr(pl.DataFrame, "write_parquet", full_disk_write_parquet(real, 100))
    one_error_line(
        mds("export", root / "plan.mds", "-o", out),
        f"{out}: cannot write the export ({NO_SPACE} (os error 28))",
    )
    assert (out.read_bytes() if old else None) == before
    assert names(root) == top
    no_temporaries(root)


@pytest.mark.parametrize("old", [False, True], ids=["fresh", "over-old"])
def test_disk_full_while_writing_an_html_report(root: Path, monkeypatch, old: bool) -> None:
    out = root / "report.html"
    if old:
        assert mds("inspect", root / "plan.mds", "--html", out).exit_code == 0
    before, top = (out.read_bytes() if old else None), names(root)

    def write_text(self: Path, data: str, encoding=None, errors=None, newline=None) -> int:
        with io.BufferedWriter(FullDisk(self, 100)) as f:
            return f.write(data.encode(encoding or "utf-8"))

    monkeypatch.setattr(Path, "write_text", write_text)
    one_error_line(
        mds("inspect", root / "plan.mds", "--html", out),
        f"{out}: cannot write the report ({NO_SPACE})",
    )
    monkeypatch.undo()
    assert (out.read_bytes() if old else None) == before
    assert names(root) == top
    no_temporaries(root)


# --- a plan moved away from its index ----------------------------------------------------------


def test_moved_plan_says_where_its_index_was_expected(root: Path, tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere" / "plan.mds"
    moved.parent.mkdir()
    shutil.copy(root / "plan.mds", moved)
    expected = f"{moved}: its index was expected at {moved.parent / 'index'}"
    for args in (
        ("export", moved, "-o", tmp_path / "x.parquet"),
        ("inspect", moved, "--step", "0"),
    ):
        line = one_error_line(mds(*args), expected, "pass --index")
        assert "run `mds index`" not in line
    assert not (tmp_path / "x.parquet").exists()
    with pytest.raises(DataChangedError) as info:
        PlanExecutor(moved, 0, tokenize=word_ids)
    assert re.fullmatch(
        rf"the data root {re.escape(str(moved.parent))} \(recorded relative to the plan's "
        r"directory as '\.'\) holds none of the indexed files \(source '\w+': [\w/.-]+: "
        r"missing\); if the plan or the data moved, or the root is mistyped: pass data_root= "
        r"\(or --data-root, or set MDS_DATA_ROOT\) with the directory that now holds the "
        "indexed data; no re-index or re-plan is needed",
        str(info.value),
    ), str(info.value)
    # The fixes the messages name work.
    assert (
        mds("export", moved, "-o", tmp_path / "x.parquet", "--index", root / "index").exit_code == 0
    )
    with PlanExecutor(moved, 0, data_root=root, tokenize=word_ids) as ex:
        assert next(iter(ex))["step"] == 0


# --- an index whose file path leaves the data root ----------------------------------------------


@pytest.mark.parametrize("rel", ["../secret.parquet", "/etc/hostname", "web/../../secret.parquet"])
def test_a_manifest_path_leaving_the_root_is_refused_by_every_command(root: Path, rel: str) -> None:
    manifest_path = root / "index" / "manifest.json"
    manifest = manifest_with_files(root / "index")
    web = next(s for s in manifest["sources"] if s["name"] == "web")
    web["files"][1]["path"] = rel
    manifest["fingerprint"] = index_fingerprint(manifest["sources"])
    write_v1(root / "index", manifest)  # file entries inline: one of them forged
    bad = f"{manifest_path}: web files[1]: path {rel!r} escapes the index root; refused, not read"
    plan, top = root / "plan.mds", names(root)
    before = plan.read_bytes()
    one_error_line(mds("plan", root / "mds.toml", "-o", plan), bad)
    one_error_line(mds("export", plan, "-o", root / "x.parquet"), bad)
    one_error_line(mds("verify", plan), bad)
    one_error_line(mds("inspect", plan, "--step", "0"), bad)
    assert plan.read_bytes() == before and names(root) == top


# --- racing writers ----------------------------------------------------------------------------


def _race(*argvs: list[str]) -> list[tuple[int, str]]:
    procs = [
        subprocess.Popen([str(MDS_BIN), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for argv in argvs
    ]
    return [(p.wait(timeout=120), p.communicate()[1].decode()) for p in procs]


def _one_wins(outcomes: list[tuple[int, str]]) -> None:
    for code, err in outcomes:
        assert code == 0 or (code == 1 and "is being written by pid" in err), (code, err)
    assert any(code == 0 for code, _ in outcomes), outcomes


@pytest.mark.parametrize("round_", range(3))
def test_concurrent_index_runs_leave_a_whole_index(root: Path, round_: int) -> None:
    out = root / f"race-index-{round_}"
    argv = ["index", str(root / "mds.toml"), "-o", str(out)]
    _one_wins(_race(argv, argv))
    assert not list(out.parent.glob(f".{out.name}.lock"))
    no_temporaries(out)
    plan = root / f"race-{round_}.mds"
    assert mds("plan", root / "mds.toml", "--index", out, "-o", plan).exit_code == 0
    assert mds("verify", plan, "--full").exit_code == 0


@pytest.mark.parametrize("round_", range(3))
def test_concurrent_plan_runs_leave_a_whole_plan(root: Path, round_: int) -> None:
    out = root / f"race-{round_}.mds"
    argv = ["plan", str(root / "mds.toml"), "-o", str(out)]
    _one_wins(_race(argv, argv))
    assert out.read_bytes() == (root / "plan.mds").read_bytes()
    assert not list(root.glob(f".{out.name}.lock"))
    no_temporaries(root)
