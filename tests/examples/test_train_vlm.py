"""examples/train_vlm.py: a tiny Qwen2-VL trained by two torchrun ranks from a dp_size-2
plan of the image-text sample data (sample_data/vlm.toml). A run stopped at a checkpoint and
resumed (with DataLoader workers) trains on bit-identical inputs, images included, and
reaches bit-identical losses and weights as an uninterrupted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from plan_builders import REPO

EXAMPLE = REPO / "examples" / "train_vlm.py"
CONFIG = REPO / "sample_data" / "vlm.toml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="torch.distributed with the gloo backend is not available in this torch build",
    ),
]


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    pytest.importorskip("PIL")
    from mds.planner.index.build import build_index
    from mds.planner.index.config import load_config
    from mds.planner.plan.build import build_plan, with_overrides
    from mds.planner.plan.config import load_plan_config

    out = tmp_path_factory.mktemp("train-vlm")
    build_index(load_config(CONFIG), out / "index", workers=1)
    path = out / "plan.mds"
    build_plan(with_overrides(load_plan_config(CONFIG), index=out / "index"), path, workers=1)
    return path


def run(*args: str) -> None:
    cmd = [*TORCHRUN, str(EXAMPLE), *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_resume_is_exact(plan, tmp_path):
    run(
        "--plan",
        plan,
        "--steps",
        4,
        "--checkpoint",
        tmp_path / "a",
        "--log-json",
        tmp_path / "a.jsonl",
    )
    run(
        "--plan",
        plan,
        "--steps",
        2,
        "--checkpoint",
        tmp_path / "b",
        "--log-json",
        tmp_path / "b.jsonl",
    )
    run(
        "--plan",
        plan,
        "--steps",
        4,
        "--checkpoint",
        tmp_path / "b",
        "--resume",
        "--log-json",
        tmp_path / "b.jsonl",
        "--workers",
        1,
    )
    a, b = records(tmp_path / "a.jsonl"), records(tmp_path / "b.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2, 3]
    assert a == b  # inputs (tokens, labels, pixels) and losses, bit for bit
    assert sum(sum(r["images"]) for r in a) > 10
    assert all(r["loss"] == r["loss"] and r["loss"] < 20 for r in a)
    ka = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)
    kb = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    assert ka["data"] == kb["data"] and ka["step"] == kb["step"] == 4
    for name, value in ka["model"].items():
        assert torch.equal(value, kb["model"][name]), name
