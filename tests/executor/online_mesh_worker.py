"""One process of tests/executor/test_online.py's DP x TP run (2 x 2), started by torchrun
(gloo, CPU).

Replays the online run of PLAN (planning from CONFIG) through `OnlineExecutor.shared()`
among its TP peers, reporting a loss per source offset by 10 x its DP rank and 100 x its
TP rank (so a TP peer's counted sums would show), checkpoints after 5 steps and resumes in
a new executor, and writes its coordinates and records to OUT.RANK.json.

Usage: torchrun --standalone --nproc_per_node=4 online_mesh_worker.py PLAN CONFIG OUT
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: online_builders

from online_builders import train  # noqa: E402

from mds.executor.mesh import peer_groups  # noqa: E402
from mds.executor.online import OnlineExecutor  # noqa: E402


class Through:
    """The executor, iterated through shared()."""

    def __init__(self, ex, batches):
        self.ex, self.batches = ex, batches

    def __getattr__(self, name):
        return getattr(self.ex, name)

    def __iter__(self):
        return iter(self.batches)


def main(plan: str, config: str, out: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        groups = [dist.new_group(list(g)) for g in peer_groups(dist.get_world_size(), tp=2)]
        ex = OnlineExecutor.from_env(plan, config=config, tp=2)
        dp, tp = ex.mesh.dp_rank, ex.mesh.coords["tp"]
        offset = 10.0 * dp + 100.0 * tp
        peers = groups[dp]
        with ex:
            records = train(Through(ex, ex.shared(peers)), rank_offset=offset, stop_after=5)
            state = json.loads(json.dumps(ex.state_dict()))
        with OnlineExecutor.from_env(plan, config=config, tp=2) as again:
            again.load_state_dict(state)
            records += train(Through(again, again.shared(peers)), rank_offset=offset)
        result = {"dp": dp, "tp": tp, "records": records}
        Path(f"{out}.{dist.get_rank()}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
