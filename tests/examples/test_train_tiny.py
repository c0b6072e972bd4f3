"""examples/train_tiny.py: a tiny GPT trained by two torchrun ranks from a dp_size-2 plan.

The central check is resume: a run killed mid-way and resumed from its checkpoint trains on
bit-identical inputs and reaches bit-identical losses, weights and optimizer state as an
uninterrupted run (CPU, one thread per rank, deterministic algorithms, fixed seeds).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from plan_builders import REPO, sample_index, sample_plan_config

EXAMPLE = REPO / "examples" / "train_tiny.py"
EXIT_WORKER = Path(__file__).resolve().parent / "train_tiny_exit_worker.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]

needs_gloo = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available in this torch build",
)


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[int, Path]:
    """The sample config planned for dp_size 2 (8 steps) and for dp_size 1 (2 steps)."""
    from mds.planner.plan.build import build_plan, with_overrides

    index = sample_index(tmp_path_factory)
    out = tmp_path_factory.mktemp("train-plans")
    plans: dict[int, Path] = {}
    for dp, steps in ((2, 8), (1, 2)):
        config = with_overrides(sample_plan_config(index), dp_size=dp, steps=steps)
        plans[dp] = out / f"plan-dp{dp}.mds"
        build_plan(config, plans[dp], workers=1)
    return plans


@pytest.fixture(scope="module")
def train_tiny():
    """The example imported as a module, for its model and loss."""
    spec = importlib.util.spec_from_file_location("train_tiny", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def command(*args: str, nproc: int | None = 2) -> list[str]:
    launcher = [sys.executable] if nproc is None else [*TORCHRUN, f"--nproc_per_node={nproc}"]
    return [*launcher, str(EXAMPLE), *args]


def run(*args: str, nproc: int | None = 2, ok: bool = True) -> subprocess.CompletedProcess:
    cmd = command(*args, nproc=nproc)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=ENV)
    if ok:
        assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done


def records(path: Path) -> dict[int, dict]:
    """The --log-json records by step (a resume keeps only the steps before its checkpoint,
    so a step appears once)."""
    out: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        assert rec["step"] not in out, f"step {rec['step']} logged twice"
        out[rec["step"]] = rec
    return out


def logged(log: Path) -> list[dict]:
    """The complete records of a log another process is appending to."""
    text = log.read_text() if log.exists() else ""
    return [json.loads(line) for line in text.split("\n")[:-1]]


def kill_after_step(cmd: list[str], log: Path, step: int) -> None:
    """Start `cmd`, and SIGTERM the launcher (which kills its ranks) once `step` is logged."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV
    )
    try:
        deadline = time.monotonic() + 120
        while not any(r["step"] >= step for r in logged(log)):
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


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_state(a, b, where: str = "") -> None:
    """Equal nested states, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_state(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@needs_gloo
@pytest.mark.slow
def test_killed_and_resumed_run_is_bitwise_the_uninterrupted_run(plans, tmp_path):
    plan = ["--plan", str(plans[2]), "--steps", "5"]
    # A: five steps without interruption (checkpoints at steps 2 and 4 and at the end).
    a_log, a_ckpt = tmp_path / "a.jsonl", tmp_path / "a"
    done = run(*plan, "--checkpoint", str(a_ckpt), "--log-json", str(a_log))
    assert "step    5/5" in done.stdout and "checkpoint at step 5" in done.stdout
    a = records(a_log)
    assert sorted(a) == list(range(5))

    # B: the same run, killed once it has logged step 2 (while it trains step 3; its last
    # checkpoint holds step 2, so step 2 is trained again after the resume)...
    b_log, b_ckpt = tmp_path / "b.jsonl", tmp_path / "b"
    b_args = [*plan, "--checkpoint", str(b_ckpt), "--log-json", str(b_log)]
    kill_after_step(command(*b_args), b_log, step=2)
    state = load(b_ckpt / "checkpoint.pt")
    assert state["step"] == 2 and (state["data"]["step"], state["data"]["micro_batch"]) == (2, 0)
    assert b_log.read_text().count("\n") == 3  # steps 0, 1, 2
    lost = records(b_log)[2]  # step 2's first attempt: its update died with the process
    # ...then resumed from that checkpoint, with a DataLoader worker per rank this time.
    done = run(*b_args, "--resume", "--workers", "1")
    assert "at step 2" in done.stdout, done.stdout
    # the resume dropped the lost attempt from the log: it holds what the model trained on
    assert b_log.read_text().count("\n") == 5
    b = records(b_log)
    assert b[2] == lost  # step 2 done again exactly as the first time

    assert a.keys() == b.keys()
    for step in a:
        assert a[step]["inputs"] == b[step]["inputs"], f"step {step}: other inputs"
        assert len(set(a[step]["inputs"])) == 2  # the two ranks train on different data
        assert a[step]["loss"] == b[step]["loss"], f"step {step}: loss not bit-identical"
        assert a[step] == b[step]
    assert_same_state(load(a_ckpt / "checkpoint.pt"), load(b_ckpt / "checkpoint.pt"))

    losses = [a[s]["loss"] for s in range(5)]
    assert all(math.isfinite(x) for x in losses)
    assert abs(losses[0] - math.log(2011)) < 0.5  # an untrained model: about uniform
    assert losses[-1] < losses[0] - 0.2  # and it learns
    assert all(sum(a[s]["samples"]) == 32 for s in a)  # samples_per_step of the sample config


@needs_gloo
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_no_thread_of_the_process_group_outlives_the_run(plans, tmp_path):
    """Once main() has destroyed the process group, none of gloo's threads (its transport's
    event loop, the group's worker threads) is left to run into interpreter shutdown."""
    out = tmp_path / "ranks"
    out.mkdir()
    args = ["--plan", str(plans[2]), "--steps", "1", "--checkpoint", str(tmp_path / "ckpt")]
    cmd = [*TORCHRUN, "--nproc_per_node=2", str(EXIT_WORKER), str(out), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=ENV)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    for rank in (0, 1):
        record = json.loads((out / f"rank{rank}.json").read_text())
        assert record["status"] == 0
        left = [name for name in record["threads"] if "gloo" in name]
        assert left == [], f"rank {rank}: threads of the destroyed group still run: {left}"


def test_one_process_without_torchrun(plans, tmp_path):
    """Not launched by torchrun: rank 0 of a world of one (a dp_size-1 plan)."""
    log, ckpt = tmp_path / "log.jsonl", tmp_path / "ckpt"
    args = ["--plan", str(plans[1]), "--checkpoint", str(ckpt), "--log-json", str(log)]
    done = run(*args, "--steps", "1", nproc=None)
    assert "step    1/1" in done.stdout
    (rec,) = records(log).values()
    assert rec["step"] == 0 and len(rec["inputs"]) == 1 and rec["samples"] == [32]
    assert load(ckpt / "checkpoint.pt")["data"]["step"] == 1


def test_refusals(train_tiny, plans, tmp_path, capsys, monkeypatch):
    """Each is one line on stderr and exit status 2, before any training (run in process)."""
    monkeypatch.delenv("RANK", raising=False)

    def refused(*argv: str) -> str:
        assert train_tiny.main(list(argv)) == 2
        return capsys.readouterr().err

    # A dp_size-2 plan in a world of one.
    err = refused("--plan", str(plans[2]))
    assert "dp_size 1" in err and "re-plan" in err, err
    # An existing checkpoint is not overwritten without --resume.
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    fake = {"data": {"format": "mds-executor-state", "version": 1, "plan_id": "0" * 32}}
    torch.save({**fake, "step": 0}, ckpt / "checkpoint.pt")
    err = refused("--plan", str(plans[1]), "--checkpoint", str(ckpt))
    assert "--resume" in err, err
    # The executor refuses to resume a checkpoint of another plan.
    err = refused("--plan", str(plans[1]), "--checkpoint", str(ckpt), "--resume")
    assert "resume with the plan the run started with" in err, err


def test_help(train_tiny, capsys):
    with pytest.raises(SystemExit) as exc:
        train_tiny.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--plan", "--steps", "--checkpoint", "--resume", "--workers", "--log-json"):
        assert flag in out
    with pytest.raises(SystemExit) as exc:
        train_tiny.main(["--plan", "p.mds", "--resume"])
    assert exc.value.code == 2 and "--resume needs --checkpoint" in capsys.readouterr().err


# --- the model's packing rules, in process ------------------------------------------------


def packed(lengths: list[int], vocab: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (sum(lengths),), generator=g)
    cu = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    pos = torch.cat([torch.arange(n) for n in lengths]) if lengths else torch.zeros(0)
    n = len(lengths)
    return {
        "input_ids": ids,
        "position_ids": pos.long(),
        "cu_seqlens": cu,
        "max_seqlen": max(lengths, default=0),
        "source": torch.zeros(n, dtype=torch.int32),
        "sample_id": torch.arange(n),
        "row": torch.arange(n),
        "step": 0,
        "micro_batch": 0,
    }


def test_attention_stays_inside_each_sample(train_tiny):
    torch.manual_seed(0)
    blocks = train_tiny.TinyGPT(50, 32, 2, 2, "blocks").eval()
    mask = train_tiny.TinyGPT(50, 32, 2, 2, "mask").eval()
    mask.load_state_dict(blocks.state_dict())
    mb = packed([5, 1, 7, 3], 50)
    args = (mb["input_ids"], mb["position_ids"], mb["cu_seqlens"])
    with torch.no_grad():
        out = blocks(*args)
        assert torch.allclose(out, mask(*args), atol=1e-5)  # the two attentions agree
        # The same samples alone give the same logits: nothing leaks across boundaries...
        for a, b in [(0, 5), (5, 6), (6, 13), (13, 16)]:
            alone = (mb["input_ids"][a:b], torch.arange(b - a), torch.tensor([0, b - a]))
            assert torch.allclose(out[a:b], blocks(*alone), atol=1e-5)
        # ...and changing a later token changes nothing before it in its sample.
        changed = mb["input_ids"].clone()
        changed[10] = (changed[10] + 1) % 50
        out2 = mask(changed, mb["position_ids"], mb["cu_seqlens"])
        assert torch.equal(out2[:10], mask(*args)[:10]) and not torch.equal(out2[10], out[10])

    mask = train_tiny.block_causal_mask(torch.tensor([0, 2, 3], dtype=torch.int32))
    assert mask.tolist() == [[True, False, False], [True, True, False], [False, False, True]]


def test_next_token_targets_never_cross_samples(train_tiny):
    mb = packed([3, 1, 2], 50)
    where, labels = train_tiny.next_token_targets(mb)
    assert where.tolist() == [0, 1, 4]  # not 2 (end of sample 0), 3 (a 1-token sample), 5
    assert labels.tolist() == mb["input_ids"][[1, 2, 5]].tolist()


def test_accumulation_is_the_mean_over_the_step_tokens(train_tiny):
    """Two micro-batches, one of them empty, train like one micro-batch of the same samples."""
    args = train_tiny.parse_args(["--plan", "unused", "--warmup", "1"])
    first, second = packed([4, 6], 50, seed=1), packed([5], 50, seed=2)
    together = packed([4, 6, 5], 50)
    together["input_ids"] = torch.cat([first["input_ids"], second["input_ids"]])
    empty = packed([], 50)
    results = []
    for mbs in ([first, empty, second], [together]):
        torch.manual_seed(0)
        model = train_tiny.TinyGPT(50, 32, 2, 2, "blocks")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss, tokens, samples = train_tiny.train_step(model, opt, mbs, 0, args)
        results.append((loss, tokens, samples, [p.grad.clone() for p in model.parameters()]))
    (l1, t1, s1, g1), (l2, t2, s2, g2) = results
    assert (t1, s1) == (t2, s2) == (12, 3)
    assert math.isclose(l1, l2, rel_tol=1e-6)
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(g1, g2, strict=True))
