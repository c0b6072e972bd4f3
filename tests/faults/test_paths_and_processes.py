"""Fault matrix: paths that are not data, outputs that are inputs, non-regular files.

Every row starts from the built data root of tests/conftest.py (index at root/index,
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
| **one writer per output** | | |
| lock-held-by-live-pid | `.index.lock` / `.plan.mds.lock` naming this test's pid and host | exit 1, `<index> is being written by pid <pid> on host <h> since ...; wait for it, or remove <lock> if that process is gone`; outputs byte-identical |
| lock-of-dead-pid | the lock names a finished process of this host | exit 0, taken over, no lock left |
| **stale temporaries** | | |
| plan-temp-of-dead-pid / index-temp-of-dead-pid | `.plan.mds.tmp-PID-HOST-RANDOM` of a dead pid; same in index/ and index/sources/ | removed by the next `mds plan` / `mds index`; a live pid's is kept |
| interrupt-large-jsonl (SIGINT, SIGTERM) | real `mds index` of ~80 MB JSONL, signal mid-scan | exit 130 within 5 s, `interrupted: nothing was written`, no index dir, no lock |
| dir-named-like-file | forum `path = "forum/a.jsonl"`, an empty directory | exit 1, `is a directory with no data files in it` |
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from builders import config_file, write_parquet
from cli_helpers import mds, one_error_line
from fault_builders import MDS_BIN, names, tree

from mds.core.commit import host_tag

SAMPLE_TOKENIZER = Path(__file__).resolve().parents[2] / "sample_data" / "tokenizer.json"


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


def test_the_output_without_a_manifest_is_not_data(root: Path) -> None:
    """Tables a failed first run left in the output (no manifest yet) are not source data
    of the next run, even under a glob that spans them."""
    _set_path(root, "web", "**/part-*.parquet")
    rows = _rows(root, "fresh")["web"]
    (root / "fresh" / "manifest.json").unlink()  # as if the commit had failed
    stray = root / "fresh" / "sources" / "part-9.parquet"
    shutil.copy(next((root / "web").glob("part-*.parquet")), stray)
    assert _rows(root, "fresh")["web"] == rows
    assert stray.exists()  # not named by a manifest of ours: left alone


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


# --- one writer per output, stale temporaries ---------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _lock(path: Path, pid: int) -> Path:
    lock = path.with_name(f".{path.name}.lock")
    lock.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "since": "then"}))
    return lock


@pytest.mark.parametrize("what", ["index", "plan"])
def test_lock_held_by_live_pid(root: Path, what: str) -> None:
    out = root / ("index" if what == "index" else "plan.mds")
    lock = _lock(out, os.getpid())
    before = tree(root)
    args = (
        ["index", root / "mds.toml"] if what == "index" else ["plan", root / "mds.toml", "-o", out]
    )
    one_error_line(
        mds(*args),
        f"{out} is being written by pid {os.getpid()} on host {socket.gethostname()} since then;",
        f"remove {lock} if that process is gone",
    )
    assert tree(root) == before


@pytest.mark.parametrize("what", ["index", "plan"])
def test_lock_of_dead_pid_is_taken_over(root: Path, what: str) -> None:
    out = root / ("index" if what == "index" else "plan.mds")
    lock = _lock(out, _dead_pid())
    args = (
        ["index", root / "mds.toml"] if what == "index" else ["plan", root / "mds.toml", "-o", out]
    )
    assert mds(*args).exit_code == 0
    assert not lock.exists()


def test_stale_temporaries_are_removed(root: Path) -> None:
    dead, tag = _dead_pid(), host_tag()
    stale = [
        root / f".plan.mds.tmp-{dead}-{tag}-0123abcd",
        root / "index" / f".manifest.json.tmp-{dead}-{tag}-0123abcd",
        root / "index" / "sources" / f".web.parquet.tmp-{dead}-{tag}-0123abcd",
    ]
    live = root / f".plan.mds.tmp-{os.getpid()}-{tag}-0123abcd"
    for path in [*stale, live]:
        path.write_bytes(b"half")
    assert mds("index", root / "mds.toml").exit_code == 0
    assert mds("plan", root / "mds.toml", "-o", root / "plan.mds").exit_code == 0
    assert [p for p in stale if p.exists()] == []
    assert live.exists()


# --- interrupts -------------------------------------------------------------------------------


def _interrupt_index(
    cwd: Path, args: list[str], out: Path, sig: signal.Signals, *, after: float, timeout: float
) -> tuple[subprocess.Popen, str, float]:
    """Run `mds index ARGS -o OUT` in `cwd`, send `sig` `after` seconds past the moment the
    scan starts (the output directory appears), and wait: (process, stderr, seconds to stop)."""
    proc = subprocess.Popen(
        [str(MDS_BIN), "index", *args, "-o", str(out)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not out.exists() and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(after)
    sent = time.monotonic()
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=timeout)
    return proc, stderr, time.monotonic() - sent


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_during_a_large_jsonl_scan(tmp_path: Path, sig: signal.Signals) -> None:
    """A scan of ~80 MB of JSONL (several seconds) stops within a second or so of the signal,
    not after the file is read: running scans check for the stop between 16 MB chunks."""
    line = ('{"ids": [' + ",".join(["123"] * 200) + '], "x": "' + "a" * 200 + '"}\n').encode()
    (tmp_path / "big.jsonl").write_bytes(line * ((80 << 20) // len(line)))
    out = tmp_path / "idx"
    proc, stderr, took = _interrupt_index(
        tmp_path, ["--path", "big.jsonl", "--tokens", "ids"], out, sig, after=0.5, timeout=60
    )
    assert proc.returncode == 130, stderr
    assert took < 5, "took too long to stop"
    assert "interrupted: nothing was written" in stderr
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.jsonl"]


@pytest.mark.slow
def test_interrupt_while_a_tokenizer_counts_a_large_file(tmp_path: Path) -> None:
    """~64 MB of JSONL text counted with the sample tokenizer (several seconds of tokenizing
    on an idle machine, in four 16 MB chunks): Ctrl-C stops it within a couple of seconds,
    since the tokenizer works in bounded batches that check for the stop, not a chunk at a
    time."""
    rng = random.Random(7)
    vocab = json.loads(SAMPLE_TOKENIZER.read_text(encoding="utf-8"))["model"]["vocab"]
    words = [w for w in vocab if w.isalpha()][:3000]
    lines = [json.dumps({"text": " ".join(rng.choices(words, k=500))}) for _ in range(500)]
    block = ("\n".join(lines) + "\n").encode()
    (tmp_path / "big.jsonl").write_bytes(block * ((64 << 20) // len(block)))
    shutil.copy(SAMPLE_TOKENIZER, tmp_path / "tokenizer.json")
    out = tmp_path / "idx"
    args = ["--path", "big.jsonl", "--text", "text", "--tokenizer", "tokenizer.json"]
    # 1 s after the scan starts: the first chunk is parsed and being tokenized
    proc, stderr, took = _interrupt_index(tmp_path, args, out, signal.SIGINT, after=1.0, timeout=120)
    assert proc.returncode == 130, stderr
    assert took < 4, f"took {took:.1f} s to stop"
    assert stderr.splitlines() == ["interrupted: nothing was written"], stderr
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.jsonl", "tokenizer.json"]
