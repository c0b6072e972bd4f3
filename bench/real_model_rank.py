"""One rank of bench_real_model.py's 2-rank run, launched by it as
`torchrun --standalone --nproc_per_node=2 bench/real_model_rank.py SPEC RESULT`.

The rank pins itself to its own core (the spec's cores[rank]), runs one torch thread, joins
a gloo group and builds the tiny Llama of the spec's config (the same seed on every rank).
Then, round after round, every (step, plan) pair in a seeded order the ranks share: a
barrier, forward + backward of its own micro-batches of that step of that plan, a barrier.
Rank 0's wall time from the first barrier's end to the second's is the step's time (it
waits for the slower rank); each rank's own busy time (wall and CPU) is gathered as well.
Rank 0 writes RESULT (JSON) with the load average before and after every round.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def main(spec_path: Path, result_path: Path) -> None:
    spec = json.loads(spec_path.read_text())
    rank = int(os.environ["RANK"])
    os.sched_setaffinity(0, {spec["cores"][rank]})

    import torch
    import torch.distributed as dist

    from mds.planner.calibrate.fit import forward_backward, micro_batch_inputs
    from mds.planner.calibrate.packed_hf import build_hf_model

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    model, vocab = build_hf_model(Path(spec["config"]), seed=0)
    model.train()
    plans: dict[str, list] = spec["plans"]
    names = sorted(plans)
    steps = len(plans[names[0]])
    # Inputs made before any timing, seeded by (plan, step, micro-batch).
    inputs = {
        (name, t): [micro_batch_inputs(mb, vocab, hash_seed(p, t, m), "cpu")
                    for m, mb in enumerate(plans[name][t][rank]) if mb]
        for p, name in enumerate(names) for t in range(steps)
    }  # fmt: skip

    def work(name: str, t: int) -> None:
        model.zero_grad(set_to_none=False)
        for ids, cu in inputs[(name, t)]:
            forward_backward(model, ids, cu)

    def timed(name: str, t: int) -> dict:
        dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        work(name, t)
        busy, cpu = time.perf_counter() - start, time.process_time() - cpu
        dist.barrier()
        wall = time.perf_counter() - start
        mine = torch.zeros(2 * world, dtype=torch.float64)
        mine[2 * rank], mine[2 * rank + 1] = busy, cpu
        dist.all_reduce(mine)  # every rank's (busy, cpu), outside the timed span
        return {"wall": wall, "busy": mine[0::2].tolist(), "cpu": mine[1::2].tolist()}

    for name in names:  # warm-up: step 0 of every plan, untimed
        timed(name, 0)
    rounds = []
    for r in range(spec["rounds"]):
        order = [(names[i // steps], i % steps)
                 for i in np.random.default_rng([spec["seed"], r]).permutation(len(names) * steps)]  # fmt: skip
        load_before = load()
        out = {name: [None] * steps for name in names}
        for name, t in order:
            out[name][t] = timed(name, t)
        rounds.append({"load_before": load_before, "load_after": load(), "steps": out})
        if rank == 0:
            print(f"  round {r + 1}/{spec['rounds']}: load {rounds[-1]['load_after']}",
                  file=sys.stderr)  # fmt: skip
    # Each rank's core at the end (-1: not pinned to one core).
    now = sorted(os.sched_getaffinity(0))
    cores = torch.full((world,), 0, dtype=torch.int64)
    cores[rank] = now[0] if len(now) == 1 else -1
    dist.all_reduce(cores)
    if rank == 0:
        result = {
            "rounds": rounds,
            "cores": cores.tolist(),
            "threads": torch.get_num_threads(),
            "world": world,
        }
        result_path.write_text(json.dumps(result))
    dist.destroy_process_group()


def hash_seed(plan: int, step: int, micro: int) -> int:
    return (plan * 1_000 + step) * 100 + micro


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
