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

Context parallelism: on a plan made with `cp_size` > 1, `cp_rank=` and `cp_size=` (the
job's CP mesh; the same keys are also taken from `executor_kwargs`, as `PlanExecutor` takes
them) make each item this CP rank's slice of the micro-batch (`mds.executor.cp`): `input`
the slice's tokens `[1, T_local]`, `positions` the global position of each of them in its
sample (so RoPE and document masks see where a chunk lies in its sample), and `labels` the
slice's `shift_labels` (shifted before the cut; -100 on each sample's last token and on
padding). mds has already cut the micro-batch per sample (head-tail split or kept whole),
so torchtitan's `context_parallel(...)` buffer sharding must NOT be applied to these
tensors (it would cut the slice again, along the whole row instead of per sample). The model must attend:
tokens of split samples (`split_token_mask` of the slice; `with_split_mask=True` passes it
as `input_dict["split_mask"]`) with ring attention or all-gathered K/V over the CP group,
masked by sample and causal on the global positions; tokens of whole samples only locally
(each whole sample is entirely on this CP rank and on no other).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from mds.errors import ConfigError, needs_extra

with needs_extra(__name__, "train"):
    import torch

    from mds.executor.cp import split_token_mask
    from mds.executor.executor import PlanExecutor
    from mds.executor.integrations.batches import PlanBatches

__all__ = ["IGNORE_INDEX", "PlanDataLoader", "titan_batch"]

IGNORE_INDEX = -100  # torchtitan's


def titan_batch(
    mb: Mapping[str, Any], *, with_split_mask: bool = False
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A micro-batch as torchtitan's train step takes it: ({"input", "positions"}, labels).
    A CP rank's slice gives its tokens, their global positions and its `shift_labels`
    (and, with `with_split_mask`, "split_mask": which tokens belong to split samples)."""
    ids = mb["input_ids"]
    if "cp_rank" in mb:
        inputs = {"input": ids.unsqueeze(0), "positions": mb["position_ids"].unsqueeze(0)}
        if with_split_mask:
            inputs["split_mask"] = split_token_mask(mb).unsqueeze(0)
        return inputs, mb["shift_labels"].unsqueeze(0)
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
    `cp_rank`, `cp_size`: this process's CP rank and the job's CP size, on a plan made with
    `cp_size` > 1 (each item is then the CP rank's slice; the module docstring says how a
    model takes it); `with_split_mask` adds `input_dict["split_mask"]` to CP slices.
    """

    def __init__(
        self,
        plan: str | os.PathLike,
        *,
        dp_rank: int,
        dp_world_size: int,
        num_workers: int = 0,
        executor_kwargs: Mapping[str, Any] | None = None,
        cp_rank: int | None = None,
        cp_size: int | None = None,
        with_split_mask: bool = False,
        **_ignored: Any,
    ):
        kwargs = dict(executor_kwargs or {})
        for key, value in (("cp_rank", cp_rank), ("cp_size", cp_size)):
            if value is None:
                continue
            if kwargs.get(key, value) != value:
                raise ConfigError(
                    f"{key}={value!r} differs from executor_kwargs[{key!r}]="
                    f"{kwargs[key]!r}; give it once"
                )
            kwargs[key] = value
        self.executor = PlanExecutor(plan, dp_rank, dp_size=dp_world_size, **kwargs)
        self.with_split_mask = with_split_mask
        self.batches = PlanBatches(self.executor, num_workers=num_workers)

    @property
    def micro_batches(self) -> int:
        """Micro-batches per plan step: the gradient accumulation steps to configure."""
        return self.executor.micro_batches

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        for mb in self.batches:
            yield titan_batch(mb, with_split_mask=self.with_split_mask)

    def state_dict(self) -> dict[str, Any]:
        return self.batches.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        if state_dict:  # torchtitan loads an empty state when a checkpoint holds none
            self.batches.load_state_dict(state_dict)
