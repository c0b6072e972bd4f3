"""Benchmark online mixing: the time to plan one window of W steps against the time the
window trains, and the executor's wait at window boundaries.

A synthetic index that costs no disk (four sparse Megatron datasets, tests/scale_corpus.py,
2M rows each, 64..448 tokens per row) is mixed online by DoReMi in windows of W = 1000
steps for D = 64 DP ranks x 512 samples per step (2 micro-batches per rank). The cost model
is calibrated first, as `mds calibrate` does, on a small GPT on CPU (the built-in packed
model; layers 2, hidden 128): a window's training time is its predicted time, the sum over
its steps of the slowest rank's predicted time (calibrated a, b, d per sample plus c per
micro-batch).

Measured side by side in one run:

- planning a window: `mds plan CONFIG --segment K` in a fresh process, as the executor's
  planning subprocess runs it (interpreter, imports, index, the re-plan of one window);
  medians over repeats, for window 1 (from the config's weights) and window 2 (from the
  policy's), and the same plans in-process (`plan_segment`, no start-up);
- the ratio of planning to the window's predicted training time (the goal: under 10%);
- the training path: DP rank 0's `OnlineExecutor` iterates three windows while a loop
  "trains" each step by sleeping its predicted time (x --time-scale) and reports losses;
  the wait is the time from asking for a window's first micro-batch to getting it, set
  beside the median time of any other micro-batch. Segments are planned by the executor's
  subprocess in the background, so the boundary waits only if planning outlasted a window.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from report import write_report  # noqa: E402
from scale_corpus import write_sparse_megatron  # noqa: E402

SOURCES = ("web", "code", "books", "math")
ROWS = 2_000_000  # per source
DP, WINDOW, SAMPLES, MICRO = 64, 1000, 512, 2
CAPACITY = 4096
SHAPE = {"layers": 2, "hidden": 128, "heads": 4, "vocab": 512}
CAL_LENGTHS = (64, 128, 256, 448, 1024)
DATA_VERSION = 1
REFERENCE = {"web": 3.0, "code": 2.0, "books": 3.5, "math": 2.5}
LOSS = {"web": 3.2, "code": 2.6, "books": 3.4, "math": 3.1}  # what the loop reports


def make_data(root: Path) -> Path:
    """The four sparse Megatron sources and their index (cached by version)."""
    marker = root / "meta.json"
    meta = {"rows": ROWS, "sources": SOURCES, "version": DATA_VERSION}
    index = root / "index"
    if marker.exists() and json.loads(marker.read_text()) == meta and (index / "manifest.json").exists():
        return index
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for name in SOURCES:
        write_sparse_megatron(root / name / "data", ROWS)
    (root / "index.toml").write_text(
        '[index]\noutput = "index"\n\n'
        + "".join(f'[[source]]\nname = "{s}"\npath = "{s}/data"\n\n' for s in SOURCES),
        encoding="utf-8",
    )
    from mds.planner.index.build import build_index
    from mds.planner.index.config import load_config

    build_index(load_config(root / "index.toml"), index)
    marker.write_text(json.dumps(meta))
    return index


def calibrate(repeats: int) -> dict:
    """The calibrated cost of the small GPT on this CPU (what `mds calibrate` records)."""
    import torch

    from mds.planner.calibrate import fit as cal
    from mds.planner.calibrate.packed_gpt import GptShape, build_packed_gpt

    torch.set_num_threads(1)
    model = build_packed_gpt(GptShape(**SHAPE), seed=0)
    grid = cal.calibration_grid(CAL_LENGTHS, CAPACITY // 2, mixed=4, seed=0)
    seconds = cal.time_grid(model, grid, vocab=SHAPE["vocab"], repeats=repeats, warmup=1,
                            seed=0, device="cpu", clock="cpu", statistic=min)  # fmt: skip
    fit = cal.fit_cost(grid, seconds)
    return {"source": "calibrated", "a": fit.a, "b": fit.b, "c": fit.c, "d": fit.d,
            "fit_error": fit.fit_error()}  # fmt: skip


def write_config(root: Path, index: Path, cost: dict, windows: int) -> Path:
    """The online config: equal weights, DoReMi every WINDOW steps, the calibrated cost."""
    ref = ", ".join(f"{s} = {REFERENCE[s]}" for s in SOURCES)
    coeffs = "\n".join(f"{k} = {cost[k]!r}" for k in ("a", "b", "c", "d"))
    config = root / "online.toml"
    config.write_text(
        f'[plan]\nindex = "{index.resolve()}"\n\n'
        + "".join(f'[[source]]\nname = "{s}"\npath = "{s}/data"\nweight = 1.0\n\n' for s in SOURCES)
        + f"[train]\nsteps = {windows * WINDOW}\ndp_size = {DP}\nmicro_batches = {MICRO}\n"
        f"samples_per_step = {SAMPLES}\nmax_tokens_per_micro_batch = {CAPACITY}\nseed = 1\n\n"
        f"[cost]\n{coeffs}\n\n"
        f'[mixing]\nonline = {{ policy = "doremi", window = {WINDOW}, reference = {{ {ref} }} }}\n',
        encoding="utf-8",
    )
    return config


def predicted_seconds(plan: Path) -> list[float]:
    """Per step of the segment: the slowest rank's predicted time (cost units back to
    seconds, plus c per micro-batch)."""
    from mds.core.planfile_reader import PlanReader
    from mds.planner.report.plan import step_stats

    with PlanReader(plan) as reader:
        scale = float(reader.footer["cost_scale"])
        c = float(reader.footer["config"]["cost"].get("c") or 0.0)
        worst = step_stats(reader)["max_rank_cost"]
        micro = reader.micro
    return [float(x) / scale + c * micro for x in worst]


def fake_log(plan_id: str, windows: int):
    from mds.core.signal_log import SignalLog, window_signal

    log = SignalLog(plan_id, SOURCES, WINDOW)
    for k in range(windows):
        loss = [LOSS[s] * 1000 for s in SOURCES]
        log.append(window_signal(k, k * WINDOW, (k + 1) * WINDOW, loss, [1000] * len(SOURCES)))
    return log


def time_planning(config: Path, run: Path, repeats: int) -> dict:
    """Seconds to plan windows 1 and 2: `mds plan --segment K` in a fresh process (what the
    executor starts) and `plan_segment` in-process; medians over `repeats`."""
    from mds.planner.plan.config import load_plan_config
    from mds.planner.plan.segment import plan_segment

    plan = run / "plan.mds"
    cfg = load_plan_config(config)
    t = time.perf_counter()
    first = plan_segment(cfg, plan, 0)
    segment0 = time.perf_counter() - t
    log = fake_log(first.plan_id, 1)
    signals = run / "bench.signals.json"
    log.write(signals)
    out: dict = {"segment0_in_process": segment0, "subprocess": {}, "in_process": {}}
    for k in (1, 2):
        cli, inproc = [], []
        for _ in range(repeats):
            cmd = [sys.executable, "-m", "mds", "plan", str(config), "-o", str(plan),
                   "--segment", str(k), "--signals", str(signals), "--json"]  # fmt: skip
            t = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            cli.append(time.perf_counter() - t)
            t = time.perf_counter()
            plan_segment(cfg, plan, k, log)
            inproc.append(time.perf_counter() - t)
        out["subprocess"][k] = statistics.median(cli)
        out["in_process"][k] = statistics.median(inproc)
    out["window_train"] = {k: sum(predicted_seconds(run / f"plan.w{k:05d}.mds")) for k in (1, 2)}
    out["window_train"][0] = sum(predicted_seconds(plan))
    return out


def time_training_path(config: Path, run: Path, windows: int, scale: float) -> dict:
    """Rank 0's OnlineExecutor over `windows` windows, each step slept for its predicted
    time x `scale`: the wait for each window's first micro-batch and the median of the rest."""
    from mds.core.segments import segment_path
    from mds.executor import OnlineExecutor

    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    from mds.planner.plan.config import load_plan_config
    from mds.planner.plan.segment import plan_segment

    plan = run / "plan.mds"
    plan_segment(load_plan_config(config), plan, 0)
    sleeps: list[float] = []
    waits: dict[int, float] = {}
    planning_at: dict[int, int | None] = {}
    others: list[float] = []
    trained = 0.0
    with OnlineExecutor(plan, 0, dp_size=DP, config=config) as ex:
        names = ex.batch_source_names
        it = iter(ex)
        while True:
            t = time.perf_counter()
            mb = next(it, None)
            got = time.perf_counter() - t
            if mb is None:
                break
            step = mb["step"]
            if step % WINDOW == 0 and mb["micro_batch"] == 0 and step:
                waits[step // WINDOW] = got
            else:
                others.append(got)
            if mb["micro_batch"] == 0 and step % WINDOW == 0:
                window = segment_path(plan, step // WINDOW)
                sleeps = [s * scale for s in predicted_seconds(window)]
                planning_at[step // WINDOW] = ex.planning_window
            if mb["micro_batch"] == ex.micro_batches - 1:
                nap = sleeps[step % WINDOW]
                time.sleep(nap)
                trained += nap
                used = {names[i] for i in mb["source"].tolist()}
                ex.report(step, {n: LOSS[n] for n in used}, dict.fromkeys(used, 1))
    return {"waits": waits, "median_other": statistics.median(others), "trained": trained,
            "planning_at_window_start": planning_at}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/bench"))
    ap.add_argument("--data", type=Path, default=Path("build/bench-data/online"))
    ap.add_argument("--repeats", type=int, default=3, help="plans timed per window (median)")
    ap.add_argument("--cal-repeats", type=int, default=3, help="timed rounds per calibration point")
    ap.add_argument("--windows", type=int, default=3, help="windows the training path runs (>= 3)")
    ap.add_argument("--time-scale", type=float, default=0.25,
                    help="the training path sleeps this times each step's predicted time")  # fmt: skip
    args = ap.parse_args()
    if args.windows < 3:
        ap.error("--windows must be >= 3 (windows 1 and 2 are timed)")

    index = make_data(args.data)
    t = time.perf_counter()
    cost = calibrate(args.cal_repeats)
    print(f"calibrated in {time.perf_counter() - t:.0f}s: a={cost['a']:.4g} b={cost['b']:.4g} "
          f"c={cost['c']:.4g} d={cost['d']:.4g}", file=sys.stderr)  # fmt: skip
    config = write_config(args.data, index, cost, args.windows)
    work = args.data / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    (work / "plans").mkdir()
    planning = time_planning(config, work / "plans", args.repeats)
    print(f"planning: {planning}", file=sys.stderr)
    path = time_training_path(config, work / "run", args.windows, args.time_scale)
    print(f"training path: {path}", file=sys.stderr)
    table = render(planning, path, cost, args)
    write_report(args.out, "bench_online", table, {
        "dp": DP, "window": WINDOW, "samples_per_step": SAMPLES, "micro_batches": MICRO,
        "rows_per_source": ROWS, "sources": len(SOURCES), "cost": cost, "planning": planning,
        "training_path": path, "time_scale": args.time_scale,
    })  # fmt: skip


def render(planning: dict, path: dict, cost: dict, args) -> str:
    rows = [
        "## Online mixing: planning a window vs training it",
        "",
        f"D = {DP} DP ranks x {SAMPLES} samples per step, {MICRO} micro-batches, windows of "
        f"{WINDOW} steps; {len(SOURCES)} sparse Megatron sources of {ROWS:,} rows; cost "
        f"calibrated on a small GPT on CPU (a = {cost['a']:.3g}, b = {cost['b']:.3g}, "
        f"c = {cost['c']:.3g}, d = {cost['d']:.3g}; fit error median "
        f"{cost['fit_error']['median']:.1%}).",
        "",
        "| window | plan (subprocess) s | plan (in-process) s | window trains (predicted) s | plan / train |",
        "|---|---|---|---|---|",
    ]
    for k in (1, 2):
        sub, inproc = planning["subprocess"][k], planning["in_process"][k]
        train = planning["window_train"][k]
        rows.append(f"| {k} | {sub:.2f} | {inproc:.2f} | {train:.1f} | {sub / train:.1%} |")
    rows += [
        "",
        f"Training path (rank 0's OnlineExecutor, steps slept for their predicted time x "
        f"{args.time_scale:g}, {path['trained']:.0f} s trained):",
        "",
        "| boundary | wait for the window's first micro-batch ms | planning still running at window start |",
        "|---|---|---|",
    ]
    for k, wait in sorted(path["waits"].items()):
        rows.append(f"| window {k} | {wait * 1000:.1f} | {path['planning_at_window_start'].get(k)} |")
    rows.append(f"| any other micro-batch (median) | {path['median_other'] * 1000:.2f} | |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    main()
