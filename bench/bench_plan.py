"""Benchmark `mds plan`: samples/s, bytes/sample and balance against the baselines.

Builds (once, cached) an index of synthetic sources with heavy-tailed lengths, plans
D=64 ranks x 512 samples per step (and D=1024 x 8192 on the log-normal profile), and
reports, measured side by side in one run: planning throughput with 1 and 2 workers,
plan bytes per sample, and the mean/p99/max ratio of the slowest rank's cost to the lower
bound for mds, plain greedy LPT (no refinement, no capacity), naive sharding (a seeded
random deal) and in-order interleaving of the same samples. Then the balance table
(bench/balance_table.py): mds, LPT and Karmarkar-Karp on synthetic long-context and
log-normal steps, and the balancer's time and memory against samples per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
from balance_table import balance_cases, per_rank_scaling, render_balance, render_scaling
from report import write_report  # noqa: E402  (bench/ is on sys.path when run)

from mds.planner.index.build import build_index
from mds.planner.index.config import parse_config
from mds.planner.plan.bounds import greedy_lpt, interleave_ranks, lower_bound, naive_ranks
from mds.planner.plan.build import build_plan
from mds.planner.plan.chunk import Planner
from mds.planner.plan.config import plan_config_from_dict

SEED = 20261202
SOURCES = 8
ROWS_PER_SOURCE = 1_000_000


PROFILES = {
    # Pareto tails: a few very long documents per step, so the largest sample often sets
    # the lower bound and balancing is about placing everything else around it.
    "heavy": "pareto",
    # Log-normal lengths (median ~250-600 tokens, capped at 16384): the total sets the
    # lower bound and the balancer has to even out many mid-sized samples.
    "moderate": "lognormal",
}


def _lengths(rng: np.random.Generator, profile: str, s: int, rows: int) -> np.ndarray:
    if PROFILES[profile] == "pareto":
        raw = 16 + rng.pareto(1.1 + 0.15 * s, rows) * 120
    else:
        raw = rng.lognormal(5.5 + 0.12 * s, 0.8, rows)
    return np.clip(raw, 16, 16384).astype(np.int64)


def make_index(data: Path, rows: int, profile: str) -> Path:
    """Parquet sources with an n_tokens column (lengths per `profile`), indexed."""
    data = data / profile
    index = data / "index"
    marker = data / "meta.json"
    meta = {"sources": SOURCES, "rows": rows, "seed": SEED, "version": 2, "profile": profile}
    if (
        marker.exists()
        and json.loads(marker.read_text()) == meta
        and (index / "manifest.json").exists()
    ):
        return index
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    sources = []
    for s in range(SOURCES):
        rng = np.random.default_rng([SEED, s])
        n = _lengths(rng, profile, s, rows)
        lang = rng.choice(["en", "de", "fr", "code"], rows)
        pl.DataFrame({"n_tokens": n, "lang": lang}).write_parquet(data / f"src{s}.parquet")
        sources.append(
            {"name": f"src{s}", "path": f"src{s}.parquet", "count": "n_tokens", "keep": ["lang"]}
        )
    build_index(parse_config({"source": sources}, path=data / "bench.toml"), index)
    marker.write_text(json.dumps(meta))
    return index


def plan_config(index: Path, steps: int, chunk_steps: int, dp: int = 64, per_step: int = 512):
    sources = [
        {
            "name": f"src{s}",
            "path": f"src{s}.parquet",
            "count": "n_tokens",
            "weight": [[0, 1.0 + s], [steps, 8.0 - s]],
        }
        for s in range(SOURCES)
    ]
    data = {
        "plan": {"index": str(index.resolve()), "chunk_steps": chunk_steps},
        "train": {
            "steps": steps,
            "dp_size": dp,
            "micro_batches": 4,
            "samples_per_step": per_step,
            "max_tokens_per_micro_batch": 16384,
            "seed": 7,
        },
        "cost": {"model": {"layers": 32, "hidden": 4096}},
        "source": sources,
    }
    return plan_config_from_dict(data, base=index.parent)


def baselines(config, chunks: int) -> dict[str, list[float]]:
    """Greedy LPT, naive sharding and in-order interleaving on the very samples mds
    planned (first chunks)."""
    planner = Planner(config)
    states = planner.states()
    dp = config.train.dp_size
    out: dict[str, list[float]] = {"greedy_lpt": [], "naive": [], "interleave": []}
    out["lpt_seconds"] = []
    for i, (a, b) in enumerate(planner.boundaries()[:chunks]):
        counts, _ = planner.mixer.run(states[i], b)
        # Rebuild the chunk's padded cost matrix exactly as plan_chunk does.
        T, N = b - a, int(counts.sum(axis=1).max())
        cost = np.zeros((T, N), np.int64)
        k = np.zeros(T, np.int64)
        for s, (pool, stream) in enumerate(zip(planner.pools, planner.streams, strict=True)):
            total = int(counts[:, s].sum())
            pos = stream.positions(int(states[i].consumed[s]), total)
            step_of = np.repeat(np.arange(T), counts[:, s])
            first = np.cumsum(counts[:, s]) - counts[:, s]
            slot = k[step_of] + np.arange(total) - first[step_of]
            cost[step_of, slot] = pool.costs[pos]
            k += counts[:, s]
        valid = np.ones((T, N), bool)
        lb = lower_bound(cost, dp)
        t0 = time.perf_counter()
        g = greedy_lpt(cost, valid, dp)
        out["lpt_seconds"].append(time.perf_counter() - t0)
        for name, rank in (
            ("greedy_lpt", g),
            ("naive", naive_ranks(valid, dp, np.arange(a, b))),
            ("interleave", interleave_ranks(valid, dp)),
        ):
            load = np.zeros((T, dp), np.int64)
            np.add.at(load, (np.arange(T)[:, None].repeat(N, 1), rank), cost)
            out[name].extend((load.max(axis=1) / lb).tolist())
    return out


def ratios(plan_stats: np.ndarray, columns: list[str]) -> np.ndarray:
    col = {c: plan_stats[:, i] for i, c in enumerate(columns)}
    return col["max_rank_cost"] / np.maximum(col["lower_bound"], 1)


def summarize(values) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(arr.mean()),
        "p99": float(np.quantile(arr, 0.99)),
        "max": float(arr.max()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    parser.add_argument("--data", type=Path, default=Path("build/bench-data/plan"))
    parser.add_argument("--steps", type=int, default=16384, help="steps to plan (512 samples each)")
    parser.add_argument("--rows", type=int, default=ROWS_PER_SOURCE, help="rows per source")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk-steps", type=int, default=256)
    parser.add_argument(
        "--profiles", nargs="+", choices=sorted(PROFILES), default=["moderate", "heavy"]
    )
    parser.add_argument(
        "--balance-samples",
        type=int,
        default=1 << 18,
        help="samples per case of the balance table (and per call in the per-rank scaling)",
    )
    parser.add_argument("--no-plans", action="store_true", help="only the balance tables")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0

    results = []
    if not args.no_plans:
        results = [run_profile(args, profile) for profile in args.profiles]
        results.append(run_profile(args, "moderate", dp=1024, per_step=8192))
    cases = balance_cases(args.balance_samples)
    scaling = per_rank_scaling(args.balance_samples)
    text = "\n".join(
        [*(render(r) for r in results), render_balance(cases), render_scaling(scaling)]
    )
    write_report(args.out, "plan", text, {"plans": results, "balance": cases, "per_rank": scaling})
    return 0


def run_profile(args, profile: str, dp: int = 64, per_step: int = 512) -> dict:
    """Plan the same number of samples as `--steps` steps of 512, at D=dp, per_step."""
    from mds.core.planfile_reader import PlanReader

    index = make_index(args.data, args.rows, profile)
    steps = max(1, args.steps * 512 // per_step)
    chunk_steps = max(1, args.chunk_steps * 512 // per_step)
    config = plan_config(index, steps, chunk_steps, dp, per_step)
    args.out.mkdir(parents=True, exist_ok=True)
    samples = steps * per_step
    runs: dict[int, list[float]] = {1: [], 2: []}
    memory: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    plan_path = args.out / f"bench-plan-{profile}-d{dp}.mds"
    cpu: dict[int, list[float]] = {1: [], 2: []}

    def job(workers: int) -> dict:
        return {
            "data": str(args.data),
            "rows": args.rows,
            "profile": profile,
            "steps": steps,
            "chunk_steps": chunk_steps,
            "dp": dp,
            "per_step": per_step,
            "workers": workers,
            "out": str(plan_path),
        }

    # Timed runs are not watched: reading a process's smaps every 50 ms slows the run it
    # reads (by a quarter at D=64 with 2 workers). One more run per setting, watched, gives
    # the peak memory.
    for _ in range(args.repeat):
        for workers in (1, 2):
            seconds, used = run_child(job(workers), watch=False)
            runs[workers].append(seconds)
            cpu[workers].append(used["cpu_seconds"])
    for workers in (1, 2):
        memory[workers].append(run_child(job(workers), watch=True)[1])
    with PlanReader(plan_path) as reader:
        stats = reader.section("stats")
        columns = reader.footer["stats_columns"]
        size = reader.size
    ours = ratios(stats, columns)
    base = baselines(config, chunks=max(1, min(4, steps // chunk_steps)))
    lpt_rate = len(base["greedy_lpt"]) * per_step / sum(base["lpt_seconds"])
    return {
        "profile": profile,
        "steps": steps,
        "samples": samples,
        "dp_size": dp,
        "samples_per_step": per_step,
        "micro_batches": 4,
        "samples_per_s_1_worker": samples / statistics.median(runs[1]),
        "samples_per_s_2_workers": samples / statistics.median(runs[2]),
        "greedy_lpt_samples_per_s": lpt_rate,
        "bytes_per_sample": size / samples,
        "ratio_mds": summarize(ours),
        "ratio_greedy_lpt": summarize(base["greedy_lpt"]),
        "ratio_naive": summarize(base["naive"]),
        "ratio_interleave": summarize(base["interleave"]),
        "runs_seconds": {str(k): v for k, v in runs.items()},
        # Peak over the run of the summed PSS (shared pages counted once) and summed RSS
        # (counted in every process) of the planning process and its workers, in MB.
        "peak_pss_mb": {str(k): max(m["pss_mb"] for m in v) for k, v in memory.items()},
        "peak_rss_mb": {str(k): max(m["rss_mb"] for m in v) for k, v in memory.items()},
        # CPU time (all processes) per sample, median of the runs: what a busy machine
        # does not inflate as much as the wall time.
        "cpu_us_per_sample": {str(k): statistics.median(v) / samples * 1e6 for k, v in cpu.items()},
    }


def _children(pid: int) -> list[int]:
    """`pid` and all its descendants (Linux /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _memory_mb(pid: int) -> dict[str, float]:
    """Summed PSS and RSS of `pid` and its descendants, in MB (smaps_rollup)."""
    total = {"pss_mb": 0.0, "rss_mb": 0.0}
    for p in _children(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    key = {"Pss:": "pss_mb", "Rss:": "rss_mb"}.get(line.split(":")[0] + ":")
                    if key:
                        total[key] += int(line.split()[1]) / 1024
        except OSError:
            pass
    return total


def run_child(job: dict, watch: bool) -> tuple[float, dict[str, float]]:
    """One build_plan in a fresh process: its seconds (timed there) and the CPU seconds it
    and its workers used; `watch`: also their peak summed memory, sampled every 50 ms."""
    cmd = [sys.executable, __file__, "--child", json.dumps(job)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    peak = {"pss_mb": 0.0, "rss_mb": 0.0}
    while watch and proc.poll() is None:
        now = _memory_mb(proc.pid)
        peak = {k: max(peak[k], now[k]) for k in peak}
        time.sleep(0.05)
    out = proc.stdout.read() if proc.stdout else ""
    proc.wait()
    if proc.returncode:
        raise SystemExit(f"planning child failed ({proc.returncode}): {job}")
    done = json.loads(out.strip().splitlines()[-1])
    return float(done["seconds"]), {**peak, "cpu_seconds": float(done["cpu_seconds"])}


def child(job: dict) -> None:
    """The --child side of run_child: plan once, print the seconds."""
    index = make_index(Path(job["data"]), job["rows"], job["profile"])
    config = plan_config(index, job["steps"], job["chunk_steps"], job["dp"], job["per_step"])
    import resource

    def cpu() -> float:
        return sum(
            u.ru_utime + u.ru_stime
            for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        )

    c0, t0 = cpu(), time.perf_counter()
    build_plan(config, Path(job["out"]), workers=job["workers"])
    seconds = time.perf_counter() - t0  # the workers have been joined: their CPU counts
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu() - c0}))


def render(r: dict) -> str:
    pss, rss, cpu = r["peak_pss_mb"], r["peak_rss_mb"], r["cpu_us_per_sample"]
    ratio = r["ratio_mds"]
    lpt, naive, inter = r["ratio_greedy_lpt"], r["ratio_naive"], r["ratio_interleave"]
    rows = [
        "| method | samples/s | CPU us/sample | peak PSS / RSS (MB) | mean ratio | p99 ratio "
        "| max ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| mds (2 workers) | {r['samples_per_s_2_workers']:,.0f} | {cpu['2']:.2f} "
        f"| {pss['2']:,.0f} / {rss['2']:,.0f} "
        f"| {ratio['mean']:.4f} | {ratio['p99']:.4f} | {ratio['max']:.4f} |",
        f"| mds (1 worker) | {r['samples_per_s_1_worker']:,.0f} | {cpu['1']:.2f} "
        f"| {pss['1']:,.0f} / {rss['1']:,.0f} | same plan | | |",
        f"| greedy LPT (balancing only, no capacity) | {r['greedy_lpt_samples_per_s']:,.0f} | - "
        f"| - | {lpt['mean']:.4f} | {lpt['p99']:.4f} | {lpt['max']:.4f} |",
        f"| naive sharding (random deal) | - | - | - | {naive['mean']:.4f} | {naive['p99']:.4f} "
        f"| {naive['max']:.4f} |",
        f"| in-order interleaving | - | - | - | {inter['mean']:.4f} | {inter['p99']:.4f} "
        f"| {inter['max']:.4f} |",
    ]
    head = (
        f"## mds plan, {r['profile']} lengths: {r['steps']} steps x {r['samples_per_step']} samples, D={r['dp_size']}, "
        f"{r['micro_batches']} micro-batches\n\n"
    )
    foot = (
        f"\nplan size: {r['bytes_per_sample']:.3f} bytes/sample. Ratio = slowest rank's cost / "
        "max(total/D, largest sample). Targets: >= 2M samples/s on 2 cores, mean ratio <= 1.005, "
        "<= 4 bytes/sample. Baselines are computed on the same samples (first chunks). Each "
        "planning run is a fresh process. Peak memory, from one more run per setting that "
        "is watched (smaps every 50 ms, which slows the run it reads), sums the process and "
        "its workers (PSS counts shared pages once, RSS in every process).\n"
    )
    return head + "\n".join(rows) + "\n" + foot


if __name__ == "__main__":
    sys.exit(main())
