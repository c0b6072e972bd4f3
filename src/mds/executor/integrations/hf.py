"""Hugging Face Trainer / accelerate: packed batches in the shapes HF causal LMs take, and a
Trainer whose train dataloader replays this process's DP rank of a plan.

`hf_batch` turns a micro-batch dict into `input_ids`, `labels` and `position_ids` of shape
`[1, T]` (the samples packed in one row, no padding), plus flash-attention's varlen
metadata (`cu_seq_lens_q/k`, `max_length_q/k`, what `DataCollatorWithFlattening` emits).
HF models find the sample boundaries from the position restarts (SDPA and eager build a
block-diagonal causal mask from them; flash-attention-2 uses the varlen kernels), and each
sample's first label is -100, so no token learns to predict the next sample.

A micro-batch of a vision plan (docs/vision.md, "Training") also gives `pixel_values` and
`image_grid_thw` (when it holds images) and its own labels, -100 at image tokens too; with
the plan's geometry (`vision=ex.vision`), `position_ids` are Qwen2-VL's packed layout
`[4, 1, T]`: each sample's text positions (from which the model builds the packed mask),
then its M-RoPE temporal, height and width positions (`qwen2_vl_position_ids`).

`PlanTrainer` is a `transformers.Trainer` whose `get_train_dataloader` is a `PlanBatches`
(sized: `len()` is the rank's micro-batches, so `max_steps` and LR schedules follow the
plan). The rank is accelerate's process index, split with `tp`/`cp` when the accelerator
has a parallelism config. Each checkpoint folder gets the executor state
(`mds_executor_state.json`, written by `PlanStateCallback`), and `train(resume_from_checkpoint=...)`
seeks to it instead of skipping batches. Use `per_device_train_batch_size=1` and
`gradient_accumulation_steps=executor.micro_batches`, so that an optimizer step is a plan step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mds.core.planfile_reader import PlanReader
from mds.errors import ConfigError, PlanError, needs_extra
from mds.executor.mesh import mesh_position

with needs_extra(__name__, "hf"):
    import torch
    from transformers import Trainer, TrainerCallback
    from transformers.trainer_utils import get_last_checkpoint

    from mds.executor.executor import PlanExecutor
    from mds.executor.integrations.batches import PlanBatches

__all__ = [
    "STATE_FILE",
    "PlanStateCallback",
    "PlanTrainer",
    "dp_coordinates",
    "hf_batch",
    "qwen2_vl_position_ids",
]

STATE_FILE = "mds_executor_state.json"


def hf_batch(
    mb: Mapping[str, Any],
    *,
    flash_attn_kwargs: bool = True,
    use_cache: bool = False,
    vision: Any = None,
) -> dict[str, Any]:
    """A micro-batch as keyword arguments of an HF causal LM's forward: `[1, T]` tensors,
    labels with -100 at each sample's first token. An empty micro-batch becomes one token 0
    whose label is -100, so that every rank still runs the step's forward and backward.

    A vision plan's micro-batch: its labels (-100 at image tokens too), and `pixel_values`
    and `image_grid_thw` when it holds images; `vision` (the plan's `VisionGeometry`,
    `ex.vision`) makes `position_ids` Qwen2-VL's `[4, 1, T]` (`qwen2_vl_position_ids`)."""
    input_ids = mb["input_ids"]
    position_ids = mb["position_ids"]
    cu = mb["cu_seqlens"].to(torch.int32)
    max_len = int(mb["max_seqlen"])
    empty = input_ids.numel() == 0
    if empty:
        input_ids = position_ids = torch.zeros(1, dtype=torch.int64)
        cu, max_len = torch.tensor([0, 1], dtype=torch.int32), 1
    if "labels" in mb and not empty:
        labels = mb["labels"]
    else:
        labels = input_ids.clone()
        labels[cu[:-1].long()] = -100  # each sample's first token; all of an empty batch's one
    positions = position_ids.unsqueeze(0)
    if vision is not None and "image_grid_thw" in mb and not empty:
        positions = qwen2_vl_position_ids(mb, vision.merge_size, vision.image_token_id)
    out: dict[str, Any] = {
        "input_ids": input_ids.unsqueeze(0),
        "labels": labels.unsqueeze(0),
        "position_ids": positions,
        "use_cache": use_cache,  # a cache turns off HF's packed-sequence masks
    }
    if "pixel_values" in mb and len(mb["image_grid_thw"]):
        out["pixel_values"] = mb["pixel_values"]
        out["image_grid_thw"] = mb["image_grid_thw"]
    if flash_attn_kwargs:
        out.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max_len, max_length_k=max_len)
    return out


def qwen2_vl_position_ids(
    mb: Mapping[str, Any], merge_size: int, image_token_id: int
) -> torch.Tensor:
    """Qwen2-VL's packed position ids `[4, 1, T]` of a micro-batch: row 0 each sample's text
    positions (restarting at 0, from which HF builds the packed causal mask), rows 1-3 its
    M-RoPE (temporal, height, width) positions as `Qwen2VLModel.get_rope_index` computes
    them for that sample alone: text tokens count on from the position before; an image's
    placeholders (`image_token_id`, `grid_h * grid_w / merge_size^2` of them) take the
    position before them in t, plus their merged row in h and column in w; the text after
    an image starts at that position plus max(merged rows, merged columns)."""
    ids = mb["input_ids"]
    cu = mb["cu_seqlens"].tolist()
    grids = mb["image_grid_thw"].tolist()
    owner = mb["image_sample"].tolist()
    rope = torch.empty(3, len(ids), dtype=torch.int64)
    placeholders = torch.nonzero(ids == image_token_id).flatten().tolist()
    spot, image = 0, 0
    for k in range(len(cu) - 1):
        lo, hi = cu[k], cu[k + 1]
        at, pos = lo, 0  # next token to place, its position
        while image < len(grids) and owner[image] == k:
            _t, gh, gw = grids[image]
            h, w = gh // merge_size, gw // merge_size
            first = placeholders[spot]
            rope[:, at:first] = torch.arange(pos, pos + first - at)
            pos += first - at
            rope[0, first : first + h * w] = pos
            rope[1, first : first + h * w] = (torch.arange(h) + pos).repeat_interleave(w)
            rope[2, first : first + h * w] = (torch.arange(w) + pos).repeat(h)
            pos += max(h, w)
            at = first + h * w
            spot += h * w
            image += 1
        rope[:, at:hi] = torch.arange(pos, pos + hi - at)
    return torch.cat([mb["position_ids"].unsqueeze(0), rope]).unsqueeze(1)


def dp_coordinates(accelerator: Any) -> tuple[int, int]:
    """(dp_rank, dp_size) of this process from accelerate's state: the process index, with
    the tensor and context parallel sizes of the accelerator's parallelism config (whose
    device mesh varies tp fastest, then cp, then the data-parallel dimensions) taken out."""
    config = getattr(accelerator, "parallelism_config", None)
    tp = int(getattr(config, "tp_size", 1) or 1)
    cp = int(getattr(config, "cp_size", 1) or 1)
    where = mesh_position(accelerator.process_index, accelerator.num_processes, tp=tp, cp=cp)
    return where.dp_rank, where.dp_size


class PlanStateCallback(TrainerCallback):
    """Writes the loader's executor state into every checkpoint folder the Trainer saves."""

    def __init__(self, batches: PlanBatches):
        self.batches = batches

    def on_save(self, args, state, control, **kwargs):
        if args.should_save:  # the processes that write checkpoints; the state is every rank's
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / (STATE_FILE + ".tmp")
            tmp.write_text(json.dumps(self.batches.state_dict()), encoding="utf-8")
            os.replace(tmp, folder / STATE_FILE)
        return control


class PlanTrainer(Trainer):
    """A Trainer that trains on `plan`, this process's DP rank of it; no `train_dataset`.

    Without `max_steps`, the run is the plan: one pass over it (`num_train_epochs` is set
    to 1; the plan's steps are the optimizer steps and size the LR schedule).
    `executor_kwargs` (`tokenize=`, `estimated=`, `data_root=`, ...) go to `PlanExecutor`;
    `num_workers` > 0 fetches in DataLoader workers; `flash_attn_kwargs` adds the varlen
    metadata to every batch.
    """

    def __init__(
        self,
        *args: Any,
        plan: str | os.PathLike,
        executor_kwargs: Mapping[str, Any] | None = None,
        num_workers: int = 0,
        flash_attn_kwargs: bool = True,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        with PlanReader(plan) as reader:
            micro = reader.micro
        ga = self.args.gradient_accumulation_steps
        if ga != micro or self.args.per_device_train_batch_size != 1:
            raise ConfigError(
                f"{plan} has {micro} micro-batches per step: set "
                f"gradient_accumulation_steps={micro} and "
                "per_device_train_batch_size=1 (each batch is one packed micro-batch)"
            )
        if self.args.max_steps <= 0:
            self.args.num_train_epochs = 1  # the plan is the whole run: its steps are max_steps
        dp_rank, dp_size = dp_coordinates(self.accelerator)
        self.executor = PlanExecutor(plan, dp_rank, dp_size=dp_size, **dict(executor_kwargs or {}))
        flash, vision = flash_attn_kwargs, self.executor.vision
        self.plan_batches = PlanBatches(
            self.executor,
            num_workers=num_workers,
            collate=lambda mb: hf_batch(mb, flash_attn_kwargs=flash, vision=vision),
        )
        self.add_callback(PlanStateCallback(self.plan_batches))

    def get_train_dataloader(self) -> PlanBatches:
        return self.plan_batches

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        if resume_from_checkpoint is True:  # the last one; the Trainer refuses when none
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir) or True
        if isinstance(resume_from_checkpoint, str | os.PathLike):
            state_file = Path(resume_from_checkpoint) / STATE_FILE
            if not state_file.is_file():
                raise PlanError(
                    f"{state_file} is missing: the checkpoint was not saved by a PlanTrainer"
                )
            self.plan_batches.load_state_dict(json.loads(state_file.read_text(encoding="utf-8")))
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def get_resumed_dataloader(self, dataloader: Any, num_batches: int) -> Any:
        """The loader was seeked to the checkpoint's executor state in `train`; the Trainer's
        count of batches to skip must agree with it."""
        ex = self.executor
        step, micro = ex.position
        done = step * ex.micro_batches + micro  # len() counts from step 0, as the Trainer does
        if done != num_batches:
            raise PlanError(
                f"the checkpoint's executor state is at step {step}, micro-batch {micro}, but "
                f"the Trainer resumes after {num_batches} micro-batches"
            )
        return dataloader
