"""Megatron-LM: a train data iterator over this process's DP rank of a plan, in the batch
layout of Megatron's GPT `forward_step` with packed sequences (THD).

The DP rank is Megatron's own (`parallel_state.get_data_parallel_rank()`), so TP, CP and
PP peers replay the same micro-batches. Megatron saves the iteration in its checkpoints;
an iteration is a plan step when `--micro-batch-size 1` and the number of micro-batches
per iteration equals the plan's, so `plan_iterator(plan, iteration=args.iteration)` resumes
exactly (pretrain sets `args.iteration` from the checkpoint before it builds the data).
Use it with `--dataloader-type external`: Megatron then iterates the provider's object as is.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from mds.core.cp_layout import SPLIT
from mds.errors import ConfigError, needs_extra

with needs_extra(__name__, "megatron"):
    import torch
    from megatron.core import parallel_state
    from megatron.core.packed_seq_params import PackedSeqParams

    from mds.executor.executor import PlanExecutor

__all__ = ["PlanIterator", "dp_coordinates", "megatron_batch"]


def dp_coordinates() -> tuple[int, int]:
    """(dp_rank, dp_size) from Megatron's initialized model-parallel state."""
    return (
        parallel_state.get_data_parallel_rank(),
        parallel_state.get_data_parallel_world_size(),
    )


def megatron_batch(mb: Mapping[str, Any]) -> dict[str, Any]:
    """A micro-batch as Megatron's GPT forward takes packed sequences: `tokens`, `labels`
    (the next token within the same sample), `loss_mask` (0 on each sample's last token,
    which has no next token in its sample), `position_ids`, all `[1, T]`, no attention mask,
    and `packed_seq_params` (THD, the samples' cu_seqlens and max_seqlen).

    A CP rank's slice (docs/executor.md, "Context parallelism") whose samples are all split
    becomes Megatron's THD CP batch: its tokens, `shift_labels` as labels, and
    `PackedSeqParams` with the split samples' `cu_seqlens` and `cu_seqlens_*_padded`.
    Megatron-core splits every sequence of a CP batch, so a slice holding whole samples is
    refused (their attention needs routing Megatron does not do): plan with `[train]`
    `cp_split_from = 1`, which splits every sample."""
    if "cp_rank" in mb:
        return _megatron_cp_batch(mb)
    ids = mb["input_ids"]
    cu = mb["cu_seqlens"].to(torch.int32)
    labels = torch.empty_like(ids)
    labels[:-1] = ids[1:]
    loss_mask = torch.ones(ids.shape, dtype=torch.float32)
    if ids.numel():
        labels[-1] = 0
        loss_mask[(cu[1:] - 1).long()] = 0.0
    return _thd_batch(mb, ids, labels, loss_mask, cu, int(mb["max_seqlen"]))


def _megatron_cp_batch(mb: Mapping[str, Any]) -> dict[str, Any]:
    # an empty sample has no tokens on any CP rank, whatever its layout
    if bool(((mb["cp_layout"] != SPLIT) & (mb["seqlens"] > 0)).any()):
        raise ConfigError(
            "this micro-batch keeps samples whole on one CP rank, which Megatron-core's THD "
            "context parallelism cannot route; re-plan with cp_split_from = 1 in [train] so "
            "that every sample is split"
        )
    labels = mb["shift_labels"]
    return _thd_batch(
        mb,
        mb["input_ids"],
        labels.clamp(min=0),
        (labels != -100).to(torch.float32),
        mb["cu_seqlens_split"].to(torch.int32),
        int(mb["max_seqlen_split"]),
        padded=mb["cu_seqlens_split_padded"].to(torch.int32),
    )


def _thd_batch(mb, tokens, labels, loss_mask, cu, max_len, padded=None) -> dict[str, Any]:
    """Megatron's packed (THD) batch: `[1, T]` tensors and PackedSeqParams over `cu`
    (and, for a CP slice, the padded cu_seqlens its chunks were cut from)."""
    pads = {}
    if padded is not None:
        pads = {"cu_seqlens_q_padded": padded, "cu_seqlens_kv_padded": padded}
    return {
        "tokens": tokens.unsqueeze(0),
        "labels": labels.unsqueeze(0),
        "loss_mask": loss_mask.unsqueeze(0),
        "position_ids": mb["position_ids"].unsqueeze(0),
        "attention_mask": None,
        "packed_seq_params": PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu,
            cu_seqlens_kv=cu,
            max_seqlen_q=max_len,
            max_seqlen_kv=max_len,
            **pads,
        ),
    }


class PlanIterator:
    """Megatron's train data iterator: `next()` is the next micro-batch of this DP rank, as
    `megatron_batch` lays it out, from plan step `iteration` on.

    `num_workers` > 0 fetches in DataLoader workers; other keyword arguments go to
    `PlanExecutor` (`tokenize=`, `estimated=`, `data_root=`, ...).
    """

    def __init__(
        self,
        plan: str | os.PathLike,
        *,
        iteration: int = 0,
        num_workers: int = 0,
        **executor_kwargs: Any,
    ):
        dp_rank, dp_size = dp_coordinates()
        self.executor = PlanExecutor(plan, dp_rank, dp_size=dp_size, **executor_kwargs)
        if iteration != self.executor.position[0]:
            self.executor.seek(iteration)
        self._it: Iterator[dict[str, Any]] = iter(self.executor.dataloader(num_workers))

    @property
    def micro_batches(self) -> int:
        """Micro-batches per iteration: the plan's."""
        return self.executor.micro_batches

    def __iter__(self) -> PlanIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        mb = next(self._it)
        batch = megatron_batch(mb)
        batch["step"], batch["micro_batch"] = mb["step"], mb["micro_batch"]
        batch["sample_id"] = mb["sample_id"]
        return batch

    def state_dict(self) -> dict[str, Any]:
        return self.executor.state_dict()

    def close(self) -> None:
        self.executor.close()
