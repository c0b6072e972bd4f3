"""PyTorch Lightning: a LightningDataModule that replays this process's DP rank of a plan.

The rank comes from the trainer (`trainer.global_rank` / `world_size`, or the strategy's
device mesh's data-parallel dimension when it has one). The train dataloader is a
`PlanBatches`: Lightning saves its `state_dict()` in every checkpoint and loads it on
`fit(ckpt_path=...)`; the state counts the batches the training step received (Lightning
fetches one ahead), so a resumed run continues with exactly the next micro-batch.
Set `Trainer(accumulate_grad_batches=dm.micro_batches)` so that an optimizer step is a
plan step.

One pass over the plan is the whole run, so it is one epoch: a Trainer given `max_steps`
(whose `max_epochs` Lightning then leaves unbounded, -1) is set to `max_epochs=1`, and the
dataloader's length is the micro-batches the run trains (this rank's over the plan, capped
at `max_steps` x `accumulate_grad_batches`), so the progress bar counts to where the run
stops, in epoch 0 of 0.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from mds.errors import ConfigError, needs_extra
from mds.executor.mesh import mesh_position

with needs_extra(__name__, "lightning"):
    import lightning.pytorch as pl

    from mds.executor.executor import PlanExecutor
    from mds.executor.integrations.batches import PlanBatches

__all__ = ["PlanDataModule", "dp_coordinates"]


def dp_coordinates(trainer: Any, *, tp: int = 1, cp: int = 1, pp: int = 1) -> tuple[int, int]:
    """(dp_rank, dp_size) of this process in `trainer`: the strategy's device mesh's
    data-parallel dimension when it has one (ModelParallelStrategy), else the global rank
    split with `tp`, `cp`, `pp` in the default mesh order (plain DDP/FSDP: the global rank)."""
    mesh = getattr(trainer.strategy, "device_mesh", None)
    names = getattr(mesh, "mesh_dim_names", None) or ()
    if "data_parallel" in names:
        dp = mesh["data_parallel"]
        return dp.get_local_rank(), dp.size()
    where = mesh_position(trainer.global_rank, trainer.world_size, tp=tp, cp=cp, pp=pp)
    return where.dp_rank, where.dp_size


def _size_the_run(trainer: Any, batches: PlanBatches) -> None:
    """One epoch is the plan; `len(batches)` is what the trainer will train of it (counted
    from step 0, as Lightning counts a resumed run's batches)."""
    if trainer.max_epochs is None or trainer.max_epochs == -1:
        trainer.fit_loop.max_epochs = 1  # Lightning's -1 with max_steps: the bar shows 0/-2
    if trainer.max_steps is not None and trainer.max_steps > 0:
        batches.length = trainer.max_steps * max(1, int(trainer.accumulate_grad_batches))


class PlanDataModule(pl.LightningDataModule):
    """Train batches from `plan` for this process's DP rank.

    `tokenize`, `estimated`, `data_root` and other keyword arguments go to `PlanExecutor`;
    `num_workers` > 0 fetches in DataLoader workers (`executor.dataloader`). `collate` maps
    each micro-batch dict before it reaches the training step (it must keep the `step` and
    `micro_batch` keys). `tp`, `cp`, `pp`: the model-parallel sizes when the strategy has no
    device mesh, so that a DP rank's peers get the same batches.
    """

    def __init__(
        self,
        plan: str | os.PathLike,
        *,
        num_workers: int = 0,
        collate: Callable[[dict[str, Any]], Any] | None = None,
        tp: int = 1,
        cp: int = 1,
        pp: int = 1,
        **executor_kwargs: Any,
    ):
        super().__init__()
        self.plan = plan
        self.num_workers = num_workers
        self.collate = collate
        self.parallel = {"tp": tp, "cp": cp, "pp": pp}
        self.executor_kwargs = executor_kwargs
        self.executor: PlanExecutor | None = None
        self.batches: PlanBatches | None = None

    @property
    def micro_batches(self) -> int:
        """Micro-batches per plan step: the trainer's `accumulate_grad_batches`."""
        if self.executor is not None:
            return self.executor.micro_batches
        from mds.core.planfile_reader import PlanReader

        with PlanReader(self.plan) as reader:
            return reader.micro

    def setup(self, stage: str) -> None:
        if stage != "fit" or self.executor is not None:
            return
        if self.trainer is None:
            raise ConfigError("PlanDataModule needs a Trainer: pass it to trainer.fit(datamodule=)")
        if self.trainer.max_steps == -1 and self.trainer.max_epochs != 1:
            raise ConfigError(
                "the plan is the whole run: give the Trainer max_steps, or max_epochs=1 for "
                f"all of it (max_epochs is {self.trainer.max_epochs})"
            )
        dp_rank, dp_size = dp_coordinates(self.trainer, **self.parallel)
        self.executor = PlanExecutor(self.plan, dp_rank, dp_size=dp_size, **self.executor_kwargs)
        self.batches = PlanBatches(
            self.executor, num_workers=self.num_workers, collate=self.collate
        )
        _size_the_run(self.trainer, self.batches)

    def train_dataloader(self) -> PlanBatches:
        if self.batches is None:
            raise ConfigError("PlanDataModule.setup('fit') has not run")
        return self.batches

    def state_dict(self) -> dict[str, Any]:
        """The loader's state, saved with the datamodule too: with `max_epochs=1` Lightning
        may read the train dataloader (to estimate the stepping batches) before it restores
        the loop, and then never hands the loader the checkpoint's state."""
        return {} if self.batches is None else {"batches": self.batches.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restored after `setup('fit')` and before the first batch is fetched."""
        if self.batches is not None and "batches" in state_dict:
            self.batches.load_state_dict(state_dict["batches"])

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = self.trainer
        if self.batches is not None and trainer is not None and trainer.training:
            if isinstance(batch, Mapping) and "step" in batch:
                self.batches.used(batch)
        return batch

    def teardown(self, stage: str) -> None:
        if stage == "fit" and self.executor is not None:
            self.executor.close()
            self.executor = self.batches = None
