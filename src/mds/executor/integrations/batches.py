"""A stateful, sized iterable over an executor's micro-batches, for training loops that
fetch batches ahead of the step that uses them (Lightning prefetches one, HF Trainer takes a
step's micro-batches at once) and checkpoint the loader's `state_dict()` in between.

The state counts the batches the loop marked as used (`used(batch)`), not what was fetched,
so a checkpoint taken while a batch sits prefetched resumes at that batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from mds.errors import needs_extra

with needs_extra(__name__, "train"):
    from mds.executor.executor import PlanExecutor

__all__ = ["PlanBatches"]


class PlanBatches:
    """Iterate `executor` (through `executor.dataloader(num_workers)` when `num_workers` > 0),
    passing each micro-batch through `collate`.

    `len()` is the number of micro-batches this rank yields over the whole plan (steps x
    micro-batches), what LR schedulers size themselves by. It does not shrink after a
    resume, since frameworks count the resumed run's batches from the checkpoint's batch
    index, and for a plan re-planned from another at step K it counts from step 0 too: the
    run's step counter goes on from K. `length`, when set, caps it: a run told to stop
    earlier (Lightning's `max_steps`) sizes its progress by what it will train.
    `state_dict()` is the executor state after the last batch passed to `used()` (the last
    one yielded, when nothing calls `used`).
    """

    def __init__(
        self,
        executor: PlanExecutor,
        *,
        num_workers: int = 0,
        collate: Callable[[dict[str, Any]], Any] | None = None,
        **dataloader_kwargs: Any,
    ):
        self.executor = executor
        self.num_workers = num_workers
        self.collate = collate
        self.dataloader_kwargs = dataloader_kwargs
        self._state = executor.state_dict()
        self.tracks_use = False  # set once `used` is called: then yielding moves nothing
        self.length: int | None = None  # a cap on len(), for a run that stops early

    def __len__(self) -> int:
        total = self.executor.total
        return total if self.length is None else min(total, self.length)

    def __iter__(self) -> Iterator[Any]:
        ex = self.executor
        ex.load_state_dict(self._state)  # a second pass (another epoch) starts where we are
        source = ex.dataloader(self.num_workers, **self.dataloader_kwargs)
        for mb in source:
            if not self.tracks_use:
                self._state = _after(ex, mb)
            yield mb if self.collate is None else self.collate(mb)

    def used(self, batch: Mapping[str, Any]) -> None:
        """Record that the training step received `batch` (a yielded micro-batch, before or
        after collate: it must keep its `step` and `micro_batch` keys)."""
        self.tracks_use = True
        self._state = _after(self.executor, batch)

    def state_dict(self) -> dict[str, Any]:
        return dict(self._state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.executor.load_state_dict(state)  # checks the plan id and the position
        self._state = self.executor.state_dict()


def _after(ex: PlanExecutor, batch: Mapping[str, Any]) -> dict[str, Any]:
    """The executor state whose next micro-batch follows `batch`."""
    pos = int(batch["step"]) * ex.micro_batches + int(batch["micro_batch"]) + 1
    step, micro = divmod(pos, ex.micro_batches)
    return {**ex.state_dict(), "step": step, "micro_batch": micro}
