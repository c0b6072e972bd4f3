"""The transformer block the built-in calibration models share: pre-norm, attention per
packed sequence (one call per sequence, each attending only to itself), MLP 4x.

A packed row of T positions holds several sequences back to back, delimited by
`cu_seqlens` (flash-attn's convention: [0, L1, L1+L2, ..., T], int32). torch is imported on
first use: the planner and the CLI import the model modules without it.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["check_heads", "packed_block", "packed_bounds"]


def check_heads(hidden: int, heads: int) -> None:
    if hidden % heads:
        from mds.errors import ConfigError

        raise ConfigError(f"--hidden ({hidden}) must be a multiple of --heads ({heads})")


def packed_bounds(cu_seqlens: Any) -> list[tuple[int, int]]:
    """[(start, end)] of each sequence of the packed row."""
    cu = cu_seqlens.tolist()
    return list(zip(cu[:-1], cu[1:], strict=True))


def packed_block(hidden: int, heads: int, causal: bool) -> Any:
    """A torch module: forward(x [T, hidden], bounds) -> [T, hidden]; attention is causal
    (a GPT) or full (a ViT) inside each (start, end) of `bounds`."""
    return _block_class()(hidden, heads, causal)


@functools.cache
def _block_class() -> type:
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self, hidden: int, heads: int, causal: bool) -> None:
            super().__init__()
            h = hidden
            self.heads, self.causal = heads, causal
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.up, self.down = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def forward(self, x: torch.Tensor, bounds: list[tuple[int, int]]) -> torch.Tensor:
            T, h = x.shape
            heads = self.heads
            qkv = self.qkv(self.ln1(x)).view(T, 3, heads, h // heads).transpose(0, 2)
            q, k, v = qkv.unbind(1)  # each [heads, T, head_dim]
            outs = [
                F.scaled_dot_product_attention(
                    q[:, s:e], k[:, s:e], v[:, s:e], is_causal=self.causal
                )
                for s, e in bounds
            ]
            att = torch.cat(outs, dim=1).transpose(0, 1).reshape(T, h)
            x = x + self.proj(att)
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    return Block
