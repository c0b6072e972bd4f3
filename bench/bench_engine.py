"""Benchmark the engines: the local pool vs Ray on the same cores, for `mds index` of many
small files and a large `mds plan`, plus each engine's cost per task (no-op tasks).

Ray runs as a local cluster of --cpus CPUs started here (its start-up is reported apart);
the local pool gets the same number of workers. Every figure is a median of --repeat runs,
side by side in one process; the index and plan each engine writes are compared byte for
byte. docs/scaling.md extrapolates from these numbers.

With --local-only, Ray is left out: each `mds index` of the tiny files (Parquet and JSONL)
runs on the local pool in a fresh process, which reports its wall and CPU time and the
driver's table assembly; with --before SRC, a second source tree (the code before a change)
runs alternately with this one, and the indexes of both are compared byte for byte.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
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


def make_files(data: Path, files: int, rows: int, fmt: str = "parquet") -> Path:
    """`files` small Parquet or JSONL files (`rows` rows each, an n_tokens column); the
    config path. Parquet has no batch scanner, so each file is one scan unit: the worst case
    for per-task overhead. JSONL files of a few lines are scanned up to 4,096 in a unit."""
    config = data / "bench.toml"
    meta = {"files": files, "rows": rows, "seed": SEED, "format": fmt}
    marker = data / "meta.json"
    if marker.exists() and {"format": "parquet", **json.loads(marker.read_text())} == meta:
        return config
    shutil.rmtree(data, ignore_errors=True)
    rng = np.random.default_rng(SEED)
    for i in range(files):
        folder = data / "files" / f"{i // 1000:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        n = rng.integers(16, 4096, rows)
        if fmt == "parquet":
            pq.write_table(pa.table({"n_tokens": n}), folder / f"f{i:06d}.parquet")
        else:
            lines = (json.dumps({"n_tokens": int(k), "text": "x" * 20}) + "\n" for k in n)
            (folder / f"f{i:06d}.jsonl").write_text("".join(lines))
    config.write_text(
        f'[[source]]\nname = "small"\npath = "files/*/*.{fmt}"\ncount = "n_tokens"\n'
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


def local_child(job: dict) -> None:
    """One `mds index` on the local pool in this (fresh) process: prints its wall and CPU
    seconds (every thread's) and the driver's time in `assemble`, and which mds ran."""
    import mds
    from mds.planner.index import build

    assembling = [0.0]
    assemble = build.assemble

    def timed_assemble(*args, **kwargs):
        t = time.perf_counter()
        try:
            return assemble(*args, **kwargs)
        finally:
            assembling[0] += time.perf_counter() - t

    build.assemble = timed_assemble
    config = parse_config_file(Path(job["config"]))
    shutil.rmtree(job["dest"], ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_SELF)
    wall = timed(lambda: build.build_index(config, Path(job["dest"]), workers=job["workers"]))
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    result = {"wall_s": wall, "cpu_s": cpu, "assemble_s": assembling[0], "mds": mds.__file__}
    print(json.dumps(result), flush=True)


def run_local(job: dict, src: Path | None, python: str) -> dict:
    """local_child in a fresh process, with `src` (a source tree's src/) first on its path."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
    done = subprocess.run(
        [python, __file__, "--child", json.dumps(job)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def local_only(args: argparse.Namespace) -> int:
    """The local pool alone, each index a fresh process; this code and, with --before, the
    code before, alternating (the order swapped each round)."""
    sides = {"after": (None, sys.executable)}
    if args.before is not None:
        sides = {"before": (args.before, args.before_python or sys.executable), **sides}
    work = args.out / "engine-local-work"
    shutil.rmtree(work, ignore_errors=True)
    out: dict = {"workers": args.cpus, "repeat": args.repeat, "load": [], "runs": []}
    for files in (int(n) for n in args.files.split(",")):
        for fmt in args.formats.split(","):
            config = make_files(args.data / f"{fmt}-{files}", files, args.rows, fmt)
            runs: dict[str, list[dict]] = {s: [] for s in sides}
            out["load"].append(os.getloadavg()[0])
            for r in range(args.repeat):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                for side in order:
                    src, python = sides[side]
                    job = {
                        "config": str(config),
                        "dest": str(work / f"{fmt}-{files}-{side}"),
                        "workers": args.cpus,
                    }
                    runs[side].append(run_local(job, src, python))
                    got = runs[side][-1]
                    print(
                        f"index {files} {fmt} {side}: {got['wall_s']:.2f} s wall, "
                        f"{got['cpu_s']:.2f} s CPU, assemble {got['assemble_s']:.3f} s",
                        flush=True,
                    )
            out["load"].append(os.getloadavg()[0])
            trees = {s: tree(work / f"{fmt}-{files}-{s}") for s in sides}
            out["runs"].append(
                {
                    "files": files,
                    "format": fmt,
                    "identical": all(t == trees["after"] for t in trees.values()),
                    **{
                        side: {
                            key: statistics.median(run[key] for run in rs)
                            for key in ("wall_s", "cpu_s", "assemble_s")
                        }
                        | {"runs": rs}
                        for side, rs in runs.items()
                    },
                }
            )
    write_report(args.out, "engine-local", render_local(out), out)
    return 0


def render_local(r: dict) -> str:
    load = r["load"]
    lines = [
        f"## mds index of tiny files, local pool of {r['workers']} workers, a fresh process "
        f"each (median of {r['repeat']}; load average {min(load):.1f} to {max(load):.1f})",
        "",
        "| files | format | code | wall s | CPU s | assemble s | same bytes |",
        "|---:|---|---|---:|---:|---:|---|",
    ]
    for run in r["runs"]:
        for side in ("before", "after"):
            if side in run:
                m = run[side]
                lines.append(
                    f"| {run['files']:,} | {run['format']} | {side} | {m['wall_s']:.2f} "
                    f"| {m['cpu_s']:.2f} | {m['assemble_s']:.3f} | {run['identical']} |"
                )
    return "\n".join(lines + [""])


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
    parser.add_argument(
        "--local-only", action="store_true", help="the local pool alone, a fresh process a run"
    )
    parser.add_argument("--formats", default="parquet,jsonl", help="with --local-only")
    parser.add_argument(
        "--before", type=Path, help="with --local-only: a source tree's src/ to run alternately"
    )
    parser.add_argument("--before-python", help="the Python that runs --before (default: this)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        local_child(json.loads(args.child))
        return 0
    if args.local_only:
        return local_only(args)
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
