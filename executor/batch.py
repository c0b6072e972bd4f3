"""Pack one micro-batch's samples into the tensors a varlen-attention training step wants.

Samples are concatenated into one row of `input_ids`; `cu_seqlens` marks where each starts
(flash-attention's varlen convention) and `position_ids` restart at 0 for every sample.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["pack"]


def pack(
    tokens: list[np.ndarray],
    *,
    source: np.ndarray,
    sample_id: np.ndarray,
    row: np.ndarray,
    step: int,
    micro_batch: int,
) -> dict[str, Any]:
    """The micro-batch dict documented in docs/executor.md."""
    lengths = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=len(tokens))
    cu = np.zeros(len(tokens) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    total = int(cu[-1])
    ids = np.concatenate(tokens) if tokens else np.zeros(0, dtype=np.int64)
    positions = np.arange(total, dtype=np.int64) - np.repeat(cu[:-1].astype(np.int64), lengths)
    return {
        "input_ids": torch.from_numpy(ids.astype(np.int64, copy=False)),
        "position_ids": torch.from_numpy(positions),
        "cu_seqlens": torch.from_numpy(cu),
        "max_seqlen": int(lengths.max(initial=0)),
        "source": torch.from_numpy(source.astype(np.int32)),
        "sample_id": torch.from_numpy(sample_id.astype(np.int64)),
        "row": torch.from_numpy(row.astype(np.int64)),
        "step": step,
        "micro_batch": micro_batch,
    }
