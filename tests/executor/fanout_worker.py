"""Run under torchrun: every rank iterates `executor.shared()` on a mesh of tp x cp x pp and
writes digests of the parts it received, with its mesh coordinates."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from executor_builders import batch_digest, text_tokenizers  # noqa: E402

from mds.executor import PlanExecutor  # noqa: E402
from mds.executor.broadcast import part_bytes  # noqa: E402
from mds.executor.mesh import peer_groups  # noqa: E402


def main(plan: str, out: str, tp: int, cp: int, pp: int, selective: bool) -> None:
    dist.init_process_group("gloo")
    ex = PlanExecutor.from_env(
        plan, tp=tp, cp=cp, pp=pp, estimated="fit", tokenize=text_tokenizers()
    )
    mine = None
    for g in peer_groups(dist.get_world_size(), tp=tp, cp=cp, pp=pp):
        group = dist.new_group(list(g))
        if dist.get_rank() in g:
            mine = group
    ex.seek(1, 1)
    got, received = [], 0
    for b in ex.shared(mine, selective=selective):
        got.append(batch_digest(b))
        received += part_bytes(b)  # what a selective run sends this rank (nothing to the reader)
    record = {
        "rank": dist.get_rank(),
        "coords": ex.mesh.coords,
        "digests": got,
        "bytes": 0 if ex.mesh.reads else received,
        "state": ex.state_dict(),
    }
    Path(out, f"rank{dist.get_rank()}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]), sys.argv[6] == "1")
