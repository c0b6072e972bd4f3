"""Run under torchrun: every rank iterates `executor.shared()` and writes what it received."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from executor_builders import batch_digest, text_tokenizers  # noqa: E402

from mds.executor import PlanExecutor  # noqa: E402


def main(plan: str, out: str, tp: int) -> None:
    dist.init_process_group("gloo")
    ex = PlanExecutor.from_env(plan, tp=tp, estimated="fit", tokenize=text_tokenizers())
    ex.seek(3, 1)
    got = [batch_digest(b) for b in ex.shared()]
    record = {
        "rank": dist.get_rank(),
        "dp_rank": ex.dp_rank,
        "digests": got,
        "state": ex.state_dict(),
    }
    Path(out, f"rank{dist.get_rank()}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
