"""examples/train_online.py: a tiny GPT trained by two torchrun ranks under online mixing.

One run trains uninterrupted; another is killed after a random step and resumed from its
last checkpoint: it trains on the same batches, reaches the same losses and plans the same
segments and signal log, byte for byte. The DoReMi policy moves weight toward the sources
whose loss is above their reference.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch.distributed as dist
from cli_helpers import mds
from plan_builders import REPO

from mds.core.segments import run_facts, segment_path, signals_path
from mds.core.signal_log import SignalLog

EXAMPLE = REPO / "examples" / "train_online.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
STEPS, WINDOW = 12, 4

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available in this torch build",
)


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("train_online", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data(example, tmp_path_factory):
    """The synthetic sources, their config and index, and the run's first segment."""
    root = tmp_path_factory.mktemp("online-example")
    config = example.make_data(root, samples=200, steps=STEPS, window=WINDOW)
    assert mds("index", config).exit_code == 0
    plan = root / "first" / "plan.mds"
    done = mds("plan", config, "-o", plan)
    assert done.exit_code == 0, done.output
    return config, plan


def start_run(root, data):
    """A run directory of its own beside the first segment's (so its relative index path
    holds), holding a copy of the first segment."""
    config, first = data
    plan = first.parent.parent / root / "plan.mds"
    plan.parent.mkdir()
    shutil.copyfile(first, plan)
    return plan


def command(plan, config, ckpt, log, *more):
    return [*TORCHRUN, "--nproc_per_node=2", str(EXAMPLE), "--plan", str(plan), "--config",
            str(config), "--checkpoint", str(ckpt), "--log-json", str(log), *more]  # fmt: skip


def records(path) -> dict[int, dict]:
    """The --log-json records by step (a resume keeps only the steps before its checkpoint)."""
    out: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        assert rec["step"] not in out, f"step {rec['step']} logged twice"
        out[rec["step"]] = rec
    return out


def kill_after_step(cmd, log, step: int) -> None:
    """Start `cmd`, and SIGTERM the launcher (which kills its ranks) once `step` is logged."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=ENV)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and f'"step": {step},' in log.read_text()):
            assert proc.poll() is None, f"{cmd} ended before step {step}:\n{proc.stdout.read()}"
            assert time.monotonic() < deadline, "timed out waiting for the run"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, f"the run finished before it was killed:\n{output}"


def run(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=ENV)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.mark.slow
def test_killed_and_resumed_online_run_is_the_uninterrupted_run(data, tmp_path):
    config, _ = data
    # A runs uninterrupted while B runs beside it (their own directories) and is killed
    a_plan = start_run("a", data)
    a_cmd = command(a_plan, config, tmp_path / "a", tmp_path / "a.jsonl")
    a_run = subprocess.Popen(a_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=ENV)  # fmt: skip
    try:
        kill = random.Random().randrange(1, STEPS - 2)  # killed while training step kill + 1
        b_plan = start_run("b", data)
        b_cmd = command(b_plan, config, tmp_path / "b", tmp_path / "b.jsonl")
        kill_after_step(b_cmd, tmp_path / "b.jsonl", kill)
        output, _ = a_run.communicate(timeout=180)
    finally:
        if a_run.poll() is None:
            a_run.kill()
            a_run.wait()
    assert a_run.returncode == 0, output
    a = records(tmp_path / "a.jsonl")
    assert sorted(a) == list(range(STEPS))
    done = run([*b_cmd, "--resume"])
    assert "resumed at step" in done.stdout, done.stdout
    b = records(tmp_path / "b.jsonl")

    assert a.keys() == b.keys()
    for step in a:
        assert a[step]["inputs"] == b[step]["inputs"], f"killed after {kill}: step {step}"
        assert a[step] == b[step], f"killed after step {kill}: step {step} differs"
    # the same signals, so the same segments, byte for byte
    assert signals_path(a_plan).read_bytes() == signals_path(b_plan).read_bytes()
    for k in range(STEPS // WINDOW):
        assert segment_path(a_plan, k).read_bytes() == segment_path(b_plan, k).read_bytes(), k

    # DoReMi: every window after the first two moves weight toward the sources whose
    # mean loss is furthest above their reference
    facts, log = run_facts(a_plan), SignalLog.read(signals_path(a_plan))
    assert len(facts) == len(log.windows) == STEPS // WINDOW
    reference = {"repeat": 0.5, "count": 1.0, "random": 5.0}
    for k in range(2, len(facts)):
        mean = dict(zip(log.sources, log.windows[k - 2].mean_loss(), strict=True))
        excess = {s: max(mean[s] - reference[s], 0.0) for s in mean}
        before, after = facts[k - 1].weights, facts[k].weights
        assert excess["random"] == 0.0 and after["random"] < before["random"], (k, excess)
        gainer = max(excess, key=excess.get)
        assert after[gainer] > before[gainer], (k, excess, before, after)
    assert a[STEPS - 1]["weights"] == facts[-1].weights


def test_make_data_and_help(example, tmp_path, capsys):
    config = example.make_data(tmp_path)
    text = config.read_text()
    assert 'policy = "doremi"' in text and "reference" in text
    sizes = {s: (tmp_path / f"{s}.jsonl").stat().st_size for s in example.SOURCES}
    assert sum(sizes.values()) < 200_000
    first = json.loads((tmp_path / "repeat.jsonl").read_text().splitlines()[0])["tokens"]
    assert max(first) < example.VOCAB
    with pytest.raises(SystemExit) as exc:
        example.main(["--help"])
    assert exc.value.code == 0 and "--make-data" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        example.main(["--plan", "p.mds"])
    assert exc.value.code == 2 and "--config" in capsys.readouterr().err
