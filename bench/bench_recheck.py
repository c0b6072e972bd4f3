"""What the executor's data-change checks cost at 1024 sources: the re-checks of files already
checked (`MDS_RECHECK=0` turns them off, for this comparison only), and the content check of
each file on first use when the data root is relocated.

The data and plan are bench_peers.py's (N Parquet sources of 400 token-list rows, 64 samples
per step, dp 1, one micro-batch), built once under `--data`. Every measurement is a fresh
child process replaying the plan with the default `verify="stat"`, after every file was read
(from the page cache); the two sides of each comparison alternate, and the table shows the
median of `--repeat` runs of each.

  a. ms per step with re-checks on and off, in one child process and one executor (two
     executors in one process differ by up to 10% in an A/A run, whichever is made first
     being slower): a first pass checks and pins every file, then eight passes over steps
     1..`--steps` alternate on and off (on, off, off, on, twice), "off" with the pins put
     aside, which is what `MDS_RECHECK=0` does. Each step is built on the calling thread
     (`read_ahead=0, read_threads=1`: what a step costs to build, checks included, no
     thread to hide it). The median and the mean of the step times per side, then the
     median over `--repeat` children.
  b. first use after a relocation: the seconds the first `--steps` steps take from
     construction (every file's first check falls in them: stat and pin, and under a
     relocated root the sampled content fingerprint as well), with `data_root=` the indexed
     root against `data_root=` a copy of it (hard links: the same bytes, another place).

Results go to `<out>/recheck.md` (the table, also printed) and `<out>/recheck.json`.

Usage: python bench/bench_recheck.py [--out build/bench] [--quick]
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
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_peers import SAMPLES, make_data, step_times, warm  # noqa: E402
from report import write_report  # noqa: E402


def child_recheck(plan: Path, steps: int) -> dict:
    from mds.executor import PlanExecutor

    os.environ.pop("MDS_RECHECK", None)
    ex = PlanExecutor(plan, 0, read_ahead=0, read_threads=1)
    for pos in range(steps + 1):  # every file checked (and pinned) once, as in a long run
        ex.compact_at(pos)
    checks = ex._catalog.checks
    pinned = checks.pins
    times: dict[str, list[float]] = {"on": [], "off": []}
    for side in ("on", "off", "off", "on") * 2:  # ABBA: a drifting machine drifts for both
        # without pins the executor re-checks nothing, as under MDS_RECHECK=0
        checks.pins = pinned if side == "on" else {}
        ex.seek(1)
        for pos in range(1, steps + 1):
            t = time.perf_counter()
            ex.compact_at(pos)
            times[side].append(time.perf_counter() - t)
    out = {
        f"{name}_{what}": 1000 * fn(got)
        for name, got in times.items()
        for what, fn in (("median_ms", statistics.median), ("mean_ms", statistics.mean))
    }
    # The same cost worked out from its parts, steadier than the difference of two noisy
    # timings: re-checks per step (one more pass, counted) times the cost of one.
    calls = [0]
    recheck = checks.recheck

    def counted(*args: Any, **kwargs: Any) -> None:
        calls[0] += 1
        recheck(*args, **kwargs)

    checks.recheck = counted  # type: ignore[method-assign]
    ex.seek(1)
    for pos in range(1, steps + 1):
        ex.compact_at(pos)
    checks.recheck = recheck  # type: ignore[method-assign]
    files, plan = ex._catalog.files, ex._catalog.plan
    key, (reader, _n) = next(iter(files._files._entries.items()))
    source, entry = plan.sources[key[0]], plan.records[key]
    n = 2000
    best = min(timeit.repeat(lambda: recheck(source, key[1], entry, reader), number=n, repeat=7))
    out["rechecks_per_step"] = calls[0] / steps
    out["recheck_us"] = 1e6 * best / n
    return out


def child(plan: Path, steps: int, data_root: str) -> dict:
    from mds.executor import PlanExecutor

    t = time.perf_counter()
    ex = PlanExecutor(plan, 0, data_root=data_root, read_ahead=0, read_threads=1)
    start = time.perf_counter() - t
    it = iter(ex)
    times = step_times(it, steps)
    times["first_use_s"] = start + (times["first_ms"] + times["step_ms"] * steps) / 1000
    times["relocated"] = ex._catalog.plan.relocated
    ex.close()
    return times


def run_child(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent)}
    env.pop("MDS_DATA_ROOT", None)
    env.pop("MDS_RECHECK", None)
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError((out.stderr.strip().splitlines() or ["failed"])[-1][:300])
    return json.loads(lines[-1])


def linked_copy(root: Path, copy: Path) -> Path:
    """The data set's sources at another root, as hard links (same bytes, no disk used)."""
    if not (copy / "src").is_dir():
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(root / "src", copy / "src", copy_function=os.link)
    return copy


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4])))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child-recheck":
        print(json.dumps(child_recheck(Path(sys.argv[2]), int(sys.argv[3]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/bench"))
    ap.add_argument("--data", type=Path, default=Path("build/bench-data/peers"))
    ap.add_argument("--sources", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=512, help="steps timed per run")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="256 sources, 128 steps, 3 runs")
    a = ap.parse_args()
    if a.quick:
        a.sources, a.steps, a.repeat = 256, 128, 3
    root = (a.data / f"n{a.sources}").resolve()
    plan = make_data(root, a.sources, a.steps + 2, sys.executable)
    copy = linked_copy(root, root.with_name(root.name + "-relocated"))
    sides = {"indexed root": root, "relocated root": copy}
    runs: dict[str, list[dict]] = {k: [] for k in sides}
    rechecks = []
    for _ in range(a.repeat):
        warm(root)
        rechecks.append(run_child("--child-recheck", str(plan), str(a.steps)))
        for label, data_root in sides.items():  # alternating, one of each a round
            warm(root)
            runs[label].append(run_child("--child", str(plan), str(a.steps), str(data_root)))
    assert all(r["relocated"] for r in runs["relocated root"])
    assert not any(r["relocated"] for r in runs["indexed root"])
    result = {
        label: {
            k: statistics.median(r[k] for r in got)
            for k in ("first_ms", "step_ms", "median_ms", "first_use_s")
        }
        for label, got in runs.items()
    }
    result["rechecks"] = {k: statistics.median(r[k] for r in rechecks) for k in rechecks[0]}
    files = sum(1 for _ in (root / "src").glob("*.parquet"))
    data = {"sources": a.sources, "files": files, "steps": a.steps, "repeat": a.repeat}
    raw = {"first_use": runs, "rechecks": rechecks}
    write_report(a.out, "recheck", table(result, data), {**data, "medians": result, "runs": raw})


def table(r: dict, d: dict) -> str:
    c = r["rechecks"]
    per_step = c["rechecks_per_step"] * c["recheck_us"] / 1000
    moved, home = r["relocated root"], r["indexed root"]
    extra = moved["first_use_s"] - home["first_use_s"]

    def pct(a: float, b: float) -> str:
        return f"{100 * (a / b - 1):+.1f}%"

    return "\n".join(
        [
            f"Data-change checks, {d['sources']} sources ({d['files']} Parquet files), "
            f"{SAMPLES} samples per step, {d['steps']} steps, median of {d['repeat']} runs",
            "",
            "| re-checks (passes alternating in one process) | median ms/step | mean ms/step |",
            "|---|---:|---:|",
            f"| on (default) | {c['on_median_ms']:.3f} | {c['on_mean_ms']:.3f} |",
            f"| off (MDS_RECHECK=0) | {c['off_median_ms']:.3f} | {c['off_mean_ms']:.3f} |",
            f"| overhead | {pct(c['on_median_ms'], c['off_median_ms'])} | "
            f"{pct(c['on_mean_ms'], c['off_mean_ms'])} |",
            "",
            f"From its parts: {c['rechecks_per_step']:.2f} re-checks per step (an `fstat` "
            f"each) x {c['recheck_us']:.2f} us = {per_step:.4f} ms per step, "
            f"{100 * per_step / c['off_mean_ms']:.2f}% of the mean step with them off.",
            "",
            "| data root (alternating processes) | s to construct + first steps | first step ms |",
            "|---|---:|---:|",
            f"| indexed root | {home['first_use_s']:.2f} | {home['first_ms']:.1f} |",
            f"| relocated root (content checked) | {moved['first_use_s']:.2f} | "
            f"{moved['first_ms']:.1f} |",
            f"| extra per file | {1000 * extra / max(1, d['files']):.2f} ms | |",
            "",
        ]
    )


if __name__ == "__main__":
    main()
