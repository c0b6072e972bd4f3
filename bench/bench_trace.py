"""What tracing one step costs as a plan grows: `mds trace PLAN --step K` against plans of
10^5, 10^6, 10^7 (and with --large 10^8) samples of one small synthetic corpus, many epochs.

Corpus: a sparse Megatron dataset of 100k rows (tests/scale_corpus.py); plans of 256
samples a step, dp_size 8, chunk_steps 256, made with `mds plan --steps`. For each plan, in
fresh child processes (median of 3): the time of trace's work (`trace_plan`, reading the
samples and hashing them, as the command does), the plan bytes it read (counted in
`PlanReader._read`) and every byte read through read syscalls (/proc/self/io rchar). Side
by side, the baseline a user has without trace: `mds export --steps K:K+1` (plan_frame:
reads every block, since epochs need the whole stream), up to --export-max samples.
Ratios: each size's trace against the smallest plan's (flat means independent of plan
length), and export against trace.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from report import write_report  # noqa: E402
from scale_corpus import MEGATRON_PATH, write_scale_config, write_sparse_megatron  # noqa: E402

ROWS = 100_000
SAMPLES_PER_STEP, DP, CHUNK_STEPS = 256, 8, 256
RUNS = 3


def rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return -1


def child(kind: str, plan: str, step: int) -> dict:
    """One traced (or exported) step in this process: seconds, plan bytes read, rchar."""
    from mds.core.planfile_reader import PlanReader

    counted = {"bytes": 0, "reads": 0}
    original = PlanReader._read

    def counting(self, offset, size):
        counted["bytes"] += size
        counted["reads"] += 1
        return original(self, offset, size)

    PlanReader._read = counting  # type: ignore[method-assign]
    from mds.cli.contents import trace_payloads
    from mds.core.content_hash import content_hash
    from mds.planner.report.export import plan_frame
    from mds.planner.report.trace import trace_plan

    before, t = rchar(), time.perf_counter()
    if kind == "trace":
        trace = trace_plan(plan, (step, step + 1))
        rows = len([content_hash(p) for p in trace_payloads(trace)])
    else:
        rows = plan_frame(plan, steps=(step, step + 1)).height
    return {
        "seconds": time.perf_counter() - t,
        "plan_bytes": counted["bytes"],
        "plan_reads": counted["reads"],
        "rchar": rchar() - before,
        "rows": rows,
    }


def run_child(kind: str, plan: Path, step: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(plan), str(step)],
        capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_of(kind: str, plan: Path, step: int) -> dict:
    runs = [run_child(kind, plan, step) for _ in range(RUNS)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def make_plan(root: Path, samples: int) -> tuple[Path, float]:
    steps = samples // SAMPLES_PER_STEP
    config = write_scale_config(
        root, "megatron", steps=steps, samples_per_step=SAMPLES_PER_STEP, dp_size=DP,
        chunk_steps=CHUNK_STEPS,
    )  # fmt: skip
    mds = str(Path(sys.executable).with_name("mds"))
    index = root / "index"
    if not (index / "manifest.json").is_file():
        subprocess.run([mds, "index", str(config), "-o", str(index)], check=True, capture_output=True)
    plan = root / f"plan-{samples}.mds"
    t = time.perf_counter()
    if not plan.is_file():
        subprocess.run(
            [mds, "plan", str(config), "--index", str(index), "-o", str(plan)],
            check=True, capture_output=True,
        )  # fmt: skip
    return plan, time.perf_counter() - t


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    parser.add_argument("--work", type=Path, default=Path("build/bench/trace-data"))
    parser.add_argument("--large", action="store_true", help="Add a plan of 10^8 samples.")
    parser.add_argument("--export-max", type=int, default=10**6, help="Largest plan exported.")
    args = parser.parse_args()
    root = args.work
    if not (root / (MEGATRON_PATH + ".idx")).is_file():
        write_sparse_megatron(root / MEGATRON_PATH, ROWS)
    sizes = [10**5, 10**6, 10**7] + ([10**8] if args.large else [])
    results = []
    for samples in sizes:
        plan, plan_s = make_plan(root, samples)
        step = samples // SAMPLES_PER_STEP // 2 + 3  # inside a chunk, past the first epochs
        trace = median_of("trace", plan, step)
        export = median_of("export", plan, step) if samples <= args.export_max else None
        results.append(
            {"samples": samples, "plan_file_bytes": plan.stat().st_size, "plan_seconds": plan_s,
             "step": step, "trace": trace, "export": export}
        )  # fmt: skip
        print(json.dumps(results[-1]), flush=True)
    base = results[0]["trace"]
    lines = [
        "| samples | plan MB | trace ms | plan KB read | reads | rchar KB | x smallest (time, plan bytes) | export ms | export plan KB read | export / trace (time) |",
        "|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in results:
        t, e = r["trace"], r["export"]
        lines.append(
            f"| {r['samples']:,} | {r['plan_file_bytes'] / 1e6:.1f} | {1000 * t['seconds']:.0f} | "
            f"{t['plan_bytes'] / 1e3:.1f} | {t['plan_reads']:.0f} | {t['rchar'] / 1e3:.0f} | "
            f"{t['seconds'] / base['seconds']:.2f}, {t['plan_bytes'] / base['plan_bytes']:.2f} | "
            + (
                f"{1000 * e['seconds']:.0f} | {e['plan_bytes'] / 1e3:.0f} | "
                f"{e['seconds'] / t['seconds']:.1f} |"
                if e
                else "- | - | - |"
            )
        )
    table = (
        f"Trace one step ({SAMPLES_PER_STEP} samples, dp_size {DP}, chunk_steps {CHUNK_STEPS}) "
        f"of plans of one {ROWS:,}-row corpus; medians of {RUNS} fresh processes\n\n"
        + "\n".join(lines)
        + "\n"
    )
    write_report(args.out, "bench_trace", table, results)


if __name__ == "__main__":
    main()
