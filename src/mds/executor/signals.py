"""The collective steps of an online-mixed run (docs/online-mixing.md), over a
torch.distributed process group (gloo on CPU, any backend that sums float64): a window's
per-source sums reduced over the DP ranks, and the planning outcome told by rank 0 to the
others. Without an initialized process group the run is one process and both are local.
torch is imported only when a group is in use."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Group", "group_of"]


class Group:
    """This process's place in the DP group that shares a run's signals."""

    def __init__(self, group: Any = None):
        self.group = group
        self.rank, self.size = 0, 1
        dist = _dist()
        if dist is not None and dist.is_initialized():
            self.rank = dist.get_rank(group)
            self.size = dist.get_world_size(group)

    @property
    def leader(self) -> bool:
        """Rank 0 of the group: the rank that writes the log and plans segments."""
        return self.rank == 0

    def sum(self, values: np.ndarray) -> np.ndarray:
        """`values` (float64) summed elementwise over the group's ranks; every rank gets the
        same array."""
        if self.size == 1:
            return values.astype(np.float64)
        import torch
        import torch.distributed as dist

        tensor = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64)).clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor.numpy().astype(np.float64)

    def share(self, data: bytes) -> bytes:
        """Rank 0's `data` on every rank: a length, then the bytes (nothing pickled)."""
        if self.size == 1:
            return data
        import torch
        import torch.distributed as dist

        src = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        head = torch.tensor([len(data) if self.leader else 0], dtype=torch.int64)
        dist.broadcast(head, src=src, group=self.group)
        size = int(head[0])
        if not size:
            return b""
        if self.leader:
            body = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            body = torch.zeros(size, dtype=torch.uint8)
        dist.broadcast(body, src=src, group=self.group)
        return bytes(body.numpy())

    def tell(self, message: str | None) -> str | None:
        """Rank 0's `message` (None: all went well) on every rank."""
        data = self.share(b"\0" if message is None else b"\1" + message.encode())
        return None if data[:1] == b"\0" else data[1:].decode()


def _dist() -> Any:
    """torch.distributed if torch is installed and already imported by the training
    script (a run that never imported it has no process group), else None."""
    import sys

    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() else None


def group_of(group: Any) -> Group:
    return Group(group)
