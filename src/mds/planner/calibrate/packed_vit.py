"""A small ViT-style image encoder over packed images, for calibrating the encoder's cost.

The batch is one row of patches of several images back to back, delimited by `cu_seqlens`
([0, P1, P1+P2, ..., P_total], int32), as Qwen2-VL's vision tower takes them: each row of
`pixel_values` is one patch of 3 x temporal_patch_size x patch_size x patch_size values.
A linear patch embedding, pre-norm blocks with full (non-causal) attention inside each image
only (one attention call per image: the per-image overhead `d` of the cost model), MLP 4x,
and a final norm. An image of P patches costs a*P + b*P^2 + d, a micro-batch the sum over
its images plus c. torch is imported on first use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mds.planner.calibrate.blocks import check_heads, packed_block, packed_bounds

__all__ = ["VitShape", "build_packed_vit"]


@dataclass(frozen=True)
class VitShape:
    """Layer shapes of the built-in encoder."""

    layers: int = 2
    hidden: int = 128
    heads: int = 4
    patch_size: int = 14
    temporal_patch_size: int = 2

    @property
    def patch_dim(self) -> int:
        """Values per patch row of pixel_values: 3 channels x temporal x patch x patch."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size

    def describe(self) -> str:
        return (
            f"built-in ViT (layers = {self.layers}, hidden = {self.hidden}, "
            f"heads = {self.heads}, patch = {self.temporal_patch_size} x {self.patch_size} "
            f"x {self.patch_size})"
        )


def build_packed_vit(shape: VitShape, seed: int = 0) -> Any:
    """A seeded torch module: forward(pixel_values [P_total, patch_dim], cu_seqlens [n + 1])
    -> patch features [P_total, hidden]."""
    check_heads(shape.hidden, shape.heads)
    import torch
    from torch import nn

    class PackedVit(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(shape.patch_dim, shape.hidden)
            self.blocks = nn.ModuleList(
                packed_block(shape.hidden, shape.heads, causal=False) for _ in range(shape.layers)
            )
            self.norm = nn.LayerNorm(shape.hidden)

        def forward(self, pixel_values: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
            bounds = packed_bounds(cu_seqlens)
            x = self.embed(pixel_values)
            for block in self.blocks:
                x = block(x, bounds)
            return self.norm(x)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return PackedVit()
