"""Benchmark `mds.executor.PlanExecutor`: per-step overhead, resume latency, RSS vs sources.

Data (token-list Parquet, `tests/many_sources.py`) and plans are built once under `--data`
and reused while their `meta.json` matches. Three measurements, every timing a median and
every comparison measured side by side in the same loop:

  a. ms per step (64 samples, dp 1, 4 micro-batches, all built) over 500k rows in 4 files
     with 10k-row row groups, random access: warm (second pass, row groups cached), with
     `cache_bytes=1` (every row group decoded again), against a baseline that takes the
     same rows from an in-memory pyarrow Table and packs them with the same `pack`; and
     steady-state ms per step through `ex.dataloader(num_workers=2)`.
  b. resume latency on a plan of 131072 steps: construction (`verify="none"`) + `seek` +
     the first micro-batch, at the first, middle and last step; and `seek` + `sample_ids`
     alone on a fresh executor.
  c. peak RSS (VmHWM) of a fresh child replaying a whole plan over 1, 10, 100, 500 (and
     2000) sources holding the same rows, net of its RSS after `import torch, mds.executor`.

Results go to `<out>/executor.md` (the table, also printed) and `<out>/executor.json`.
Timings are reported, never asserted.

Usage: python bench/bench_executor.py [--out build/bench] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from many_sources import replay_in_child, token_plan, token_sources  # noqa: E402
from report import write_report  # noqa: E402  (bench/ is on sys.path when run)

from mds.executor import PlanExecutor  # noqa: E402
from mds.executor.batch import pack  # noqa: E402

BUILDER_VERSION = 1
SEED = 20261203
MB = 1e6

# a. per-step overhead
STEP_ROWS = 500_000
STEP_SOURCES, STEP_FILES_PER_SOURCE, ROW_GROUP = 2, 2, 10_000
SAMPLES_PER_STEP, MICRO_BATCHES = 64, 4
# b. resume
RESUME_STEPS, RESUME_SAMPLES = 131_072, 8
# c. RSS vs sources
RSS_SOURCES = (1, 10, 100, 500, 2000)


# --- cached data and plans ----------------------------------------------------------------


def cached(directory: Path, meta: dict[str, Any], build: Callable[[Path], Path]) -> Path:
    """`build(directory)`'s result, rebuilt only when directory/meta.json differs from `meta`;
    `build` returns a path relative to which the result is stored."""
    marker = directory / "meta.json"
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        recorded = None
    if recorded is not None and recorded.get("meta") == meta:
        result = directory / recorded["result"]
        if result.exists():
            return result
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    started = time.perf_counter()
    result = build(directory)
    seconds = time.perf_counter() - started
    record = {"meta": meta, "result": str(result.relative_to(directory)), "seconds": seconds}
    marker.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"  built {directory.name} in {seconds:.1f} s", flush=True)
    return result


def sources_data(data: Path, n: int, rows: int, **kw: Any) -> Path:
    """The index of `n` token sources holding `rows` rows, cached under `data`."""
    meta = {"version": BUILDER_VERSION, "seed": SEED, "n": n, "rows": rows, **kw}
    name = f"sources-{n}x{kw.get('files_per_source', 1)}-{rows}"
    return cached(data / name, meta, lambda d: token_sources(d, n, rows, seed=SEED, **kw))


def plan_for(index: Path, steps: int, samples: int, **kw: Any) -> Path:
    """A plan of the sources of `index` (cached next to it)."""
    root = index.parent
    meta = {"version": BUILDER_VERSION, "steps": steps, "samples": samples, **kw}
    meta["index"] = json.loads((index / "manifest.json").read_text())["fingerprint"]
    name = f"plan-{steps}x{samples}"
    return cached(
        root / name,
        meta,
        lambda d: token_plan(root, index, steps, samples, out=d / "plan.mds", **kw),
    )


# --- a. per-step overhead ------------------------------------------------------------------


class Baseline:
    """The same samples from an in-memory Table: `take` + the executor's own `pack`."""

    def __init__(self, index: Path):
        manifest = json.loads((index / "manifest.json").read_text(encoding="utf-8"))
        root = Path(manifest["root"])
        parts, rows = [], []
        for s in manifest["sources"]:
            rows.append(int(s["rows"]))
            parts += [pq.read_table(root / f["path"], columns=["tokens"]) for f in s["files"]]
        self.table = pa.concat_tables(parts).combine_chunks()  # global id = table row
        self.column = self.table.column(0)
        self.bases = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)

    def micro_batch(self, ids: np.ndarray, step: int, micro: int) -> dict[str, Any]:
        ids = ids.astype(np.int64)
        taken = self.column.take(pa.array(ids)).combine_chunks()
        offsets = taken.offsets.to_numpy()
        values = taken.values.to_numpy()
        tokens = [values[offsets[i] : offsets[i + 1]] for i in range(len(ids))]
        sid = np.searchsorted(self.bases, ids, side="right") - 1
        return pack(
            tokens,
            source=sid,
            sample_id=ids,
            row=ids - self.bases[sid],
            step=step,
            micro_batch=micro,
        )


def time_step(fn: Callable[[int], Any], step: int, micro: int) -> float:
    started = time.perf_counter()
    for m in range(micro):
        fn(step * micro + m)
    return time.perf_counter() - started


class _BaselineSteps(IterableDataset):
    """The baseline's micro-batches, dealt to DataLoader workers as PlanLoader deals ours."""

    def __init__(self, baseline: Baseline, ids: list[np.ndarray], micro: int):
        self.baseline, self.ids, self.micro = baseline, ids, micro

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for pos in range(worker, len(self.ids), workers):
            yield self.baseline.micro_batch(self.ids[pos], *divmod(pos, self.micro))


def loader_ms_per_step(ex: PlanExecutor | None, baseline: _BaselineSteps | None) -> float:
    """Steady-state ms per step through 2 DataLoader workers: the median time between the
    arrivals of consecutive steps' last micro-batches, past the first third of the plan
    (worker start-up, and for ours the workers' cold caches)."""
    if ex is not None:
        loader, last = ex.dataloader(num_workers=2, prefetch_factor=4), ex.micro_batches - 1
    else:
        assert baseline is not None
        loader = DataLoader(baseline, batch_size=None, num_workers=2, prefetch_factor=4)
        last = baseline.micro - 1
    done = [time.perf_counter()]
    for mb in loader:
        if mb["micro_batch"] == last:
            done.append(time.perf_counter())
    if ex is not None:
        ex.close()
    per_step = np.diff(done)
    return 1e3 * float(np.median(per_step[len(per_step) // 3 :]))


def step_overhead(
    plan: Path, index: Path, steps: int, cold_steps: int, loader_repeat: int
) -> dict[str, Any]:
    baseline = Baseline(index)
    ex = PlanExecutor(plan, 0)
    M = ex.micro_batches
    ids = [ex.sample_ids(*divmod(pos, M)) for pos in range(ex.total)]

    def base(pos: int) -> dict[str, Any]:
        return baseline.micro_batch(ids[pos], *divmod(pos, M))

    # correctness of the comparison: both produce the same tensors
    for pos in range(0, ex.total, max(1, ex.total // 16)):
        ours, theirs = ex.micro_batch_at(pos), base(pos)
        for key in ("input_ids", "position_ids", "cu_seqlens", "source", "row", "sample_id"):
            assert torch.equal(ours[key], theirs[key]), (pos, key)

    started = time.perf_counter()
    for pos in range(ex.total):  # first pass: fills the block cache
        ex.micro_batch_at(pos)
    first_pass = time.perf_counter() - started
    warm, base_warm = [], []
    for step in range(steps):  # second pass, ours and baseline step by step
        warm.append(time_step(ex.micro_batch_at, step, M))
        base_warm.append(time_step(base, step, M))
    cache_mb = ex._catalog.files.blocks.nbytes / MB
    ex.close()

    cold_ex = PlanExecutor(plan, 0, cache_bytes=1)
    cold, base_cold = [], []
    for step in range(cold_steps):
        cold.append(time_step(cold_ex.micro_batch_at, step, M))
        base_cold.append(time_step(base, step, M))
    cold_ex.close()

    loader = {"ours": [], "baseline": []}
    for _ in range(loader_repeat):  # alternating, so drift hits both alike
        loader["ours"].append(loader_ms_per_step(PlanExecutor(plan, 0), None))
        loader["baseline"].append(loader_ms_per_step(None, _BaselineSteps(baseline, ids, M)))
    workers2 = statistics.median(loader["ours"])
    workers2_base = statistics.median(loader["baseline"])

    med = statistics.median
    return {
        "steps_timed": steps,
        "cold_steps_timed": cold_steps,
        "plan_steps": ex.steps,
        "first_pass_ms_per_step": 1e3 * first_pass / ex.steps,
        "warm_ms": 1e3 * med(warm),
        "baseline_ms": 1e3 * med(base_warm),
        "warm_ratio": med(warm) / med(base_warm),
        "cold_ms": 1e3 * med(cold),
        "baseline_cold_ms": 1e3 * med(base_cold),
        "cold_ratio": med(cold) / med(base_cold),
        "workers2_ms": workers2,
        "workers2_baseline_ms": workers2_base,
        "workers2_ratio": workers2 / workers2_base,
        "workers2_repeat": loader_repeat,
        "workers2_runs_ms": loader,
        "cache_mb_after_warm": cache_mb,
        "rows": int(baseline.table.num_rows),
        "tokens": int(len(baseline.column.chunk(0).values)),
    }


# --- b. resume latency ---------------------------------------------------------------------


def resume_latency(plan: Path, repeat: int) -> dict[str, Any]:
    with PlanExecutor(plan, 0, verify="none") as ex:
        steps, M = ex.steps, ex.micro_batches
        chunks = len(ex._reader.chunks)
    targets = {"first": 0, "middle": steps // 2, "last": steps - 1}
    runs: dict[str, dict[str, list[float]]] = {
        k: {"construct": [], "resume": [], "seek_ids": [], "row_groups": []} for k in targets
    }
    for _ in range(repeat):
        for label, step in targets.items():  # interleaved, so drift hits every step alike
            t0 = time.perf_counter()
            ex = PlanExecutor(plan, 0, verify="none")
            t1 = time.perf_counter()
            ex.seek(step)
            mb = next(iter(ex))
            t2 = time.perf_counter()
            decoded = len(ex._catalog.files.blocks)  # row groups the first micro-batch decoded
            ex.close()
            assert mb["step"] == step and mb["micro_batch"] == 0
            runs[label]["construct"].append(t1 - t0)
            runs[label]["resume"].append(t2 - t0)
            runs[label]["row_groups"].append(decoded)
            with PlanExecutor(plan, 0, verify="none") as ex:
                t0 = time.perf_counter()
                ex.seek(step)
                ids = ex.sample_ids(step, 0)
                t1 = time.perf_counter()
            assert len(ids) > 0
            runs[label]["seek_ids"].append(t1 - t0)
    out: dict[str, Any] = {"steps": steps, "chunks": chunks, "micro_batches": M, "repeat": repeat}
    for label, step in targets.items():
        out[label] = {"step": step}
        times = {k: v for k, v in runs[label].items() if k != "row_groups"}
        out[label].update({f"{k}_ms": 1e3 * statistics.median(v) for k, v in times.items()})
        out[label]["row_groups"] = statistics.median(runs[label]["row_groups"])
    out["plan_bytes"] = plan.stat().st_size
    return out


# --- c. RSS vs sources ---------------------------------------------------------------------


def rss_vs_sources(data: Path, counts: tuple[int, ...], rows: int, steps: int) -> list[dict]:
    out = []
    for n in counts:
        index = sources_data(data, n, rows)
        plan = plan_for(index, steps, SAMPLES_PER_STEP)
        r = replay_in_child(plan)
        r.update(sources=n, rows=rows, steps=steps)
        out.append(r)
        print(
            f"  {n:5d} sources: peak {r['peak_rss'] / MB:.1f} MB, "
            f"net {(r['peak_rss'] - r['after_import_rss']) / MB:.1f} MB, {r['seconds']:.1f} s",
            flush=True,
        )
    one = out[0]
    for r in out:
        r["net_rss"] = r["peak_rss"] - r["after_import_rss"]
        r["peak_ratio"] = r["peak_rss"] / one["peak_rss"]
        r["net_ratio"] = r["net_rss"] / max(1, one["peak_rss"] - one["after_import_rss"])
    return out


# --- report --------------------------------------------------------------------------------


def markdown(res: dict[str, Any]) -> str:
    a, b, c, info = res["step"], res["resume"], res["rss"], res["info"]
    lines = [
        f"# mds executor benchmark{' (--quick)' if info['quick'] else ''}",
        "",
        f"## a. Per-step cost: {SAMPLES_PER_STEP} samples/step, dp 1, {MICRO_BATCHES} "
        f"micro-batches, {a['rows']:,} rows in {STEP_SOURCES * STEP_FILES_PER_SOURCE} Parquet "
        f"files ({ROW_GROUP:,}-row row groups), random access",
        "",
        "| case | ms/step (median) | baseline ms/step | ours / baseline |",
        "|---|---:|---:|---:|",
        f"| warm (second pass, {a['cache_mb_after_warm']:.0f} MB of row groups cached) | "
        f"{a['warm_ms']:.2f} | {a['baseline_ms']:.2f} | {a['warm_ratio']:.2f}x |",
        f"| `cache_bytes=1` (every row group decoded again) | {a['cold_ms']:.2f} | "
        f"{a['baseline_cold_ms']:.2f} | {a['cold_ratio']:.2f}x |",
        f"| `dataloader(num_workers=2)`, steady state | {a['workers2_ms']:.2f} | "
        f"{a['workers2_baseline_ms']:.2f} | {a['workers2_ratio']:.2f}x |",
        "",
        f"Warm: {a['steps_timed']} steps, cold: {a['cold_steps_timed']} steps, each step timed "
        "for ours and then the baseline in the same loop. Baseline: `Table.take(ids)` on the "
        "whole data in memory, then the executor's own `pack` into tensors. Workers: median "
        f"of {a['workers2_repeat']} runs of each (alternating) of the time between the "
        "arrivals of consecutive steps' last micro-batches over the last two thirds of the "
        f"{a['plan_steps']}-step plan; the baseline row there is the in-memory baseline behind "
        "the same DataLoader (2 workers, micro-batches dealt round-robin as PlanLoader deals "
        "them), so the ratio excludes torch's inter-process cost. First pass (cache filling): "
        f"{a['first_pass_ms_per_step']:.2f} ms/step.",
        "",
        f"## b. Resume latency: plan of {b['steps']:,} steps ({b['chunks']} chunks, "
        f"{b['plan_bytes'] / MB:.1f} MB), median of {b['repeat']}",
        "",
        "| position | step | construct ms | construct + seek + first micro-batch ms | "
        "row groups decoded | seek + sample_ids ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label in ("first", "middle", "last"):
        r = b[label]
        lines.append(
            f"| {label} | {r['step']:,} | {r['construct_ms']:.2f} | {r['resume_ms']:.2f} | "
            f"{r['row_groups']:g} | {r['seek_ids_ms']:.3f} |"
        )
    lines += [
        "",
        'Construction is `PlanExecutor(plan, 0, verify="none")`; the first micro-batch opens '
        "the Parquet files it needs, reads the n_tokens column of their sources' index tables "
        "and decodes the row groups holding its samples (the count differs by position, not "
        "with it). `seek + sample_ids` runs on a freshly constructed executor (no chunk "
        "cached): the plan side of a resume alone.",
        "",
        f"## c. Peak RSS replaying a whole plan vs number of sources ({c[0]['rows']:,} rows, "
        f"{c[0]['steps']} steps x {SAMPLES_PER_STEP} samples)",
        "",
        "| sources | peak RSS MB | after import MB | net MB | peak / 1 source | "
        "net / 1 source | sources touched | max fds | replay s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in c:
        lines.append(
            f"| {r['sources']:,} | {r['peak_rss'] / MB:.1f} | {r['after_import_rss'] / MB:.1f} | "
            f"{r['net_rss'] / MB:.1f} | {r['peak_ratio']:.2f} | {r['net_ratio']:.2f} | "
            f"{r['sources_touched']:,} | {r['max_fds']} | {r['seconds']:.2f} |"
        )
    lines += [
        "",
        "Each replay runs in a fresh interpreter that reports its own VmHWM; `after import` is "
        "its RSS after `import torch, mds.executor`, `net` the difference. Default "
        "`max_open_files=64`, `cache_bytes=256 MiB`; `max fds` counts /proc/self/fd during the "
        f"replay ({c[0]['after_import_fds']} before it).",
        "",
        f"- {info['platform']}, {info['cpus']} CPUs; torch {info['torch']}, pyarrow "
        f"{info['pyarrow']}, numpy {info['numpy']}. Total run {info['seconds']:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "build/bench", help="results directory")
    parser.add_argument(
        "--data", type=Path, default=REPO / "build/bench-data/executor", help="data cache"
    )
    parser.add_argument("--quick", action="store_true", help="fewer steps, no 2000 sources")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    data, out = args.data.resolve(), args.out.resolve()
    data.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    quick = args.quick

    print("a. per-step overhead", flush=True)
    index = sources_data(
        data,
        STEP_SOURCES,
        STEP_ROWS,
        files_per_source=STEP_FILES_PER_SOURCE,
        row_group_size=ROW_GROUP,
    )
    plan_steps = 120 if quick else 300
    plan = plan_for(index, plan_steps, SAMPLES_PER_STEP, micro_batches=MICRO_BATCHES)
    step = step_overhead(
        plan,
        index,
        steps=plan_steps,
        cold_steps=10 if quick else 30,
        loader_repeat=2 if quick else 3,
    )

    print("b. resume latency", flush=True)
    long_plan = plan_for(index, RESUME_STEPS, RESUME_SAMPLES, micro_batches=MICRO_BATCHES)
    resume = resume_latency(long_plan, repeat=5 if quick else 15)

    print("c. RSS vs sources", flush=True)
    counts = RSS_SOURCES[:-1] if quick else RSS_SOURCES
    rss = rss_vs_sources(data, counts, rows=30_000 if quick else 60_000, steps=200)

    info = {
        "quick": quick,
        "cpus": os.cpu_count(),
        "platform": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "torch": torch.__version__,
        "pyarrow": pa.__version__,
        "numpy": np.__version__,
        "data": str(data),
        "seconds": time.perf_counter() - started,
    }
    results = {"info": info, "step": step, "resume": resume, "rss": rss}
    table = markdown(results)
    write_report(out, "executor", table, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
