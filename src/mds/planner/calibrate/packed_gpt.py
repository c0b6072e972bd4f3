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
    if shape.hidden % shape.heads:
        from mds.errors import ConfigError

        raise ConfigError(
            f"--hidden ({shape.hidden}) must be a multiple of --heads ({shape.heads})"
        )
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            h = shape.hidden
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.up, self.down = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def forward(self, x: torch.Tensor, bounds: list[tuple[int, int]]) -> torch.Tensor:
            T, h = x.shape
            heads = shape.heads
            qkv = self.qkv(self.ln1(x)).view(T, 3, heads, h // heads).transpose(0, 2)
            q, k, v = qkv.unbind(1)  # each [heads, T, head_dim]
            outs = [
                F.scaled_dot_product_attention(q[:, s:e], k[:, s:e], v[:, s:e], is_causal=True)
                for s, e in bounds
            ]
            att = torch.cat(outs, dim=1).transpose(0, 1).reshape(T, h)
            x = x + self.proj(att)
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class PackedGpt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(shape.vocab, shape.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(shape.layers))
            self.norm = nn.LayerNorm(shape.hidden)
            self.head = nn.Linear(shape.hidden, shape.vocab, bias=False)

        def forward(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
            cu = cu_seqlens.tolist()
            bounds = list(zip(cu[:-1], cu[1:], strict=True))
            x = self.embed(input_ids[0])
            for block in self.blocks:
                x = block(x, bounds)
            return self.head(self.norm(x)).unsqueeze(0)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return PackedGpt()
