"""Elastic training end to end: the tiny example trains on 2 ranks to step 4, the plan is
re-planned for 1 rank (4 micro-batches) from step 4 and the run resumes on one process to
step 8, then it is re-planned back to 2 ranks from step 8 and resumes under torchrun to
the end. What the model trained on is every step once, and per source exactly the stream
prefix an unchanged run would have drawn: nothing consumed twice inside an epoch, nothing
skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import replace

import pytest
from plan_builders import (
    REPO,
    per_source,
    sample_index,
    sample_plan_config,
    step_ids,
    stream_prefix,
)

from mds.planner.plan.build import build_plan, with_overrides

EXAMPLE = REPO / "examples" / "train_tiny.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
SMALL = ["--layers", "1", "--d-model", "16", "--heads", "1", "--save-every", "1"]


def train(plan, work, steps: int, ranks: int, resume: bool) -> None:
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
        if ranks > 1
        else [sys.executable]
    )
    args = ["--plan", str(plan), "--steps", str(steps), "--checkpoint", str(work / "ckpt")]
    args += ["--log-json", str(work / "log.jsonl"), *SMALL, *(["--resume"] if resume else [])]
    done = subprocess.run(
        [*launcher, str(EXAMPLE), *args], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"


@pytest.mark.slow
def test_two_ranks_then_one_then_two_train_on_exactly_the_stream(tmp_path_factory, tmp_path):
    config = with_overrides(sample_plan_config(sample_index(tmp_path_factory)), dp_size=2, steps=12)
    one_rank = replace(config, train=replace(config.train, dp_size=1, micro_batches=4))
    a, b, c = (tmp_path / f"{name}.mds" for name in "abc")
    build_plan(config, a)
    train(a, tmp_path, 4, ranks=2, resume=False)
    build_plan(one_rank, b, parent=a, at_step=4)
    train(b, tmp_path, 8, ranks=1, resume=True)
    build_plan(config, c, parent=b, at_step=8)
    train(c, tmp_path, 12, ranks=2, resume=True)

    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(12))
    assert [len(r["sample_ids"]) for r in records] == [2] * 4 + [1] * 4 + [2] * 4  # ranks
    trained = [i for r in records for ids in r["sample_ids"] for i in ids]
    planned = {**step_ids(a, 0, 4), **step_ids(b, 4, 8), **step_ids(c, 8, 12)}
    for r in records:
        assert sorted(i for ids in r["sample_ids"] for i in ids) == sorted(planned[r["step"]])
    assert Counter(trained) == stream_prefix(config, per_source(a, trained))
