"""Benchmark the engines: the local pool vs Ray on the same cores, for `mds index` of many
small files and a large `mds plan`, plus each engine's cost per task (no-op tasks).

Ray runs as a local cluster of --cpus CPUs started here (its start-up is reported apart);
the local pool gets the same number of workers. Every figure is a median of --repeat runs,
side by side in one process; the index and plan each engine writes are compared byte for
byte. docs/scaling.md extrapolates from these numbers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from bench_plan import make_index, plan_config  # noqa: E402  (bench/ is on sys.path when run)
from report import write_report  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from ray_clusters import unadvertise  # noqa: E402

from mds.planner.index.build import build_index
from mds.planner.index.config import parse_config
from mds.planner.plan.build import build_plan
from mds.planner.runtime.engine import EngineSpec, open_engine

SEED = 20261203
SAMPLES_PER_STEP = 512  # bench_plan's geometry: 64 ranks x 512 samples a step
JOB_START_S: list[float] = []  # connecting a driver and warming its workers, per connection


def _noop(i: int) -> int:
    return i


def make_files(data: Path, files: int, rows: int) -> Path:
    """`files` small Parquet files (`rows` rows each, an n_tokens column); the config path.
    Parquet has no batch scanner, so each file is one scan task: the worst case for
    per-task overhead."""
    config = data / "bench.toml"
    meta = {"files": files, "rows": rows, "seed": SEED}
    marker = data / "meta.json"
    if marker.exists() and json.loads(marker.read_text()) == meta:
        return config
    shutil.rmtree(data, ignore_errors=True)
    rng = np.random.default_rng(SEED)
    for i in range(files):
        folder = data / "files" / f"{i // 1000:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        n = rng.integers(16, 4096, rows)
        pq.write_table(pa.table({"n_tokens": n}), folder / f"f{i:06d}.parquet")
    config.write_text(
        '[[source]]\nname = "small"\npath = "files/*/*.parquet"\ncount = "n_tokens"\n'
    )
    marker.write_text(json.dumps(meta))
    return config


def tree(path: Path) -> dict[str, bytes]:
    return {
        p.relative_to(path).as_posix(): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def per_task_us(spec: EngineSpec, workers: int, tasks: int, processes: bool) -> float:
    """Wall time per no-op task through engine.map (the engine already running), in us."""
    with open_engine(spec, workers, processes=processes) as engine:
        list(engine.map(_noop, [(i,) for i in range(4 * workers)]))  # warm the workers
        t = timed(lambda: list(engine.map(_noop, [(i,) for i in range(tasks)])))
    return 1e6 * t / tasks


def start_clusters(cpus: int, store_mb: int):
    """{mode: address}: one Ray node of `cpus` CPUs, and the same CPUs over `cpus` nodes of one
    CPU each (Ray's cluster_utils.Cluster: separate raylets and object stores on this machine)."""
    from ray.cluster_utils import Cluster

    store = store_mb << 20
    one = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": cpus, "object_store_memory": store, "include_dashboard": False},
    )
    many = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": store, "include_dashboard": False},
    )
    for _ in range(cpus - 1):
        many.add_node(num_cpus=1, object_store_memory=store)
    many.wait_for_nodes()
    for cluster in (one, many):
        unadvertise(cluster)
    return {"ray-1-node": one, f"ray-{cpus}-nodes": many}


def _warm() -> int:
    import mds.planner.index.source_table  # noqa: F401  (what a scan task imports)

    return 0


def connected(cluster, ungrouped: bool = False):
    """A context: this process connected to `cluster` (connecting is not timed); with
    `ungrouped`, one task per unit as before grouping (engine.GROUP_ITEMS = 1)."""
    import contextlib

    import ray

    from mds.planner.runtime import engine as engine_mod

    @contextlib.contextmanager
    def ctx():
        t0 = time.perf_counter()
        ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
        # A new job starts its own workers, which import mds: done before the timed work,
        # as for a long-running driver; reported apart (every `mds` command pays it).
        with open_engine(EngineSpec("ray"), None) as engine:
            list(engine.map(_warm, [()] * (4 * engine.workers)))
        JOB_START_S.append(time.perf_counter() - t0)
        saved = engine_mod.GROUP_ITEMS
        if ungrouped:
            engine_mod.GROUP_ITEMS = 1
        try:
            yield
        finally:
            engine_mod.GROUP_ITEMS = saved
            ray.shutdown()

    return ctx()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    parser.add_argument("--data", type=Path, default=Path("build/bench-data/engine"))
    parser.add_argument(
        "--files", default="20000,100000", help="comma-separated counts of small files to index"
    )
    parser.add_argument("--rows", type=int, default=32, help="rows per small file")
    parser.add_argument(
        "--ungrouped-max",
        type=int,
        default=20_000,
        help="also time Ray with one task per file (the old way) up to this many files",
    )
    parser.add_argument(
        "--samples", type=int, default=16_000_000, help="samples to plan (0: no plan part)"
    )
    parser.add_argument("--plan-rows", type=int, default=250_000, help="rows per plan source")
    parser.add_argument("--chunk-steps", type=int, default=256)
    parser.add_argument("--noop-tasks", type=int, default=2000)
    parser.add_argument("--cpus", type=int, default=2, help="Ray CPUs = local workers")
    parser.add_argument("--store-mb", type=int, default=150, help="object store per Ray node")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    import ray

    W = args.cpus
    out: dict = {"cpus": W, "repeat": args.repeat}
    t0 = time.perf_counter()
    clusters = start_clusters(W, args.store_mb)
    out["ray_start_s"] = time.perf_counter() - t0  # both clusters
    one, many = list(clusters)
    work = args.out / "engine-work"
    shutil.rmtree(work, ignore_errors=True)
    ray_spec = EngineSpec("ray")
    try:
        with connected(clusters[one]):
            out["noop_us_per_task"] = {
                "threads": per_task_us(EngineSpec(), W, args.noop_tasks, processes=False),
                "processes": per_task_us(EngineSpec(), W, args.noop_tasks, processes=True),
                "ray": per_task_us(ray_spec, W, args.noop_tasks, processes=False),
            }
        out["index"] = []
        for files in (int(n) for n in args.files.split(",")):
            config = parse_config_file(
                make_files(args.data / f"files-{files}", files, args.rows)
            )
            modes = ["local", one, many] + (["ray-ungrouped"] if files <= args.ungrouped_max else [])
            times: dict[str, list[float]] = {m: [] for m in modes}
            for _ in range(args.repeat):
                for mode in modes:
                    dest = work / f"{files}-{mode}"
                    shutil.rmtree(dest, ignore_errors=True)
                    if mode == "local":
                        times[mode].append(
                            timed(lambda d=dest, c=config: build_index(c, d, workers=W))
                        )
                        print(f"index {files} local: {times[mode][-1]:.2f} s", flush=True)
                        continue
                    cluster = clusters[one] if mode == "ray-ungrouped" else clusters[mode]
                    with connected(cluster, ungrouped=mode == "ray-ungrouped"):
                        times[mode].append(
                            timed(lambda d=dest, c=config: build_index(c, d, engine=ray_spec))
                        )
                    print(f"index {files} {mode}: {times[mode][-1]:.2f} s", flush=True)
            local = tree(work / f"{files}-local")
            med = {m: statistics.median(t) for m, t in times.items()}
            out["index"].append(
                {
                    "files": files,
                    "rows_per_file": args.rows,
                    "seconds": med,
                    "ratio_over_local": {m: med[m] / med["local"] for m in modes},
                    "identical": all(tree(work / f"{files}-{m}") == local for m in modes),
                }
            )

        if args.samples:
            steps = -(-args.samples // SAMPLES_PER_STEP)
            pconfig = plan_config(
                make_index(args.data / "plan", args.plan_rows, "moderate"), steps, args.chunk_steps
            )
            plan_s: dict[str, list[float]] = {"local": [], "ray": []}
            for _ in range(args.repeat):
                for name in ("local", "ray"):
                    spec = ray_spec if name == "ray" else EngineSpec()
                    with connected(clusters[one]) if name == "ray" else _nothing():
                        plan_s[name].append(
                            timed(
                                lambda s=spec, n=name: build_plan(
                                    pconfig, work / f"{n}.mds", workers=W, engine=s
                                )
                            )
                        )
            r = {
                "samples": steps * SAMPLES_PER_STEP,
                "steps": steps,
                "chunks": -(-steps // args.chunk_steps),
                "local_s": statistics.median(plan_s["local"]),
                "ray_s": statistics.median(plan_s["ray"]),
                "identical": (work / "local.mds").read_bytes() == (work / "ray.mds").read_bytes(),
            }
            r["ratio_ray_over_local"] = r["ray_s"] / r["local_s"]
            r["ray_extra_ms_per_task"] = 1000 * (r["ray_s"] - r["local_s"]) / r["chunks"]
            out["plan"] = r
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for cluster in clusters.values():
            cluster.shutdown()
    out["job_start_s"] = statistics.median(JOB_START_S)
    write_report(args.out, "engine", render(out), out)
    return 0


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def parse_config_file(path: Path):
    import tomllib

    return parse_config(tomllib.loads(path.read_text()), path=path)


def render(r: dict) -> str:
    n = r["noop_us_per_task"]
    modes = list(r["index"][0]["seconds"])
    lines = [
        f"## engines: local pool vs Ray, {r['cpus']} CPUs each (median of {r['repeat']})",
        "",
        f"Ray start-up (both local clusters): {r['ray_start_s']:.2f} s; a driver's connection "
        f"with its workers warmed (every `mds` command pays it; not in the times below): "
        f"{r['job_start_s']:.2f} s",
        "",
        "| index tiny Parquet files | "
        + " | ".join(f"{m} s" for m in modes)
        + " | "
        + " | ".join(f"{m} / local" for m in modes[1:])
        + " | same bytes |",
        "|---|" + "---:|" * (2 * len(modes) - 1) + "---|",
    ]
    for i in r["index"]:
        secs = [i["seconds"].get(m) for m in modes]
        ratios = [i["ratio_over_local"].get(m) for m in modes[1:]]
        lines.append(
            f"| {i['files']:,} | "
            + " | ".join("-" if v is None else f"{v:.2f}" for v in secs)
            + " | "
            + " | ".join("-" if v is None else f"{v:.2f}" for v in ratios)
            + f" | {i['identical']} |"
        )
    if "plan" in r:
        p = r["plan"]
        lines += [
            "",
            "| plan | local s | Ray s | Ray / local | Ray extra ms/task | same bytes |",
            "|---|---:|---:|---:|---:|---|",
            f"| {p['samples']:,} samples, {p['chunks']} chunks | {p['local_s']:.2f} "
            f"| {p['ray_s']:.2f} | {p['ratio_ray_over_local']:.2f} "
            f"| {p['ray_extra_ms_per_task']:.1f} | {p['identical']} |",
        ]
    lines += [
        "",
        "| no-op task through engine.map | us per task |",
        "|---|---:|",
        *(f"| {k} | {v:.0f} |" for k, v in n.items()),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
