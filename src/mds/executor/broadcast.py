"""Read once per DP rank: one process fetches each micro-batch and hands it to its TP, CP
and PP peers, so a tensor-parallel group does not read the same data tp times.

Two ways: `broadcast_batches` broadcasts the whole micro-batch to every peer (each peer
then takes its CP slice itself); `fanout_batches` sends each peer only the part it uses
(`peer_part`): a CP rank its slice, the first pipeline stage the token ids and positions, a
middle stage only the sample boundaries and sizes, the last stage the labels. TP peers of
a CP rank get what that CP rank gets. The header (keys, shapes, dtypes, step) travels as
JSON bytes, never pickled.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from mds.errors import ConfigError
from mds.executor.cp import cp_slice, shifted_labels
from mds.executor.replay import Replay

__all__ = ["broadcast_batches", "fanout_batches", "fanout_bytes", "part_bytes", "peer_part"]

FIRST_STAGE = ("input_ids", "position_ids", "pixel_values")  # only the first stage uses them
LAST_STAGE = ("shift_labels", "labels")  # only the last stage uses them

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


def _header(batch: dict[str, Any]) -> dict[str, Any]:
    return {
        k: {"shape": list(v.shape), "dtype": str(v.dtype)} if torch.is_tensor(v) else {"value": v}
        for k, v in batch.items()
    }


def _whole(executor: Replay) -> Iterator[dict[str, Any]]:
    """The reader's micro-batches, whole (a CP rank's slice is cut from them)."""
    whole = getattr(executor, "whole_batches", None)
    return whole() if whole is not None else iter(executor)


def _view(executor: Replay, batch: dict[str, Any]) -> dict[str, Any]:
    view = getattr(executor, "view", None)
    return view(batch) if view is not None else batch


def broadcast_batches(executor: Replay, *, src: int, group: Any = None) -> Iterator[dict[str, Any]]:
    """The executor's remaining micro-batches on every rank of `group`, read on `src` only:
    the whole micro-batch goes to every rank, which keeps its own part (`executor.view`,
    its CP slice)."""
    reading = dist.get_rank() == src
    source = _whole(executor) if reading else None
    while True:
        batch = next(source, None) if source is not None else None
        header = _header(batch) if reading and batch is not None else None
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
            _delivered(executor, out, dist.get_rank(), src)
        yield _view(executor, {k: out[k] for k in header})


def _delivered(executor: Replay, batch: dict[str, Any], rank: int, src: int) -> None:
    """Mark a micro-batch received from the reading peer as delivered, after checking it is
    the one this rank's executor stands at (peers that loaded different states diverge)."""
    pos = batch["step"] * executor.micro_batches + batch["micro_batch"]
    if pos != executor.cursor:
        raise ConfigError(
            f"rank {rank} is at micro-batch {executor.cursor} but its reading peer (rank "
            f"{src}) sent {pos}; load the same executor state on every peer"
        )
    executor.mark_delivered(pos)


def peer_part(
    whole: dict[str, Any], *, cp_rank: int | None, stage: int = 0, pp: int = 1
) -> dict[str, Any]:
    """What a peer at CP rank `cp_rank` and pipeline stage `stage` of `pp` uses of a whole
    micro-batch: its CP slice (the whole micro-batch on a plan without CP); with `pp` > 1,
    the first stage without labels, a middle stage without token ids, positions, labels
    and pixels (`num_tokens` gives the sequence length), the last stage with
    `shift_labels` (next-token labels, -100 at each sample's last token) instead of token
    ids, positions and pixels. Everything else (sample boundaries, ids, layout) goes to every
    stage."""
    view = cp_slice(whole, cp_rank) if cp_rank is not None and "cp_layout" in whole else whole
    if pp == 1:
        return dict(view)
    first, last = stage == 0, stage == pp - 1
    out = {}
    for key, value in view.items():
        if (key in FIRST_STAGE and not first) or (key in LAST_STAGE and not last):
            continue
        out[key] = value
    if last and "shift_labels" not in out:
        source = view.get("labels", view["input_ids"]).numpy()
        out["shift_labels"] = torch.from_numpy(
            shifted_labels(source, view["cu_seqlens"].numpy().astype("int64"))
        )
    if not first:
        out["num_tokens"] = int(view["input_ids"].numel())
    return out


def part_bytes(part: dict[str, Any]) -> int:
    """Bytes a peer receives for `part`: its JSON header, the header's size and the tensors."""
    header = json.dumps(_header(part)).encode()
    tensors = sum(v.numel() * v.element_size() for v in part.values() if torch.is_tensor(v))
    return 8 + len(header) + tensors


def fanout_bytes(whole: dict[str, Any], *, tp: int = 1, cp: int = 1, pp: int = 1) -> dict[str, int]:
    """Bytes the reading peer sends per micro-batch to the other tp*cp*pp - 1 peers of its
    DP rank: "selective" (each its `peer_part`) and "broadcast" (each the whole micro-batch),
    counted from the batches (every byte sent once per receiving peer)."""
    selective = 0
    for c in range(cp):
        for stage in range(pp):
            part = peer_part(whole, cp_rank=c if cp > 1 else None, stage=stage, pp=pp)
            copies = tp - 1 if (c, stage) == (0, 0) else tp  # the reader keeps its own
            selective += copies * part_bytes(part)
    return {"selective": selective, "broadcast": (tp * cp * pp - 1) * part_bytes(whole)}


def _send(part: dict[str, Any] | None, dst: int, group: Any) -> None:
    data = json.dumps(None if part is None else _header(part)).encode()
    dist.send(torch.tensor([len(data)], dtype=torch.int64), dst=dst, group=group)
    dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst=dst, group=group)
    if part is not None:
        for key in sorted(part):
            value = part[key]
            if torch.is_tensor(value) and value.numel():
                dist.send(value.contiguous(), dst=dst, group=group)


def _recv(src: int, group: Any) -> dict[str, Any] | None:
    size = torch.empty(1, dtype=torch.int64)
    dist.recv(size, src=src, group=group)
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(buf, src=src, group=group)
    header = json.loads(bytes(buf.tolist()).decode())
    if header is None:
        return None
    out: dict[str, Any] = {}
    for key in sorted(header):
        meta = header[key]
        if "value" in meta:
            out[key] = meta["value"]
            continue
        tensor = torch.empty(meta["shape"], dtype=_DTYPES[meta["dtype"]])
        if tensor.numel():
            dist.recv(tensor, src=src, group=group)
        out[key] = tensor
    return {k: out[k] for k in header}


def fanout_batches(
    executor: Replay,
    *,
    src: int,
    peers: list[int],
    coords: list[dict[str, int]],
    pp: int,
    group: Any = None,
) -> Iterator[dict[str, Any]]:
    """Each peer's part (`peer_part`) of the executor's remaining micro-batches, read on
    `src` only and sent to each other peer point to point. `peers` are the global ranks of
    the DP rank's peers and `coords` their mesh coordinates (`MeshPosition.peer_coords`)."""
    me = dist.get_rank()
    cp_of = {p: c["cp"] for p, c in zip(peers, coords, strict=True)}
    stage_of = {p: c["pp"] for p, c in zip(peers, coords, strict=True)}
    has_cp = max(cp_of.values()) > 0
    if me == src:
        for whole in _whole(executor):
            parts: dict[tuple[int, int], dict[str, Any]] = {}
            mine = None
            for peer in peers:
                key = (cp_of[peer], stage_of[peer])
                if key not in parts:
                    rank = cp_of[peer] if has_cp else None
                    parts[key] = peer_part(whole, cp_rank=rank, stage=key[1], pp=pp)
                if peer == me:
                    mine = parts[key]
                else:
                    _send(parts[key], peer, group)
            yield mine
        for peer in peers:
            if peer != me:
                _send(None, peer, group)
        return
    while True:
        got = _recv(src, group)
        if got is None:
            return
        _delivered(executor, got, me, src)
        yield got
