"""One rank of tests/executor/test_distributed.py, started by torchrun (gloo, CPU).

Builds `PlanExecutor.from_env(plan)`, replays this rank's whole slice of the plan, gathers
every rank's (step, micro_batch, sample ids, sources, token digest) on rank 0 through the
process group, and rank 0 writes them to OUT as JSON.

Usage: torchrun --standalone --nproc_per_node=2 dist_worker.py PLAN OUT
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from tokenizers import Tokenizer

from mds.executor import PlanExecutor

TOKENIZER = Path(__file__).resolve().parents[2] / "sample_data" / "tokenizer.json"


def main(plan: str, out: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        tok = Tokenizer.from_file(str(TOKENIZER))
        with PlanExecutor.from_env(
            plan,
            estimated="fit",
            tokenize=lambda text: tok.encode(text, add_special_tokens=False).ids,
        ) as ex:
            records = [
                {
                    "step": mb["step"],
                    "micro_batch": mb["micro_batch"],
                    "sample_ids": mb["sample_id"].tolist(),
                    "sources": mb["source"].tolist(),
                    "tokens": hashlib.blake2b(mb["input_ids"].numpy().tobytes()).hexdigest(),
                }
                for mb in ex
            ]
            mine = {
                "rank": dist.get_rank(),
                "world": dist.get_world_size(),
                "env_rank": int(os.environ["RANK"]),
                "dp_rank": ex.dp_rank,
                "dp_size": ex.dp_size,
                "source_names": ex.source_names,
                "final_state": ex.state_dict(),
                "records": records,
            }
        gathered: list | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if dist.get_rank() == 0:
            tmp = Path(out + ".tmp")
            tmp.write_text(json.dumps(gathered))
            os.replace(tmp, out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
