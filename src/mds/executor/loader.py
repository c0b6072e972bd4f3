"""PlanLoader: an executor behind a torch DataLoader, so fetching and tokenizing run in
worker processes while batches still arrive in plan order.

Worker w of W builds the micro-batches at positions start + w, start + w + W, ...; the
DataLoader asks workers in turn and returns results in request order, which is plan order.
Workers hand over numpy arrays (`batch.compact`), made into tensors in the training
process: torch would send each tensor through a shared-memory file of its own, which
costs more than pickling a micro-batch's few small arrays. Image patch rows are the
exception: tens of MB a micro-batch, which a shared-memory file moves without the three
copies pickling through the worker's pipe makes (SHARED_BYTES).
The state is the executor's and moves only when the training loop receives a batch, so
batches that workers prefetched but the loop never saw are built again after a resume.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from mds.errors import ConfigError
from mds.executor.batch import expand
from mds.executor.replay import Replay

__all__ = ["PlanLoader"]

# Arrays at least this large cross from a worker as a tensor in a shared-memory file.
SHARED_BYTES = 1 << 20


class _Positions(IterableDataset):
    """The micro-batches at positions [start, stop), dealt round-robin to workers."""

    def __init__(self, executor: Replay, start: int, stop: int):
        self.executor, self.start, self.stop = executor, start, stop

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        self.executor.build_every(workers)
        for pos in range(self.start + worker, self.stop, workers):
            raw = self.executor.compact_at(pos, narrow=True)
            pixels = raw.get("pixel_values")
            if pixels is not None and pixels.nbytes >= SHARED_BYTES:
                raw["pixel_values"] = torch.from_numpy(pixels)
            yield raw


def _as_is(raw: dict[str, Any]) -> dict[str, Any]:
    """DataLoader's collate_fn: keep the worker's numpy arrays (no conversion to tensors)."""
    return raw


class PlanLoader:
    """Iterate an executor's remaining micro-batches through a DataLoader with workers.

    `executor`: a PlanExecutor (the loader uses only its `replay.Replay` interface).

    `state_dict()`/`load_state_dict()` are the executor's: they count what this iterator
    has handed to the training loop. Extra keyword arguments go to torch's DataLoader
    (e.g. `prefetch_factor`, `pin_memory`, `multiprocessing_context`).
    """

    def __init__(self, executor: Replay, num_workers: int = 2, **dataloader_kwargs: Any):
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ConfigError(f"num_workers={num_workers!r} must be an integer >= 0")
        for key in ("batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn"):
            if key in dataloader_kwargs:
                raise ConfigError(
                    f"PlanLoader sets DataLoader's {key!r} itself: batches come from the plan"
                )
        self.executor, self.num_workers = executor, num_workers
        self.dataloader_kwargs = dataloader_kwargs

    def state_dict(self) -> dict[str, Any]:
        return self.executor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.executor.load_state_dict(state)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        ex = self.executor
        if self.num_workers == 0:
            yield from ex
            return
        ex.stop_read_ahead()
        kwargs = dict(self.dataloader_kwargs)
        # Pinned here, as DataLoader would (only with a GPU): workers send numpy arrays.
        pin = bool(kwargs.pop("pin_memory", False)) and torch.cuda.is_available()
        while ex.cursor < ex.total:
            loader = DataLoader(
                _Positions(ex, ex.cursor, ex.total),
                batch_size=None,
                num_workers=self.num_workers,
                collate_fn=_as_is,
                **kwargs,
            )
            for raw in loader:
                pos = raw["step"] * ex.micro_batches + raw["micro_batch"]
                if pos != ex.cursor:  # the loop seeked (load_state_dict) while workers ran ahead
                    break  # start new workers at the new position
                ex.mark_delivered(pos)
                batch = ex.expand(raw) if hasattr(ex, "expand") else expand(raw)
                if pin:
                    batch = {
                        k: v.pin_memory() if hasattr(v, "pin_memory") else v
                        for k, v in batch.items()
                    }
                yield batch
            else:
                return
