"""Memory and start-up of one rank: mds against Mosaic streaming on the same samples in the
same order, for a few corpus shapes, in-process and with 2 DataLoader workers.

Cases (one Parquet file per source, token lists of 64 to 511 int32 ids, 64 samples a step):
  a: 64 sources x 32,768 rows, one row group per file (~8M ids, ~32 MB a file)
  b: 64 sources x 2,048 rows
  c: 1024 sources x 2,048 rows
Every cell is the median of `--repeat` fresh child processes, mds and Mosaic runs
alternating, each after every file of the case was read once (from the page cache; with
`--cold`, after every file was dropped from it instead, as far as an unprivileged process
can: `posix_fadvise(DONTNEED)`, so the first reads come from disk): peak
RSS above the imports (main process; with workers, the workers' anonymous RSS above the
parent's at the imports, sampled every 16 steps, its largest sum, reported separately), construction time, the first 16 steps, and the
steady ms/step of the steps after them. The data, plans and Mosaic shards are made by
bench_peers.py's builders under build/bench-data/memory/.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_peers import (  # noqa: E402
    SAMPLES,
    make_data,
    median,
    mosaic_batches,
    mosaic_dataset,
    mosaic_steps,
    peer_venv,
    plan_order,
    run_child,
    warm,
)
from report import proc_status_mb, write_report  # noqa: E402

CASES = {"a": (64, 32_768), "b": (64, 2_048), "c": (1024, 2_048)}
FIRST = 16  # steps counted as start-up
SLACK_MB = 32  # what the target allows above the budget
KEYS = ("start_ms", "first16_ms", "step_ms", "cpu_ms", "rss_mb", "file_mb", "workers_rss_mb")


# --- children ---------------------------------------------------------------------------


def cold(root: Path) -> None:
    """Drop every file of a data set from the page cache (the clean pages the kernel lets
    go of on `POSIX_FADV_DONTNEED`), so a run reads them from disk."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def status_mb(path: Path, field: str) -> int:
    """A field (VmHWM, RssAnon) of a process's status file in MB; 0 if it is gone."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def workers_anon_mb(base_anon_mb: int) -> int:
    """The anonymous RSS of this process's children (DataLoader workers) above `base_anon_mb`,
    the parent's at the imports, summed: what the workers hold of their own (pages they
    inherited are counted in both until written). VmHWM does not serve: a forked worker's
    RSS starts without the parent's file-backed pages."""
    me, total = str(os.getpid()), 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[1] != me:
                continue
        except (OSError, IndexError):
            continue
        total += max(0, status_mb(stat.parent / "status", "RssAnon") - base_anon_mb)
    return total


def measure(make_iter, steps: int, base_mb: int, workers: int) -> dict:
    """Construction (`make_iter()`), the first FIRST steps, then `steps` more (mean ms, wall
    and this process's CPU). With workers, their anonymous RSS is sampled every FIRST steps
    (outside the timing)."""
    me = Path("/proc/self/status")
    base_anon, base_file = status_mb(me, "RssAnon"), status_mb(me, "RssFile")
    workers_mb = 0
    t0 = time.perf_counter()
    it = make_iter()
    t1 = time.perf_counter()
    for _ in range(FIRST):
        next(it)
    t2, c2 = time.perf_counter(), time.process_time()
    spent = spent_cpu = 0.0
    for k in range(steps):
        next(it)
        if workers and k % FIRST == 0:
            t, c = time.perf_counter(), time.process_time()
            workers_mb = max(workers_mb, workers_anon_mb(base_anon))
            spent += time.perf_counter() - t
            spent_cpu += time.process_time() - c
    t3, c3 = time.perf_counter(), time.process_time()
    out = {
        "start_ms": 1000 * (t1 - t0),
        "first16_ms": 1000 * (t2 - t1),
        "step_ms": 1000 * (t3 - t2 - spent) / steps,
        # this process's CPU a steady step (with workers, theirs is not counted)
        "cpu_ms": 1000 * (c3 - c2 - spent_cpu) / steps,
        "rss_mb": proc_status_mb("VmHWM") - base_mb,
        # of it, library code and data files mapped since the imports (clean pages, shared,
        # whose count depends on what the page cache holds of them), at the end
        "file_mb": status_mb(me, "RssFile") - base_file,
    }
    if workers:
        out["workers_rss_mb"] = max(workers_mb, workers_anon_mb(base_anon))
    return out


def executor_kwargs(budget: int | None) -> dict:
    """`memory_bytes=budget` where PlanExecutor takes it, else `cache_bytes=budget`."""
    if budget is None:
        return {}
    from mds.executor import PlanExecutor

    params = inspect.signature(PlanExecutor.__init__).parameters
    return {"memory_bytes" if "memory_bytes" in params else "cache_bytes": budget}


def default_budget() -> int:
    """The executor's own default of the parameter `--budget` sets."""
    from mds.executor import PlanExecutor

    params = inspect.signature(PlanExecutor.__init__).parameters
    default = (params.get("memory_bytes") or params["cache_bytes"]).default
    if default is None:  # worked out from the other: the executor's own default
        from mds.executor.catalog.budget import DEFAULT_MEMORY

        return DEFAULT_MEMORY
    return default


def child_mds(plan: Path, workers: int, steps: int, budget: int | None) -> dict:
    import torch  # noqa: F401

    from mds.executor import PlanExecutor

    kwargs = executor_kwargs(budget)
    base = proc_status_mb("VmRSS")

    def make_iter():
        ex = PlanExecutor(plan, 0, verify="none", **kwargs)
        return iter(ex.dataloader(num_workers=workers) if workers else ex)

    return measure(make_iter, steps, base, workers)


def child_mosaic(plan: Path, workers: int, steps: int, rows: int) -> dict:
    import streaming  # noqa: F401
    import torch  # noqa: F401

    batches = mosaic_batches(plan, rows)  # the benchmark's, not Mosaic's: before the base
    base = proc_status_mb("VmRSS")

    def make_iter():
        return mosaic_steps(mosaic_dataset(plan, rows), batches, workers)

    return measure(make_iter, steps, base, workers)


# --- driver -----------------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1].startswith("--child-"):
        import json

        what, plan = sys.argv[1], Path(sys.argv[2])
        workers, steps, extra = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        if what == "--child-mds":
            result = child_mds(plan, workers, steps, None if extra == "-" else int(extra))
        else:
            result = child_mosaic(plan, workers, steps, int(extra))
        print(json.dumps(result))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/bench"))
    ap.add_argument("--data", type=Path, default=Path("build/bench-data/memory"))
    ap.add_argument("--cases", default="abc", help="which of a, b, c (default: all)")
    ap.add_argument("--steps", type=int, default=512, help="steady steps timed after the first 16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="*", default=[0, 2])
    ap.add_argument("--budget", type=int, default=None, help="memory_bytes (or cache_bytes)")
    ap.add_argument("--no-peer", action="store_true", help="measure mds alone")
    ap.add_argument("--quick", action="store_true", help="cases b and c, 128 steps, 1 run")
    ap.add_argument("--cold", action="store_true", help="drop the files from the page cache")
    a = ap.parse_args()
    if a.quick:
        a.cases, a.steps, a.repeat = "bc", 128, 1
    peer, peer_note = (None, "not asked for") if a.no_peer else peer_venv(a.out)
    budget = a.budget if a.budget is not None else default_budget()
    rows_out = []
    for case in a.cases:
        n, rows = CASES[case]
        root = (a.data / f"{case}-n{n}-r{rows}").resolve()
        # the plan covers a pass over the data, as a training plan would: one that ended
        # right after the timed steps would tell the executor that little is asked again
        steps = max(FIRST + a.steps + 1, n * rows // SAMPLES)
        plan = make_data(root, n, steps, sys.executable, rows=rows)
        plan_order(plan, FIRST + a.steps + 1)
        if peer and not (root / "mosaic").exists():
            run_child(peer, ["--child-write-mosaic", str(root)])
        extra = "-" if a.budget is None else str(a.budget)
        for workers in a.workers:
            row: dict = {"case": case + (" cold" if a.cold else ""), "sources": n}
            row.update({"rows": rows, "workers": workers})
            runs: dict[str, list[dict]] = {"mds": [], "mosaic": []}
            prepare = cold if a.cold else warm
            for _ in range(a.repeat):  # alternating, so drift hits both sides alike
                prepare(root)
                args = [str(plan), str(workers), str(a.steps)]
                runs["mds"].append(run_child(sys.executable, ["--child-mds", *args, extra], __file__))
                if peer:
                    prepare(root)
                    runs["mosaic"].append(
                        run_child(peer, ["--child-mosaic", *args, str(rows)], __file__)
                    )
            row.update({k: median(v, KEYS) for k, v in runs.items() if v})
            rows_out.append(row)
            print(row, flush=True)
    data = {"rows": rows_out, "peer": peer_note, "budget": budget, "steps": a.steps}
    write_report(a.out, "memory", table(rows_out, peer_note, budget, a), data)


def table(rows: list[dict], peer_note: str, budget: int, a) -> str:
    def cell(r: dict, side: str, key: str, spec: str) -> str:
        v = r.get(side, {})
        return v.get("error", "-")[:50] if key not in v else format(v[key], spec)

    target = budget / 2**20 + SLACK_MB
    head = (
        f"# One rank's memory and start-up: mds against Mosaic streaming ({peer_note})\n\n"
        f"64 samples per step, median of {a.repeat} runs. RSS: peak MB above the imports, "
        "main process; `wRSS`: the DataLoader workers' anonymous RSS above the parent's at "
        f"the imports, summed, the largest of samples every {FIRST} steps. "
        f"`start`: construction ms; `first16`: the first {FIRST} steps, ms; `ms/step`: mean of "
        f"the {a.steps} steps after them. Budget {budget / 2**20:.0f} MiB: target RSS <= "
        f"{target:.0f} MB.\n\n"
        "| case | sources x rows | W | mds RSS | mds wRSS | Mosaic RSS | Mosaic wRSS | mds start "
        "| mds first16 | Mosaic start | Mosaic first16 | mds ms/step | Mosaic ms/step |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = [
        f"| {r['case']} | {r['sources']} x {r['rows']} | {r['workers']} "
        f"| {cell(r, 'mds', 'rss_mb', '.0f')} | {cell(r, 'mds', 'workers_rss_mb', '.0f')} "
        f"| {cell(r, 'mosaic', 'rss_mb', '.0f')} | {cell(r, 'mosaic', 'workers_rss_mb', '.0f')} "
        f"| {cell(r, 'mds', 'start_ms', '.0f')} | {cell(r, 'mds', 'first16_ms', '.0f')} "
        f"| {cell(r, 'mosaic', 'start_ms', '.0f')} | {cell(r, 'mosaic', 'first16_ms', '.0f')} "
        f"| {cell(r, 'mds', 'step_ms', '.2f')} | {cell(r, 'mosaic', 'step_ms', '.2f')} |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
