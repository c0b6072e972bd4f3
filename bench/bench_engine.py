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
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from bench_plan import make_index, plan_config  # noqa: E402  (bench/ is on sys.path when run)
from report import write_report  # noqa: E402

from mds.planner.index.build import build_index
from mds.planner.index.config import parse_config
from mds.planner.plan.build import build_plan
from mds.planner.runtime.engine import EngineSpec, open_engine

SEED = 20261203
SAMPLES_PER_STEP = 512  # bench_plan's geometry: 64 ranks x 512 samples a step


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    parser.add_argument("--data", type=Path, default=Path("build/bench-data/engine"))
    parser.add_argument("--files", type=int, default=20_000, help="small files to index")
    parser.add_argument("--rows", type=int, default=32, help="rows per small file")
    parser.add_argument("--samples", type=int, default=16_000_000, help="samples to plan")
    parser.add_argument("--plan-rows", type=int, default=250_000, help="rows per plan source")
    parser.add_argument("--chunk-steps", type=int, default=256)
    parser.add_argument("--noop-tasks", type=int, default=2000)
    parser.add_argument("--cpus", type=int, default=2, help="Ray CPUs = local workers")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    import ray

    W = args.cpus
    ray_spec = EngineSpec("ray")
    out: dict = {"cpus": W, "repeat": args.repeat}
    out["ray_start_s"] = timed(
        lambda: ray.init(num_cpus=W, include_dashboard=False, log_to_driver=False)
    )
    try:
        out["noop_us_per_task"] = {
            "threads": per_task_us(EngineSpec(), W, args.noop_tasks, processes=False),
            "processes": per_task_us(EngineSpec(), W, args.noop_tasks, processes=True),
            "ray": per_task_us(ray_spec, W, args.noop_tasks, processes=False),
        }

        config = parse_config_file(make_files(args.data / "files", args.files, args.rows))
        work = args.out / "engine-work"
        shutil.rmtree(work, ignore_errors=True)
        index_s: dict[str, list[float]] = {"local": [], "ray": []}
        for _ in range(args.repeat):
            for name, spec in (("local", EngineSpec()), ("ray", ray_spec)):
                shutil.rmtree(work / name, ignore_errors=True)
                index_s[name].append(
                    timed(lambda s=spec, n=name: build_index(config, work / n, workers=W, engine=s))
                )
        out["index"] = {
            "files": args.files,
            "rows_per_file": args.rows,
            "scan_tasks": args.files,
            "fingerprint_tasks": -(-args.files // 256),
            "local_s": statistics.median(index_s["local"]),
            "ray_s": statistics.median(index_s["ray"]),
            "identical": tree(work / "local") == tree(work / "ray"),
        }

        steps = -(-args.samples // SAMPLES_PER_STEP)
        pconfig = plan_config(
            make_index(args.data / "plan", args.plan_rows, "moderate"), steps, args.chunk_steps
        )
        plan_s: dict[str, list[float]] = {"local": [], "ray": []}
        for _ in range(args.repeat):
            for name, spec in (("local", EngineSpec()), ("ray", ray_spec)):
                plan_s[name].append(
                    timed(
                        lambda s=spec, n=name: build_plan(
                            pconfig, work / f"{n}.mds", workers=W, engine=s
                        )
                    )
                )
        out["plan"] = {
            "samples": steps * SAMPLES_PER_STEP,
            "steps": steps,
            "chunks": -(-steps // args.chunk_steps),
            "local_s": statistics.median(plan_s["local"]),
            "ray_s": statistics.median(plan_s["ray"]),
            "identical": (work / "local.mds").read_bytes() == (work / "ray.mds").read_bytes(),
        }
    finally:
        ray.shutdown()
    for part, tasks in (
        ("index", out["index"]["scan_tasks"] + out["index"]["fingerprint_tasks"]),
        ("plan", out["plan"]["chunks"]),
    ):
        r = out[part]
        r["ratio_ray_over_local"] = r["ray_s"] / r["local_s"]
        r["ray_extra_ms_per_task"] = 1000 * (r["ray_s"] - r["local_s"]) / tasks
    write_report(args.out, "engine", render(out), out)
    return 0


def parse_config_file(path: Path):
    import tomllib

    return parse_config(tomllib.loads(path.read_text()), path=path)


def render(r: dict) -> str:
    n, i, p = r["noop_us_per_task"], r["index"], r["plan"]
    return "\n".join(
        [
            f"## engines: local pool vs Ray, {r['cpus']} CPUs each (median of {r['repeat']})",
            "",
            f"Ray start-up (local cluster): {r['ray_start_s']:.2f} s",
            "",
            "| work | local s | Ray s | Ray / local | Ray extra ms/task | same bytes |",
            "|---|---:|---:|---:|---:|---|",
            f"| index {i['files']:,} small Parquet files | {i['local_s']:.2f} | {i['ray_s']:.2f} "
            f"| {i['ratio_ray_over_local']:.2f} | {i['ray_extra_ms_per_task']:.3f} "
            f"| {i['identical']} |",
            f"| plan {p['samples']:,} samples, {p['chunks']} chunks | {p['local_s']:.2f} "
            f"| {p['ray_s']:.2f} | {p['ratio_ray_over_local']:.2f} "
            f"| {p['ray_extra_ms_per_task']:.1f} | {p['identical']} |",
            "",
            "| no-op task through engine.map | us per task |",
            "|---|---:|",
            *(f"| {k} | {v:.0f} |" for k, v in n.items()),
            "",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
