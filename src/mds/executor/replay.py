"""The interface through which code outside an executor drives its replay: `PlanLoader`
(DataLoader workers build the micro-batches) and `broadcast_batches` (one peer reads, the
others receive) hand out micro-batches themselves and keep the executor's position.

`PlanExecutor` implements it. The modules that drive an executor depend on this interface
alone, not on the executor module, so the executor can offer them as methods
(`dataloader()`, `shared()`) and imports still go one way: executor -> loader, broadcast
-> this module.

Positions are linear: micro-batch `m` of step `s` is at `s * micro_batches + m`; a run goes
from the executor's position (`cursor`) to `total`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["Replay"]


@runtime_checkable
class Replay(Protocol):
    """A plan replay driven by position (see the module docstring)."""

    micro_batches: int

    @property
    def total(self) -> int:
        """The end position (one past the last micro-batch)."""
        ...

    @property
    def cursor(self) -> int:
        """The position of the next micro-batch to hand to the training loop."""
        ...

    def mark_delivered(self, pos: int) -> None:
        """The micro-batch at `pos` reached the training loop: the next one is `pos + 1`
        (what `state_dict()` records from now on)."""
        ...

    def compact_at(self, pos: int, narrow: bool = False) -> dict[str, Any]:
        """The micro-batch at `pos` as numpy arrays (`batch.compact`; `batch.expand` makes
        the tensors iteration yields), without moving the position."""
        ...

    def build_every(self, stride: int) -> None:
        """This process builds only every `stride`-th micro-batch (one of `stride` DataLoader
        workers), so it reads rows ahead only for those."""
        ...

    def stop_read_ahead(self) -> None:
        """Stop building steps in the background (before worker processes fork)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def __iter__(self) -> Iterator[dict[str, Any]]: ...
