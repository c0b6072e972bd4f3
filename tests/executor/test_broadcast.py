"""One read per DP rank: the reading peer broadcasts, every TP peer gets the same batches."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from executor_builders import sample_plan, uninterrupted

WORKER = Path(__file__).with_name("broadcast_worker.py")
TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed beside this Python")
def test_tp_peers_receive_the_readers_batches_and_share_its_state(tmp_path_factory, tmp_path):
    _, plan = sample_plan(tmp_path_factory, steps=8, dp_size=1)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [
            TORCHRUN,
            "--standalone",
            "--nproc_per_node=2",
            str(WORKER),
            str(plan),
            str(tmp_path),
            "2",
        ],
        check=True,
        env=env,
        capture_output=True,
        timeout=240,
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    expected = uninterrupted(plan, 0)[7:]  # the workers seek to step 3, micro-batch 1
    assert [r["dp_rank"] for r in ranks] == [0, 0]
    assert ranks[0]["digests"] == expected
    assert ranks[1]["digests"] == expected
    assert ranks[0]["state"] == ranks[1]["state"]
    assert (ranks[1]["state"]["step"], ranks[1]["state"]["micro_batch"]) == (8, 0)
