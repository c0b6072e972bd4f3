"""Run under torchrun with 2 processes (CP = 2): each CP rank computes causal attention for
its slice's queries over the keys and values of both ranks' slices (all-gathered, masked by
sample and global position, as ring attention does) and compares it with the attention of
the unsplit micro-batch; writes the largest difference."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from executor_builders import text_tokenizers  # noqa: E402

from mds.executor import PlanExecutor  # noqa: E402

DIM = 8


def features(ids: torch.Tensor, pos: torch.Tensor, seed: int) -> torch.Tensor:
    """A deterministic [T, DIM] function of each token's id and position."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(4096, DIM, generator=g, dtype=torch.float64)
    freq = torch.arange(1, DIM + 1, dtype=torch.float64) / DIM
    return table[ids % 4096] + torch.sin(pos[:, None].double() * freq)


def attention(q, k, v, q_sample, q_pos, k_sample, k_pos, k_valid) -> torch.Tensor:
    mask = (q_sample[:, None] == k_sample[None]) & (k_pos[None] <= q_pos[:, None]) & k_valid[None]
    scores = (q @ k.T) / DIM**0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def qkv(ids, pos):
    return features(ids, pos, 1), features(ids, pos, 2), features(ids, pos, 3)


def main(plan: str, out: str) -> None:
    dist.init_process_group("gloo")
    kw = dict(estimated="fit", tokenize=text_tokenizers())
    ex = PlanExecutor.from_env(plan, cp=2, **kw)
    whole = PlanExecutor(plan, ex.dp_rank, **kw)
    worst, count, tokens = 0.0, 0, 0
    for piece, batch in zip(ex, whole, strict=True):
        # this rank's tokens: sample (index in the micro-batch), global position, padding
        sample = piece["cp_samples"].long().repeat_interleave(piece["cu_seqlens"].diff().long())
        pos = piece["position_ids"]
        valid = pos < piece["seqlens"].long()[sample]
        q, k, v = qkv(piece["input_ids"], pos)
        mine = [k, v, sample, pos, valid]
        gathered = [None, None]
        dist.all_gather_object(gathered, mine)
        ks, vs, ss, ps, oks = (torch.cat(parts) for parts in zip(*gathered, strict=True))
        got = attention(q, ks, vs, sample, pos, ss, ps, oks)
        # the unsplit micro-batch
        cu = batch["cu_seqlens"].long()
        w_sample = torch.arange(len(cu) - 1).repeat_interleave(cu.diff())
        wq, wk, wv = qkv(batch["input_ids"], batch["position_ids"])
        ones = torch.ones(len(w_sample), dtype=torch.bool)
        want = attention(
            wq, wk, wv, w_sample, batch["position_ids"], w_sample, batch["position_ids"], ones
        )
        at = cu[:-1][sample[valid]] + pos[valid]
        if valid.any():
            worst = max(worst, float((got[valid] - want[at]).abs().max()))
        count += 1
        tokens += int(valid.sum())
    record = {"rank": dist.get_rank(), "micro_batches": count, "max_error": worst, "tokens": tokens}
    Path(out, f"rank{dist.get_rank()}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
