"""A small GPT-style model over packed variable-length batches, for calibration and benchmarks.

The batch is one row of T tokens holding several samples back to back, delimited by
`cu_seqlens` (flash-attn's convention: [0, L1, L1+L2, ..., T], int32). Attention is causal and
per sample (each sample attends only to itself, in one attention call per sample: the
per-sample overhead `d` of the cost model), so a micro-batch costs sum(a*L + b*L^2 + d), not
a*T + b*T^2 as a dense mask over the packed row would. torch is imported on first use:
the planner and the CLI import this module without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mds.planner.calibrate.blocks import check_heads, packed_block, packed_bounds

__all__ = ["GptShape", "build_packed_gpt"]


@dataclass(frozen=True)
class GptShape:
    """Layer shapes of the built-in model."""

    layers: int = 2
    hidden: int = 128
    heads: int = 4
    vocab: int = 512

    def describe(self) -> str:
        return (
            f"built-in GPT (layers = {self.layers}, hidden = {self.hidden}, "
            f"heads = {self.heads}, vocab = {self.vocab})"
        )


def build_packed_gpt(shape: GptShape, seed: int = 0) -> Any:
    """A seeded torch module: forward(input_ids [1, T], cu_seqlens [n + 1]) -> logits [1, T, V]."""
    check_heads(shape.hidden, shape.heads)
    import torch
    from torch import nn

    class PackedGpt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(shape.vocab, shape.hidden)
            self.blocks = nn.ModuleList(
                packed_block(shape.hidden, shape.heads, causal=True) for _ in range(shape.layers)
            )
            self.norm = nn.LayerNorm(shape.hidden)
            self.head = nn.Linear(shape.hidden, shape.vocab, bias=False)

        def forward(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
            bounds = packed_bounds(cu_seqlens)
            x = self.embed(input_ids[0])
            for block in self.blocks:
                x = block(x, bounds)
            return self.head(self.norm(x)).unsqueeze(0)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return PackedGpt()
