"""The executor under a real launcher: two torchrun ranks (gloo, CPU) replay a dp_size-2
plan of the sample data, and together they train on exactly the plan, each sample once;
TP peers of one DP rank get identical batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
from plan_builders import plan_slots, sample_index, sample_plan_config

from mds.core.planfile_reader import PlanReader
from mds.executor import ConfigError, PlanExecutor

WORKER = Path(__file__).resolve().parent / "dist_worker.py"
TOKENIZER = Path(__file__).resolve().parents[2] / "sample_data" / "tokenizer.json"

needs_gloo = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available in this torch build",
)


@pytest.fixture(scope="module")
def plan_dp2(tmp_path_factory) -> Path:
    """sample_data/mds.toml planned for dp_size 2 (the index is the session's sample index)."""
    from mds.planner.plan.build import build_plan, with_overrides

    config = with_overrides(sample_plan_config(sample_index(tmp_path_factory)), dp_size=2)
    out = tmp_path_factory.mktemp("dist-plan") / "plan-dp2.mds"
    build_plan(config, out, workers=1)
    return out


def tokenize():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def torchrun(nproc: int, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=nproc ARGS`, through the interpreter running the
    tests (torchrun is `python -m torch.distributed.run`)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc_per_node={nproc}", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done


@needs_gloo
def test_two_torchrun_ranks_replay_the_plan_disjointly_and_completely(plan_dp2, tmp_path):
    out = tmp_path / "ranks.json"
    torchrun(2, str(WORKER), str(plan_dp2), str(out))
    ranks = json.loads(out.read_text())

    with PlanReader(plan_dp2) as reader:
        steps, micro = reader.steps, reader.micro
        stats = reader.section("stats")
        columns = reader.footer["stats_columns"]
        per_source = reader.section("source_samples")
        planned_names = [s["name"] for s in reader.footer["sources"]]
        index_names = [s["name"] for s in reader.footer["index"]["sources"]]
    assert [r["rank"] for r in ranks] == [r["env_rank"] for r in ranks] == [0, 1]
    assert [(r["dp_rank"], r["dp_size"], r["world"]) for r in ranks] == [(0, 2, 2), (1, 2, 2)]

    # Every rank walked every (step, micro-batch) of the plan, in order, to the end.
    for r in ranks:
        positions = [(x["step"], x["micro_batch"]) for x in r["records"]]
        assert positions == [(s, m) for s in range(steps) for m in range(micro)]
        assert (r["final_state"]["step"], r["final_state"]["micro_batch"]) == (steps, 0)
        assert r["source_names"] == index_names

    # Exactly what the plan file holds for that rank, read independently of the executor.
    expected: dict[tuple[int, int, int], list[int]] = {}
    for step, rank, mb, gid in plan_slots(plan_dp2):
        expected.setdefault((step, rank, mb), []).append(gid)
    for r in ranks:
        for x in r["records"]:
            key = (x["step"], r["dp_rank"], x["micro_batch"])
            assert x["sample_ids"] == expected.get(key, []), key

    # Per step: the ranks' samples are disjoint and together they are the step's plan.
    samples_col = columns.index("samples")
    for step in range(steps):
        got = [
            [i for x in r["records"] if x["step"] == step for i in x["sample_ids"]] for r in ranks
        ]
        # (A sample can repeat inside a step only where its source wraps to a new epoch;
        # in this plan none does, so each sample is on exactly one rank.)
        assert not set(got[0]) & set(got[1]), f"step {step}: a sample on both ranks"
        union = got[0] + got[1]
        assert len(union) == len(set(union)) == stats[step, samples_col], step
        want = [g for (s, _r, _m), ids in expected.items() if s == step for g in ids]
        assert Counter(union) == Counter(want), step
        sources = Counter(
            index_names[s]
            for r in ranks
            for x in r["records"]
            if x["step"] == step
            for s in x["sources"]
        )
        assert {n: sources.get(n, 0) for n in planned_names} == {
            n: int(per_source[step, j]) for j, n in enumerate(planned_names)
        }, step
    # The balancer gives both ranks work at every step.
    assert all(
        any(x["sample_ids"] for x in r["records"] if x["step"] == s)
        for r in ranks
        for s in range(steps)
    )


def test_tp_peers_get_identical_batches(plan_dp2):
    """World 4 with tp=2 is dp_size 2: global ranks (0, 1) are DP rank 0, (2, 3) DP rank 1
    under the default tp-fastest order, and TP peers receive bit-identical micro-batches."""
    fn = tokenize()
    batches, where = {}, {}
    for rank in range(4):
        environ = {"RANK": str(rank), "WORLD_SIZE": "4"}
        with PlanExecutor.from_env(
            plan_dp2, tp=2, environ=environ, estimated="fit", tokenize=fn
        ) as ex:
            where[rank] = (ex.dp_rank, ex.dp_size)
            batches[rank] = list(ex)
    assert where == {0: (0, 2), 1: (0, 2), 2: (1, 2), 3: (1, 2)}
    for a, b in ((0, 1), (2, 3)):
        assert len(batches[a]) == len(batches[b]) > 0
        for x, y in zip(batches[a], batches[b], strict=True):
            assert x.keys() == y.keys()
            for key in x:
                if hasattr(x[key], "numpy"):
                    assert x[key].dtype == y[key].dtype
                    assert np.array_equal(x[key].numpy(), y[key].numpy()), key
                else:
                    assert x[key] == y[key], key
    # Different DP ranks: different samples, never the same one in a step.
    for x, y in zip(batches[0], batches[2], strict=True):
        assert not set(x["sample_id"].tolist()) & set(y["sample_id"].tolist())

    # dp-fastest order: DP rank is the global rank mod dp_size.
    for rank in range(4):
        environ = {"RANK": str(rank), "WORLD_SIZE": "4"}
        with PlanExecutor.from_env(
            plan_dp2, tp=2, order="dp-tp-cp-pp", environ=environ, estimated="fit", tokenize=fn
        ) as ex:
            assert (ex.dp_rank, ex.dp_size) == (rank % 2, 2)


def test_mesh_that_does_not_match_the_plan_is_refused(plan_dp2):
    fn = tokenize()
    with pytest.raises(ConfigError, match="dp_size 1.*re-plan"):  # world 2, tp 2: dp_size 1
        PlanExecutor.from_env(
            plan_dp2, tp=2, environ={"RANK": "0", "WORLD_SIZE": "2"}, estimated="fit", tokenize=fn
        )
    with pytest.raises(ConfigError, match="multiple"):
        PlanExecutor.from_env(
            plan_dp2, tp=2, environ={"RANK": "0", "WORLD_SIZE": "3"}, estimated="fit", tokenize=fn
        )
    with pytest.raises(ConfigError, match="WORLD_SIZE is not set"):
        PlanExecutor.from_env(plan_dp2, environ={"RANK": "0"}, estimated="fit", tokenize=fn)
    with pytest.raises(ConfigError, match="this job has dp_size 1"):  # no launcher: world of 1
        PlanExecutor.from_env(plan_dp2, environ={}, estimated="fit", tokenize=fn)
