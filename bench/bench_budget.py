"""Benchmark the executor's memory budget (`memory_bytes`) on Parquet files of one large row
group: peak RSS above imports and ms per step of a fresh child replaying a plan.

Data: 64 sources x 32,768 rows of list<int32> token ids (mean 256 ids a row, ~8M ids and
one row group a file, ~2 GB in all), written once under `--data` (default
build/bench-data/budget) and reused while its `meta.json` matches. The plan: 512 steps of
64 samples, dp 1, one micro-batch a step.

Each case replays the whole plan in a fresh interpreter (`W=0`: iterating the executor;
`W=2`: `ex.dataloader(num_workers=2)`), which reports its VmHWM net of its RSS after
`import torch, mds.executor` (for W=2, the largest of that and of its workers' VmHWM, read
from /proc at every step, net of each worker's RSS as it started) and the median ms per step over the second half of the steps (steady state).
Cases: `memory_bytes` 256 MiB and 64 MiB, and "whole groups": a budget of 4 GiB with the
block cache at 256 MiB, which decodes whole row groups as the code before the budget did.

Results go to `<out>/budget.md` (the table, also printed) and `<out>/budget.json`.
Timings are reported, never asserted.

Usage: python bench/bench_budget.py [--out build/bench] [--data build/bench-data/budget]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]

SOURCES, ROWS, MEAN_LEN = 64, 32_768, 256
STEPS, SAMPLES = 512, 64
SEED = 20261206
BUILDER_VERSION = 1
MiB = 1 << 20
MB = 1e6

# (label, memory_bytes, cache_bytes)
CASES = [
    ("whole groups (4 GiB, cache 256 MiB)", 4096 * MiB, 256 * MiB),
    ("memory_bytes=256 MiB", 256 * MiB, None),
    ("memory_bytes=64 MiB", 64 * MiB, None),
]


def build(data: Path) -> Path:
    """Write the sources, index and plan under `data` unless its meta.json matches; the plan."""
    meta = {"version": BUILDER_VERSION, "sources": SOURCES, "rows": ROWS, "mean": MEAN_LEN}
    meta.update(steps=STEPS, samples=SAMPLES, seed=SEED)
    plan = data / "plan.mds"
    stamp = data / "meta.json"
    if plan.exists() and stamp.exists() and json.loads(stamp.read_text()) == meta:
        return plan
    from mds.planner.index.build import build_index
    from mds.planner.index.config import parse_config
    from mds.planner.plan.build import build_plan
    from mds.planner.plan.config import plan_config_from_dict

    data.mkdir(parents=True, exist_ok=True)
    tables = []
    for s in range(SOURCES):
        rng = np.random.default_rng([SEED, s])
        lengths = rng.integers(8, 2 * MEAN_LEN - 8 + 1, ROWS, dtype=np.int64)
        offsets = np.zeros(ROWS + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        values = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
        column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        name = f"s{s:03d}"
        (data / name).mkdir(exist_ok=True)
        path = data / name / "part-0.parquet"
        pq.write_table(pa.table({"tokens": column}), path, row_group_size=ROWS)
        tables.append({"name": name, "path": f"{name}/*.parquet", "tokens": "tokens", "weight": 1})
    config = {
        "index": {"output": "index"},
        "source": tables,
        "train": {
            "steps": STEPS,
            "dp_size": 1,
            "micro_batches": 1,
            "samples_per_step": SAMPLES,
            "max_tokens_per_micro_batch": SAMPLES * 2 * MEAN_LEN,
            "seed": 7,
        },
    }
    build_index(parse_config(config, path=data / "config.toml"), data / "index", workers=1)
    config["plan"] = {"index": str((data / "index").resolve())}
    build_plan(plan_config_from_dict(config, base=data), plan, workers=1)
    stamp.write_text(json.dumps(meta))
    return plan


_CHILD = r"""
import json, os, sys, time

def status(key, path="/proc/self/status"):
    for line in open(path, encoding="ascii"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0

args = json.loads(sys.argv[1])
import numpy, torch, mds.executor
from mds.executor import PlanExecutor
base = status("VmRSS")
budget = {"memory_bytes": args["memory"]} if args["memory"] is not None else {}
ex = PlanExecutor(args["plan"], 0, verify="none", cache_bytes=args["cache"], **budget)
times = []
last = time.perf_counter()
import multiprocessing
starts = multiprocessing.Manager().dict()  # worker pid -> its RSS as it starts

def started(_worker):
    starts[os.getpid()] = status("VmRSS")

if args["workers"] == 0:
    it = iter(ex)
else:
    it = iter(ex.dataloader(num_workers=args["workers"], worker_init_fn=started))
def workers_net():
    # the VmHWM of the DataLoader workers, while they run, above their RSS as they started
    out = 0
    for pid, rss in list(starts.items()):
        try:
            out = max(out, status("VmHWM", f"/proc/{pid}/status") - rss)
        except OSError:
            pass
    return out

children = 0
for mb in it:
    now = time.perf_counter()
    times.append(now - last)
    last = now
    if args["workers"]:
        children = max(children, workers_net())
ex.close()
print(json.dumps({"seconds": sum(times), "base": base, "peak": status("VmHWM"), "children": children,
                  "steady_ms": 1e3 * float(numpy.median(times[len(times) // 2:])),
                  "steps": len(times)}))
"""


def replay(plan: Path, memory: int, cache: int | None, workers: int) -> dict:
    job = {"plan": str(plan), "memory": memory, "cache": cache, "workers": workers}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(job)], capture_output=True, text=True, check=False
    )
    if proc.returncode:
        raise RuntimeError(proc.stderr)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # a forked worker's peak is net of its RSS as it started
    out["net"] = max(out["children"], out["peak"] - out["base"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--data", type=Path, default=REPO / "build" / "bench-data" / "budget")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument(
        "--before", action="store_true", help="the cases of the code before memory_bytes"
    )
    args = parser.parse_args()
    plan = build(args.data)
    if args.build_only:
        return
    rows = []
    cases = CASES if not args.before else [
        ("before: cache_bytes=256 MiB", None, 256 * MiB),
        ("before: cache_bytes=64 MiB", None, 64 * MiB),
    ]
    for label, memory, cache in cases:
        for workers in (0, 2):
            r = replay(plan, memory, cache, workers)
            rows.append({"case": label, "workers": workers, "memory": memory, **r})
            print(
                f"{label:38s} W={workers}: peak above imports {r['net'] / MB:7.1f} MB, "
                f"{r['steady_ms']:6.2f} ms/step, {r['seconds']:.1f} s in all",
                flush=True,
            )
    lines = [
        "| case | W | peak RSS above imports (MB) | budget + 32 MiB (MB) | ms/step | replay (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['workers']} | {r['net'] / MB:.1f} | "
            f"{(r['memory'] or 0) / MB + 32 * MiB / MB:.0f} | {r['steady_ms']:.2f} | "
            f"{r['seconds']:.1f} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    name = "budget-before" if args.before else "budget"
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")
    (args.out / f"{name}.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
