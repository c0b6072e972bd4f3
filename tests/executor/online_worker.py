"""One rank of tests/executor/test_online.py's two-rank run, started by torchrun (gloo, CPU).

Replays the online run of PLAN (planning from CONFIG) as DP rank RANK of 2, reporting a
loss per source offset by 10 x its rank (rank 0 per step, rank 1 per micro-batch), then hears a message and a None from rank 0, and
writes its records, final state and what it heard to OUT.RANK.json.

Usage: torchrun --standalone --nproc_per_node=2 online_worker.py PLAN CONFIG OUT
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: online_builders

from online_builders import train  # noqa: E402

from mds.executor.online import OnlineExecutor  # noqa: E402
from mds.executor.signals import Group  # noqa: E402


def main(plan: str, config: str, out: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        rank = dist.get_rank()
        with OnlineExecutor(plan, rank, dp_size=2, config=config) as ex:
            records = train(ex, rank_offset=10.0 * rank, per_micro_batch=rank == 1)
            state = ex.state_dict()
        # what rank 0 tells the others when planning fails, and when it does not
        group = Group()
        told = [group.tell("planning window 2 failed: é" if group.leader else None),
                group.tell(None)]
        result = {"records": records, "state": state, "told": told}
        Path(f"{out}.{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
