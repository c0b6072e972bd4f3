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

from mds.core.cp_layout import SPLIT
from mds.errors import ConfigError
from mds.executor.cp import split_token_mask
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


CP = 2


def build_cp(plan, cp_rank=None, cp_size=None, **kwargs):
    return PlanDataLoader(
        plan,
        dp_rank=0,
        dp_world_size=1,
        executor_kwargs={"tokenize": text_tokenizers(), "estimated": "fit"},
        cp_rank=cp_rank,
        cp_size=cp_size,
        **kwargs,
    )


def items(loader, first_step=0, checkpoint=None):
    """(input, positions, labels) of every micro-batch from `first_step` on, as lists."""
    out, it = [], iter(loader)
    for step in range(first_step + 1, STEPS + 1):
        for _ in range(loader.micro_batches):
            inputs, labels = next(it)
            assert inputs["input"].shape == inputs["positions"].shape == labels.shape
            out.append(
                (inputs["input"][0].tolist(), inputs["positions"][0].tolist(), labels[0].tolist())
            )
        if checkpoint is not None and step == AT:
            dcp.save({"dataloader": loader}, checkpoint_id=str(checkpoint))
    return out


def test_cp_slices_put_back_by_the_layout_are_the_cp1_batch(small_cp_plan):
    whole = items(build_cp(small_cp_plan))
    ranks = [items(build_cp(small_cp_plan, r, CP)) for r in range(CP)]
    with open_executor(small_cp_plan, 0) as ex:
        batches = list(ex)
    assert len(whole) == len(batches) == len(ranks[0]) == len(ranks[1])
    kinds = set()
    for m, mb in enumerate(batches):
        lengths = mb["cu_seqlens"].diff().tolist()
        layout = mb["cp_layout"].tolist()
        # each sample's tokens by global position: {position: (token, label)}
        got: list[dict[int, tuple[int, int]]] = [{} for _ in lengths]
        for r in range(CP):
            ids, pos, labels = ranks[r][m]
            at = 0
            for k, (n, lay) in enumerate(zip(lengths, layout, strict=True)):
                size = 2 * -(-n // (2 * CP)) if lay == SPLIT else (n if lay == r else 0)
                for j in range(at, at + size):
                    assert pos[j] not in got[k]
                    got[k][pos[j]] = (ids[j], labels[j])
                at += size
            assert at == len(ids)
        kinds |= {lay == SPLIT for lay in layout}
        want_ids, want_pos, want_labels = whole[m]
        ids, pos, labels = [], [], []
        for k, n in enumerate(lengths):
            padded = -(-n // (2 * CP)) * 2 * CP if layout[k] == SPLIT else n
            assert sorted(got[k]) == list(range(padded))
            assert all(got[k][p] == (0, IGNORE_INDEX) for p in range(n, padded))
            ids += [got[k][p][0] for p in range(n)]
            labels += [got[k][p][1] for p in range(n)]
            pos += list(range(n))
        assert (ids, pos, labels) == (want_ids, want_pos, want_labels)
    assert kinds == {True, False}  # the plan splits some samples and keeps others whole


def test_cp_resume_from_a_dcp_checkpoint_gives_the_same_slices(small_cp_plan, tmp_path):
    for r in range(CP):
        ckpt = tmp_path / f"rank-{r}"
        full = items(build_cp(small_cp_plan, r, CP), checkpoint=ckpt)
        resumed_loader = build_cp(small_cp_plan, r, CP)
        dcp.load({"dataloader": resumed_loader}, checkpoint_id=str(ckpt))
        assert items(resumed_loader, AT) == full[AT * resumed_loader.micro_batches :]


def test_cp_split_mask_and_conflicting_cp_keys(small_cp_plan):
    loader = build_cp(small_cp_plan, 1, CP, with_split_mask=True)
    with open_executor(small_cp_plan, 0, cp_rank=1, cp_size=CP) as ex:
        piece = next(iter(ex))
    inputs, _ = next(iter(loader))
    assert torch.equal(inputs["split_mask"][0], split_token_mask(piece))
    with pytest.raises(ConfigError, match=r"cp_rank=1 differs from executor_kwargs"):
        PlanDataLoader(
            small_cp_plan, dp_rank=0, dp_world_size=1, cp_rank=1, executor_kwargs={"cp_rank": 0}
        )


def test_cp_slices_from_dataloader_workers_are_the_same(small_cp_plan):
    want = items(build_cp(small_cp_plan, 1, CP))
    assert items(build_cp(small_cp_plan, 1, CP, num_workers=1)) == want
