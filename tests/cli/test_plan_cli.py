"""`mds plan` and `mds export` from the command line (in-process, with typer's runner)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from cli_helpers import json_error, mds, one_error_line
from plan_builders import SAMPLE_CONFIG, sample_index, write_source

from mds.core.planfile_reader import PlanReader

SUMMARY_KEYS = {
    "samples",
    "tokens",
    "bytes_per_sample",
    "ratio_mean",
    "ratio_max",
    "naive_ratio_mean",
    "naive_ratio_max",
    "speedup_vs_naive",
    "interleave_ratio_mean",
    "interleave_ratio_max",
    "speedup_vs_interleave",
    "stronger_baseline",
    "plan_id",
}


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return sample_index(tmp_path_factory)


@pytest.fixture(scope="module")
def planned(index, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "plan.mds"
    result = mds("plan", SAMPLE_CONFIG, "-o", out, "--index", index, "--json")
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout)


def test_plan_json_summary(planned):
    out, summary = planned
    assert SUMMARY_KEYS <= set(summary)
    assert summary["samples"] == 64 * 32
    assert summary["path"] == str(out.resolve())
    assert summary["steps"] == 64 and summary["dp_size"] == 4 and summary["micro_batches"] == 2
    assert summary["bytes_per_sample"] == round(out.stat().st_size / summary["samples"], 3)
    assert summary["ratio_mean"] >= 1.0 and summary["speedup_vs_naive"] > 1.0
    with PlanReader(out) as r:
        assert summary["plan_id"] == r.plan_id
    assert [s["name"] for s in summary["sources"]] == [
        "web",
        "books",
        "forum",
        "code",
        "wiki",
        "math",
    ]


def test_plan_table_output(index, tmp_path):
    result = mds("plan", SAMPLE_CONFIG, "-o", tmp_path / "p.mds", "--index", index, "--steps", "2")
    assert result.exit_code == 0, result.output
    for text in ("steps x dp ranks", "2 (steps 0-1) x 4 x 2", "plan id", "books"):
        assert text in result.stdout


def test_overrides_take_effect(index, tmp_path):
    result = mds(
        "plan",
        SAMPLE_CONFIG,
        "-o",
        tmp_path / "p.mds",
        "--index",
        index,
        "--steps",
        "5",
        "--dp-size",
        "8",
        "--json",
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["steps"], summary["dp_size"], summary["samples"]) == (5, 8, 5 * 32)
    with PlanReader(tmp_path / "p.mds") as r:
        assert (r.dp, r.steps) == (8, 5)


def test_workers_option_gives_the_same_plan(planned, index, tmp_path):
    out, summary = planned
    result = mds(
        "plan", SAMPLE_CONFIG, "-o", tmp_path / "p.mds", "--index", index, "-j", "2", "--json"
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plan_id"] == summary["plan_id"]
    assert (tmp_path / "p.mds").read_bytes() == out.read_bytes()


def test_re_planning_over_a_plan_reads_the_manifest_once(planned, index, tmp_path, monkeypatch):
    # The output exists, so the manifest's file list is checked against it; the same parse
    # then serves the planning (at a million files a parse costs seconds).
    out, summary = planned
    again = tmp_path / "p.mds"
    again.write_bytes(out.read_bytes())
    reads = []
    read_text = Path.read_text

    def counting(self, *args, **kwargs):
        if self.name == "manifest.json":
            reads.append(self)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting)
    result = mds("plan", SAMPLE_CONFIG, "-o", again, "--index", index, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plan_id"] == summary["plan_id"]
    assert len(reads) == 1


def test_a_single_chunk_plan_notes_the_unused_workers(index, tmp_path):
    args = ("plan", SAMPLE_CONFIG, "-o", tmp_path / "p.mds", "--index", index, "-j", "2")
    one = ("--steps", "8")  # one chunk of the sample config's chunk_steps
    result = mds(*args, *one, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["workers"] == 1 and "1 of 2 workers used" in summary["notice"]
    result = mds(*args, *one)
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stdout.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "chunk_steps" in notes[0]


def test_export(planned, tmp_path):
    out, summary = planned
    target = tmp_path / "plan.parquet"
    result = mds("export", out, "-o", target)
    assert result.exit_code == 0, result.output
    assert f"wrote {summary['samples']:,} rows" in result.stdout
    frame = pl.read_parquet(target)
    assert frame.height == summary["samples"]
    assert frame.columns[:6] == ["step", "rank", "micro_batch", "sample_id", "source", "row"]
    result = mds("export", out, "-o", tmp_path / "again.parquet", "--json")
    assert json.loads(result.stdout) == {
        "output": str(tmp_path / "again.parquet"),
        "rows": summary["samples"],
    }


def test_help_has_examples():
    for command in ("plan", "export"):
        result = mds(command, "--help")
        assert result.exit_code == 0
        assert "Example" in result.stdout
    assert "mds plan sample_data/mds.toml -o build/plan.mds" in mds("plan", "--help").stdout


# --- errors: one line, exit 1 ---------------------------------------------------------------------

CONFIG = """
[[source]]
name = "a"
path = "a/data.parquet"
count = "n"
weight = {weight}

[train]
{train}
"""
TRAIN = """steps = 4
dp_size = 2
samples_per_step = 4
max_tokens_per_micro_batch = 100"""


def config(tmp_path: Path, train: str = TRAIN, weight: str = "1.0", lengths=(5, 6, 7)) -> Path:
    write_source(tmp_path, "a", list(lengths))
    path = tmp_path / "mds.toml"
    path.write_text(CONFIG.format(train=train, weight=weight), encoding="utf-8")
    return path


def indexed(tmp_path: Path, **kwargs) -> Path:
    path = config(tmp_path, **kwargs)
    result = mds("index", path, "-o", tmp_path / "index")
    assert result.exit_code == 0, result.output
    return path


def test_small_config_plans(tmp_path):
    path = indexed(tmp_path)
    result = mds("plan", path, "-o", tmp_path / "p.mds", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["samples"] == 16


@pytest.mark.parametrize(
    ("train", "needles"),
    [
        (
            TRAIN + "\nsample_per_step = 3",
            ["[train]: unknown key `sample_per_step`", "did you mean"],
        ),
        (TRAIN.replace("steps = 4\n", ""), ["[train]: `steps` is required"]),
        (
            TRAIN + "\ntokens_per_step = 10",
            ["set exactly one of `samples_per_step` and `tokens_per_step`"],
        ),
        (
            TRAIN.replace("samples_per_step = 4", "samples_per_step = 1"),
            ["`samples_per_step` (1) must be at least `dp_size` (2)"],
        ),
    ],
)
def test_config_errors(tmp_path, train, needles):
    path = config(tmp_path, train=train)
    line = one_error_line(mds("plan", path, "-o", tmp_path / "p.mds"), *needles)
    assert str(path) in line
    assert not (tmp_path / "p.mds").exists()


def test_missing_config_file(tmp_path):
    one_error_line(
        mds("plan", tmp_path / "nope.toml", "-o", tmp_path / "p.mds"), "config file not found"
    )


def test_missing_index(tmp_path):
    path = config(tmp_path)
    one_error_line(mds("plan", path, "-o", tmp_path / "p.mds"), "not an mds index", "mds index")
    error = json_error(
        mds("plan", path, "-o", tmp_path / "p.mds", "--json"), "not an mds index", "mds index"
    )
    assert error["type"] == "IndexFormatError"


def test_plan_errors(tmp_path):
    path = indexed(tmp_path, lengths=(5, 600, 7))
    one_error_line(
        mds("plan", path, "-o", tmp_path / "p.mds"),
        "source 'a' row 1: 600 tokens exceed max_tokens_per_micro_batch = 100",
    )
    train = TRAIN + '\noverlong = "drop"'
    path.write_text(CONFIG.format(train=train, weight="[[0, 1.0], [2, 0.0]]"), encoding="utf-8")
    one_error_line(
        mds("plan", path, "-o", tmp_path / "p.mds"), "all source weights are 0 at step 2"
    )
    assert not (tmp_path / "p.mds").exists()


def test_bad_override(tmp_path):
    path = indexed(tmp_path)
    one_error_line(
        mds("plan", path, "-o", tmp_path / "p.mds", "--dp-size", "5"),
        "--dp-size 5 exceeds samples_per_step = 4",
    )
    one_error_line(
        mds("plan", path, "-o", tmp_path / "p.mds", "--steps", "0"), "--steps must be >= 1"
    )
    one_error_line(
        mds("plan", path, "-o", tmp_path / "p.mds", "--samples-per-step", "1"),
        "`samples_per_step` (1) must be at least `dp_size` (2)",
    )
    one_error_line(
        mds("plan", path, "-o", tmp_path / "p.mds", "--micro-batches", "0"),
        "--micro-batches must be >= 1",
    )


def test_micro_batches_and_samples_per_step_override_the_config(tmp_path):
    path = indexed(tmp_path)
    args = ("--micro-batches", "3", "--samples-per-step", "6", "--json")
    result = mds("plan", path, "-o", tmp_path / "p.mds", *args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["micro_batches"], summary["samples"]) == (3, 24)
    report = json.loads(mds("inspect", tmp_path / "p.mds", "--json").stdout)
    assert (report["header"]["micro_batches"], report["header"]["samples_per_step"]) == (3, 6)


def test_export_errors(planned, tmp_path):
    out, _ = planned
    bad = tmp_path / "bad.mds"
    data = bytearray(out.read_bytes())
    data[8] = 99  # format version
    bad.write_bytes(bytes(data))
    one_error_line(mds("export", bad, "-o", tmp_path / "x.parquet"), "newer than this mds supports")
    one_error_line(
        mds("export", tmp_path / "none.mds", "-o", tmp_path / "x.parquet"), "cannot open plan"
    )
    assert not (tmp_path / "x.parquet").exists()


# --- configs that are pipes --------------------------------------------------------------------


def _pipe_config(tmp_path: Path, **replace: str) -> str:
    """sample_data/mds.toml with an absolute data root, so that it can be read from anywhere
    (a pipe's directory is not the data's); `replace` swaps whole lines."""
    text = SAMPLE_CONFIG.read_text().replace(
        'output = "../build/index"', f'root = "{SAMPLE_CONFIG.parent}"'
    )
    for old, new in replace.items():
        text = text.replace(old, new)
    return text


def _wait_until_open(pid: int, fifo: Path, seconds: float = 30) -> None:
    """Until process `pid` holds `fifo` open (it is then waiting for a writer), at most
    `seconds`: a fixed sleep would race a slow start-up on a loaded machine."""
    import os
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(fifo) for fd in fds):
                time.sleep(0.5)  # into the wait itself
                return
        except OSError:
            pass  # a descriptor closed while listed
        time.sleep(0.05)


def _interrupt_while_waiting(args: list, cwd: Path, fifo: Path) -> None:
    """`mds ARGS` blocks on `fifo`, which nobody writes; SIGINT ends it within seconds with
    130 and one `interrupted` line."""
    import os
    import signal
    import subprocess
    import time

    from fault_builders import MDS_BIN

    proc = subprocess.Popen(
        [MDS_BIN, *map(str, args)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        _wait_until_open(proc.pid, fifo)  # (a blocking open() never gets that far)
        assert proc.poll() is None, proc.communicate()
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip() == "interrupted: nothing was written", err
    assert "Traceback" not in out + err
    assert took < 5, took


@pytest.mark.parametrize("command", ["index", "plan"])
def test_ctrl_c_ends_a_wait_on_a_config_pipe_nobody_writes(tmp_path, command):
    import os

    fifo = tmp_path / "mds.toml"
    os.mkfifo(fifo)
    _interrupt_while_waiting([command, fifo, "-o", tmp_path / "out"], tmp_path, fifo)


def test_ctrl_c_ends_a_wait_on_a_cost_file_pipe(tmp_path):
    import os

    os.mkfifo(tmp_path / "cost.toml")
    config = tmp_path / "mds.toml"
    model = "model = { layers = 12, hidden = 768, vocab = 2011 }"
    config.write_text(_pipe_config(tmp_path, **{model: 'file = "cost.toml"'}))
    plan = ["plan", config, "-o", tmp_path / "plan.mds"]
    _interrupt_while_waiting(plan, tmp_path, tmp_path / "cost.toml")


def _plan_from(config_arg: str, index: Path, out: Path, **popen) -> dict:
    import subprocess

    from fault_builders import MDS_BIN

    result = subprocess.run(
        [MDS_BIN, "plan", config_arg, "--index", str(index), "-o", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        **popen,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_plan_reads_a_named_pipe_written_once(tmp_path, index, planned):
    import os
    import threading

    fifo = tmp_path / "mds.toml"
    os.mkfifo(fifo)
    text = _pipe_config(tmp_path).encode()

    def write() -> None:
        with open(fifo, "wb") as f:  # blocks until mds opens the pipe
            f.write(text)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    summary = _plan_from(str(fifo), index, tmp_path / "plan.mds")
    writer.join(5)
    assert summary["plan_id"] == planned[1]["plan_id"]  # the same plan as from the file


def test_plan_reads_a_process_substitution(tmp_path, index, planned):
    """`mds plan <(cat cfg)`: /dev/fd/N of a pipe whose writer wrote it all and closed."""
    import os

    read, write = os.pipe()
    os.write(write, _pipe_config(tmp_path).encode())
    os.close(write)
    try:
        summary = _plan_from(f"/dev/fd/{read}", index, tmp_path / "plan.mds", pass_fds=(read,))
    finally:
        os.close(read)
    assert summary["plan_id"] == planned[1]["plan_id"]


def test_a_source_drawn_many_epochs_is_warned_about(tmp_path):
    path = indexed(tmp_path)  # 16 samples from a source of 3: 5.33 epochs
    result = mds("plan", path, "-o", tmp_path / "p.mds")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # wrapped to the screen
    assert "warning: source 'a' is drawn 5.33 epochs" in text
    assert "more than warn_epochs = 2" in text
    summary = json.loads(mds("plan", path, "-o", tmp_path / "p.mds", "--json").stdout)
    assert len(summary["warnings"]) == 1 and "source 'a'" in summary["warnings"][0]
    report = json.loads(mds("inspect", tmp_path / "p.mds", "--json").stdout)
    assert report["warnings"] == summary["warnings"]
    assert report["sources"][0]["epochs"] == 5.333333
    assert "warning: source 'a' is drawn" in mds("inspect", tmp_path / "p.mds").stdout

    raised = tmp_path / "raised"
    raised.mkdir()
    path = indexed(raised, train=TRAIN + "\nwarn_epochs = 6")
    summary = json.loads(mds("plan", path, "-o", raised / "p.mds", "--json").stdout)
    assert summary["warnings"] == []


def test_plan_parses_the_index_manifest_once(index, tmp_path, monkeypatch):
    """Every manifest parse ends in index_manifest._check: one for `mds plan`, however many
    parts of planning use it (a 1M-file manifest takes seconds to parse)."""
    from mds.core import index_manifest

    checked = []
    check = index_manifest._check
    monkeypatch.setattr(index_manifest, "_check", lambda d, w: (checked.append(w), check(d, w))[1])
    result = mds("plan", SAMPLE_CONFIG, "-o", tmp_path / "p.mds", "--index", index)
    assert result.exit_code == 0, result.output
    assert len(checked) == 1
