"""Read once per DP rank: one process fetches each micro-batch and broadcasts it to its
TP, CP and PP peers, so a tensor-parallel group does not read the same data tp times.

The header (keys, shapes, dtypes, step) travels as JSON bytes, never pickled.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from mds.errors import ConfigError
from mds.executor.replay import Replay

__all__ = ["broadcast_batches"]

_DTYPES = {str(t): t for t in (torch.int64, torch.int32, torch.float32)}


def _send_header(header: dict[str, Any] | None, src: int, group: Any) -> dict[str, Any] | None:
    data = json.dumps(header).encode() if dist.get_rank() == src else b""
    size = torch.tensor([len(data)], dtype=torch.int64)
    dist.broadcast(size, src=src, group=group)
    buf = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if data
        else torch.empty(int(size.item()), dtype=torch.uint8)
    )
    dist.broadcast(buf, src=src, group=group)
    return json.loads(bytes(buf.tolist()).decode()) if dist.get_rank() != src else header


def broadcast_batches(executor: Replay, *, src: int, group: Any = None) -> Iterator[dict[str, Any]]:
    """The executor's remaining micro-batches on every rank of `group`, read on `src` only."""
    reading = dist.get_rank() == src
    source = iter(executor) if reading else None
    while True:
        batch = next(source, None) if source is not None else None
        header = None
        if reading and batch is not None:
            header = {
                k: {"shape": list(v.shape), "dtype": str(v.dtype)}
                if torch.is_tensor(v)
                else {"value": v}
                for k, v in batch.items()
            }
        header = _send_header(header, src, group)
        if header is None:
            return
        out: dict[str, Any] = {}
        for key in sorted(header):
            meta = header[key]
            if "value" in meta:
                out[key] = meta["value"]
                continue
            tensor = (
                batch[key] if reading else torch.empty(meta["shape"], dtype=_DTYPES[meta["dtype"]])
            )
            if tensor.numel():
                dist.broadcast(tensor, src=src, group=group)
            out[key] = tensor
        if not reading:
            pos = out["step"] * executor.micro_batches + out["micro_batch"]
            if pos != executor.cursor:
                raise ConfigError(
                    f"rank {dist.get_rank()} is at micro-batch {executor.cursor} but its reading "
                    f"peer (rank {src}) sent {pos}; load the same executor state on every peer"
                )
            executor.mark_delivered(pos)
        yield {k: out[k] for k in header}
