"""Which data-parallel rank a process is, from its global rank and the parallelism mesh.

TP, CP and PP peers of one DP rank train on the same samples, so only the DP coordinate
selects a plan slice. The default order, "tp-cp-dp-pp", lists dimensions from fastest- to
slowest-varying global rank, as Megatron-LM and torch DeviceMesh ("pp", "dp", "cp", "tp")
lay them out by default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from mds.errors import ConfigError

__all__ = ["DEFAULT_ORDER", "MeshPosition", "mesh_position", "peer_groups", "torchrun_rank"]

DEFAULT_ORDER = "tp-cp-dp-pp"
_DIMS = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True)
class MeshPosition:
    """A process's coordinate along every parallel dimension."""

    dp_rank: int
    dp_size: int
    coords: dict[str, int]
    peers: tuple[int, ...]  # global ranks with this DP rank, ascending; peers[0] reads
    sizes: dict[str, int] = field(default_factory=dict)  # every dimension's size
    order: str = DEFAULT_ORDER

    @property
    def reads(self) -> bool:
        """True for the one process per DP rank whose TP, CP and PP coordinates are all 0."""
        return all(v == 0 for k, v in self.coords.items() if k != "dp")

    def peer_coords(self) -> list[dict[str, int]]:
        """Each peer's coordinates, in the order of `peers`."""
        dims = self.order.split("-")
        return [_coords(r, dims, self.sizes) for r in self.peers]


def mesh_position(
    rank: int, world_size: int, *, tp: int = 1, cp: int = 1, pp: int = 1, order: str = DEFAULT_ORDER
) -> MeshPosition:
    """Split a global rank into (tp, cp, dp, pp) coordinates; dp_size is what remains."""
    dims, sizes = _layout(world_size, tp, cp, pp, order)
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside the world size {world_size}")
    coords = _coords(rank, dims, sizes)
    peers = _groups(world_size, dims, sizes)[coords["dp"]]
    return MeshPosition(coords["dp"], sizes["dp"], coords, peers, dict(sizes), order)


def peer_groups(
    world_size: int, *, tp: int = 1, cp: int = 1, pp: int = 1, order: str = DEFAULT_ORDER
) -> list[tuple[int, ...]]:
    """The global ranks of every DP rank's peers, by DP rank: what each process passes to
    `torch.distributed.new_group`, in this order, before iterating `shared()`."""
    return _groups(world_size, *_layout(world_size, tp, cp, pp, order))


def _layout(
    world_size: int, tp: int, cp: int, pp: int, order: str
) -> tuple[list[str], dict[str, int]]:
    """The checked dimension order and every dimension's size."""
    dims = order.split("-")
    if sorted(dims) != sorted(_DIMS):
        raise ConfigError(
            f"mesh order {order!r} must name each of tp, cp, dp, pp once (e.g. {DEFAULT_ORDER!r})"
        )
    sizes = {"tp": tp, "cp": cp, "pp": pp}
    for name, size in sizes.items():
        if not isinstance(size, int) or size < 1:
            raise ConfigError(f"mesh size {name}={size!r} must be a positive integer")
    model = tp * cp * pp
    if world_size < 1 or world_size % model:
        raise ConfigError(
            f"world size {world_size} is not a multiple of tp*cp*pp = {tp}*{cp}*{pp} = {model}"
        )
    sizes["dp"] = world_size // model
    return dims, sizes


def _groups(world_size: int, dims: list[str], sizes: dict[str, int]) -> list[tuple[int, ...]]:
    """Global ranks by DP rank, ascending: one pass over the world."""
    groups: list[list[int]] = [[] for _ in range(sizes["dp"])]
    for r in range(world_size):
        groups[_coords(r, dims, sizes)["dp"]].append(r)
    return [tuple(g) for g in groups]


def _coords(rank: int, dims: list[str], sizes: dict[str, int]) -> dict[str, int]:
    coords, rest = {}, rank
    for name in dims:
        coords[name] = rest % sizes[name]
        rest //= sizes[name]
    return coords


def torchrun_rank(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(RANK, WORLD_SIZE) as torchrun (or any launcher following its convention) sets them;
    (0, 1) when neither is set."""
    env = os.environ if environ is None else environ
    if "RANK" not in env and "WORLD_SIZE" not in env:
        return 0, 1  # a plain single-process run
    try:
        return int(env["RANK"]), int(env["WORLD_SIZE"])
    except KeyError as exc:
        raise ConfigError(
            f"environment variable {exc.args[0]} is not set: launch with torchrun, or pass "
            "dp_rank= and dp_size= explicitly"
        ) from None
    except ValueError:
        raise ConfigError(
            f"RANK={env.get('RANK')!r} and WORLD_SIZE={env.get('WORLD_SIZE')!r} must be integers"
        ) from None
