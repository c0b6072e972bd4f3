"""torchtitan: a dataloader with the interface of torchtitan's `BaseDataLoader` (iterate
`(input_dict, labels)`, `state_dict()`/`load_state_dict()` for its DCP checkpointer),
replaying the DP rank torchtitan gives it (`dp_rank`, `dp_world_size` from its "batch" mesh).

It does not import torchtitan: the few lines that register it with torchtitan's config
system are in docs/trainers.md. Each item is one packed micro-batch: `input` and
`positions` of shape `[1, T]` (torchtitan builds Flex/varlen document masks from the
position restarts) and `labels` `[1, T]`, the next token within the same sample and -100
on each sample's last token. Set the gradient accumulation so that a training step takes
the plan's micro-batches per step (`global_batch_size = micro_batches x dp size`,
`local_batch_size = 1`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from mds.errors import needs_extra

with needs_extra(__name__, "train"):
    import torch

    from mds.executor.executor import PlanExecutor
    from mds.executor.integrations.batches import PlanBatches

__all__ = ["IGNORE_INDEX", "PlanDataLoader", "titan_batch"]

IGNORE_INDEX = -100  # torchtitan's


def titan_batch(mb: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A micro-batch as torchtitan's train step takes it: ({"input", "positions"}, labels)."""
    ids = mb["input_ids"]
    labels = torch.full_like(ids, IGNORE_INDEX)
    if ids.numel():
        # a vision plan's labels are -100 at image tokens, which nothing learns to predict
        labels[:-1] = mb["labels"][1:] if "labels" in mb else ids[1:]
        labels[(mb["cu_seqlens"][1:] - 1).long()] = IGNORE_INDEX
    inputs = {"input": ids.unsqueeze(0), "positions": mb["position_ids"].unsqueeze(0)}
    return inputs, labels.unsqueeze(0)


class PlanDataLoader:
    """torchtitan's dataloader protocol over a plan. Takes the keyword arguments torchtitan's
    trainer passes to `config.dataloader.build(...)` (`dp_rank`, `dp_world_size`; the others,
    such as `tokenizer`, `seq_len`, `local_batch_size`, are ignored: the plan fixes them).
    `executor_kwargs` go to `PlanExecutor`; `num_workers` > 0 fetches in DataLoader workers.
    """

    def __init__(
        self,
        plan: str | os.PathLike,
        *,
        dp_rank: int,
        dp_world_size: int,
        num_workers: int = 0,
        executor_kwargs: Mapping[str, Any] | None = None,
        **_ignored: Any,
    ):
        self.executor = PlanExecutor(
            plan, dp_rank, dp_size=dp_world_size, **dict(executor_kwargs or {})
        )
        self.batches = PlanBatches(self.executor, num_workers=num_workers)

    @property
    def micro_batches(self) -> int:
        """Micro-batches per plan step: the gradient accumulation steps to configure."""
        return self.executor.micro_batches

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        for mb in self.batches:
            yield titan_batch(mb)

    def state_dict(self) -> dict[str, Any]:
        return self.batches.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        if state_dict:  # torchtitan loads an empty state when a checkpoint holds none
            self.batches.load_state_dict(state_dict)
