"""PlanDataLoader against a stand-in of torchtitan: torchtitan 0.3 installs here, but with
wandb, tensorboard, datasets and pandas, and its trainer targets GPUs, so the test drives
the loader the way torchtitan's train loop does (`next()` once per micro-batch of a step)
and checkpoints it the way its DCP checkpointer does: torch.distributed.checkpoint saving
and loading the loader as a Stateful under the key "dataloader"."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from executor_builders import open_executor, text_tokenizers

from mds.executor.integrations.torchtitan import IGNORE_INDEX, PlanDataLoader

STEPS, AT = 4, 2
# one process, no process group: DCP says it saves as a single process
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def build(plan):
    # what torchtitan's trainer passes to config.dataloader.build(...)
    return PlanDataLoader(
        plan,
        dp_rank=0,
        dp_world_size=1,
        tokenizer=None,
        seq_len=8192,
        local_batch_size=1,
        executor_kwargs={"tokenize": text_tokenizers(), "estimated": "fit"},
    )


def run(loader, first_step, seen, checkpoint=None):
    """torchtitan's loop, reduced: a step pulls `micro_batches` batches; checkpoint at AT."""
    it = iter(loader)
    for step in range(first_step + 1, STEPS + 1):
        for _ in range(loader.micro_batches):
            inputs, labels = next(it)
            seen.append(inputs["input"][0].tolist())
        if checkpoint is not None and step == AT:
            dcp.save({"dataloader": loader}, checkpoint_id=str(checkpoint))


def test_resume_from_a_dcp_checkpoint_gives_the_same_batches(small_plan, tmp_path):
    full: list = []
    run(build(small_plan), 0, full, checkpoint=tmp_path / f"step-{AT}")
    resumed_loader = build(small_plan)
    dcp.load({"dataloader": resumed_loader}, checkpoint_id=str(tmp_path / f"step-{AT}"))
    state = resumed_loader.state_dict()
    assert (state["step"], state["micro_batch"]) == (AT, 0)

    with open_executor(small_plan, 0) as ex:
        expected = [b["input_ids"].tolist() for b in ex]
    assert full == expected
    resumed: list = []
    run(resumed_loader, AT, resumed)
    assert resumed == expected[AT * 2 :]


def test_labels_are_the_next_token_within_each_sample(small_plan):
    loader = build(small_plan)
    with open_executor(small_plan, 0) as ex:
        mb = next(iter(ex))
    inputs, labels = next(iter(loader))
    ids, labels = inputs["input"][0], labels[0]
    cu = mb["cu_seqlens"].tolist()
    assert len(cu) > 2 and inputs["positions"].shape == inputs["input"].shape
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        assert labels[a : b - 1].tolist() == ids[a + 1 : b].tolist()
        assert labels[b - 1] == IGNORE_INDEX
        assert inputs["positions"][0, a:b].tolist() == list(range(b - a))
    assert torch.equal(ids, mb["input_ids"])
