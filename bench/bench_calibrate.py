"""Benchmark the cost model against measured step times: predicted vs measured speedup.

Calibrates the cost model on a small GPT (the built-in packed model of mds calibrate), then
plans the same samples (a heavy-tailed length mix) four ways for D in {2, 8}: mds balanced
with the calibrated cost, mds balanced with the FLOP formula of the model's shape, naive
random sharding (src/mds/planner/plan/bounds.py naive_ranks) and naive in-order round-robin (the step's
samples in index order, sample i to rank i % D). Every rank's micro-batches of every step
are timed through the model (forward + backward, per-sample causal attention over a packed
row), each rank alone, one after another; a step's time is its slowest rank's. Measured
speedups are set beside the ones each cost model predicts for the same plans (the
calibration before planning, the same grid re-timed alongside the plans, the FLOP formula,
the default) and beside mds inspect's own prediction. A real 2-rank torchrun (gloo) run of
the D=2 plans measures wall-clock steps with a gradient all-reduce. Method and results:
bench/README.md.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import write_report  # noqa: E402

SEED = 20261203
ROWS = 20_000
SHAPE = {"layers": 2, "hidden": 128, "heads": 4, "vocab": 512}
MAX_LEN = 1024
CAPACITY = 2048
MICRO = 4
SAMPLES_PER_STEP = 64
CAL_LENGTHS = (32, 64, 128, 256, 512, 1024)
PLANS = ("mds-calibrated", "mds-flop", "random", "round-robin")
BASELINES = ("random", "round-robin")
# calibrated: the fit the mds-calibrated plans were made with; same-rounds: the same grid
# timed in the measurement's rounds, fitted the same way; no-d: that fit without the
# per-sample term d (the three-term model a, b, c).
MODELS = ("calibrated", "same-rounds", "no-d", "flop", "default")
MODEL_NAMES = {
    "calibrated": "calibrated",
    "same-rounds": "calibrated, same rounds",
    "no-d": "same rounds, no d",
    "flop": "FLOP formula",
    "default": "default",
}
# (plan tag, D) -> mds inspect's predicted speedup vs naive: (per-sample costs, counting c)
INSPECT: dict[tuple[str, int], tuple[float, float | None]] = {}


def make_index(data: Path) -> Path:
    """Two sources: mostly short documents (log-normal) and a Pareto tail up to MAX_LEN."""
    import polars as pl

    from mds.planner.index.build import build_index
    from mds.planner.index.config import parse_config

    index = data / "index"
    marker = data / "meta.json"
    meta = {"rows": ROWS, "seed": SEED, "max": MAX_LEN, "version": 1}
    if marker.exists() and json.loads(marker.read_text()) == meta:
        return index
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    rng = np.random.default_rng(SEED)
    lengths = {
        "chat": rng.lognormal(4.2, 0.6, ROWS),  # median ~67 tokens
        "docs": 32 + rng.pareto(1.1, ROWS) * 90,  # heavy tail, clipped at MAX_LEN
    }
    sources = []
    for name, raw in lengths.items():
        n = np.clip(raw, 32, MAX_LEN).astype(np.int64)
        pl.DataFrame({"n_tokens": n}).write_parquet(data / f"{name}.parquet")
        sources.append({"name": name, "path": f"{name}.parquet", "count": "n_tokens"})
    build_index(parse_config({"source": sources}, path=data / "bench.toml"), index)
    marker.write_text(json.dumps(meta))
    return index


def plan_steps(index: Path, work: Path, cost: dict, dp: int, steps: int, tag: str) -> list:
    """mds plan of the mix with this [cost]: per step, per rank, micro-batches of lengths.
    Also returns each step's samples (source, row, n_tokens) in index order."""
    from mds.core.planfile_reader import PlanReader
    from mds.planner.plan.build import build_plan
    from mds.planner.plan.config import plan_config_from_dict
    from mds.planner.report.export import plan_frame
    from mds.planner.report.plan import plan_report

    data = {
        "plan": {"index": str(index.resolve())},
        "train": {
            "steps": steps,
            "dp_size": dp,
            "micro_batches": MICRO,
            "samples_per_step": SAMPLES_PER_STEP,
            "max_tokens_per_micro_batch": CAPACITY,
            "seed": 7,
        },
        "cost": cost,
        "source": [
            {"name": "chat", "path": "chat.parquet", "count": "n_tokens", "weight": 0.6},
            {"name": "docs", "path": "docs.parquet", "count": "n_tokens", "weight": 0.4},
        ],
    }
    path = work / f"plan-{tag}-d{dp}.mds"
    build_plan(plan_config_from_dict(data, base=index.parent), path)
    with PlanReader(path) as reader:
        imb = plan_report(reader, index)["imbalance"]
    INSPECT[(tag, dp)] = (imb["speedup_vs_naive"], imb["speedup_vs_naive_with_c"])
    frame = plan_frame(path, index)
    out = []
    for t in range(steps):
        f = frame.filter(frame["step"] == t)
        ranks = [[[] for _ in range(MICRO)] for _ in range(dp)]
        for r, m, n in f.select("rank", "micro_batch", "n_tokens").iter_rows():
            ranks[r][m].append(int(n))
        ordered = f.sort("source", "row")["n_tokens"].to_list()
        out.append((ranks, ordered))
    return out


def naive_steps(samples: list[list[int]], dp: int, how: str) -> list:
    """Naive sharding of each step's samples (given in index order): `random` deals them in
    naive_ranks' seeded order, `round-robin` sends sample i to rank i % D. A rank's samples
    go, in that order, into MICRO micro-batches of near-equal count (no token capacity)."""
    from mds.planner.plan.bounds import naive_ranks

    out = []
    for t, lengths in enumerate(samples):
        n = len(lengths)
        if how == "random":
            rank = naive_ranks(np.ones((1, n), dtype=bool), dp, np.array([t]))[0]
        else:
            rank = np.arange(n) % dp
        ranks = []
        for r in range(dp):
            mine = [lengths[i] for i in np.flatnonzero(rank == r)]
            ranks.append([list(map(int, part)) for part in np.array_split(mine, MICRO)])
        out.append(ranks)
    return out


def predicted(plan: list, a: float, b: float, c: float, d: float) -> float:
    """Sum over steps of the slowest rank's predicted time (c per non-empty micro-batch,
    d per sample)."""
    total = 0.0
    for ranks in plan:
        total += max(
            sum(c + sum(a * x + b * x * x + d for x in mb) for mb in rank if mb) for rank in ranks
        )
    return total


def measure(model, plans: dict, grid: list, repeats: int, clock: str, seed: int) -> tuple:
    """Per plan: per step, the slowest rank's time, a rank's time being the sum of its
    micro-batches' times; and the calibration grid's times measured alongside. Every
    distinct micro-batch of every plan and of the grid is timed once per round, in a seeded
    random order (calibrate.time_grid), the minimum of `repeats` rounds (other work on the
    machine only adds time), so load on the machine spreads over all plans and the grid
    alike."""
    from mds.planner.calibrate.fit import time_grid

    unique = sorted({tuple(mb) for plan in plans.values() for ranks in plan for rank in ranks
                     for mb in rank if mb} | {tuple(mb) for mb in grid})  # fmt: skip
    print(f"  {len(unique)} distinct micro-batches x {repeats} rounds", file=sys.stderr)
    seconds = time_grid(
        model, unique, vocab=SHAPE["vocab"], repeats=repeats, warmup=1, seed=seed,
        device="cpu", clock=clock, statistic=min,
    )  # fmt: skip
    timed = dict(zip(unique, seconds, strict=True))
    steps = {
        name: [max(sum(timed[tuple(mb)] for mb in rank if mb) for rank in ranks) for ranks in plan]
        for name, plan in plans.items()
    }
    return steps, [timed[tuple(mb)] for mb in grid]


def run_torchrun(plans: dict[str, list], work: Path, repeats: int) -> dict | None:
    """The D=2 plans in a real 2-rank torchrun (gloo): wall-clock steps, grads all-reduced."""
    spec = work / "dist-spec.json"
    result = work / "dist-result.json"
    spec.write_text(json.dumps({"plans": plans, "repeats": repeats}))
    result.unlink(missing_ok=True)
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [
        str(torchrun), "--standalone", "--nproc_per_node=2", __file__,
        "--dist-child", str(spec), "--dist-result", str(result),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not result.exists():
        print(proc.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(result.read_text())


def dist_child(spec_path: Path, result_path: Path) -> None:
    """One torchrun rank: every step of every plan, its own micro-batches, then an all-reduce
    of the gradients; the step's wall time (the slowest rank sets it) per plan, median of
    repeats."""
    import torch
    import torch.distributed as dist

    from mds.planner.calibrate.fit import forward_backward, micro_batch_inputs
    from mds.planner.calibrate.packed_gpt import GptShape, build_packed_gpt

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    spec = json.loads(spec_path.read_text())
    model = build_packed_gpt(GptShape(**SHAPE), seed=0)
    params = [p for p in model.parameters()]

    def step(micro_batches: list[list[int]], seed: int) -> None:
        model.zero_grad(set_to_none=False)
        for i, mb in enumerate(micro_batches):
            if mb:
                ids, cu = micro_batch_inputs(mb, SHAPE["vocab"], seed + i, "cpu")
                forward_backward(model, ids, cu)
        flat = torch.cat(
            [p.grad.flatten() if p.grad is not None else p.flatten() * 0 for p in params]
        )
        dist.all_reduce(flat)

    plans = spec["plans"]
    step(next(iter(plans.values()))[0][rank], 0)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in plans}
    steps = len(next(iter(plans.values())))
    for t in range(steps):
        for name, plan in plans.items():
            runs = []
            for _ in range(spec["repeats"]):
                dist.barrier()
                start = time.perf_counter()
                step(plan[t][rank], t * 1000)
                runs.append(time.perf_counter() - start)
            # The all-reduce ends together on both ranks: rank 0's time is the step's.
            times[name].append(statistics.median(runs))
    if rank == 0:
        result_path.write_text(json.dumps({"step_seconds": times}))
    dist.destroy_process_group()


def speedups(step_totals: dict[str, float], plan: str) -> dict[str, float]:
    return {base: step_totals[base] / step_totals[plan] for base in BASELINES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/bench"))
    ap.add_argument("--data", type=Path, default=Path("build/bench-data/calibrate"))
    ap.add_argument("--steps", type=int, default=6, help="steps measured per plan")
    ap.add_argument("--repeats", type=int, default=7, help="timed rounds per micro-batch (minimum)")
    ap.add_argument("--dp", type=int, nargs="*", default=[2, 8])
    ap.add_argument("--no-torchrun", action="store_true", help="skip the 2-rank torchrun run")
    ap.add_argument("--dist-child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--dist-result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dist_child is not None:
        dist_child(args.dist_child, args.dist_result)
        return

    import torch

    from mds.planner.calibrate import fit as cal
    from mds.planner.calibrate.packed_gpt import GptShape, build_packed_gpt
    from mds.planner.plan.config import DEFAULT_A, DEFAULT_B, parse_cost

    torch.set_num_threads(1)
    clock = "cpu"  # CPU time of the timing thread: the machine is shared (bench/README.md)
    index = make_index(args.data)
    work = args.data / "work"
    work.mkdir(parents=True, exist_ok=True)
    model = build_packed_gpt(GptShape(**SHAPE), seed=0)

    # 1. Calibrate (the grid mds calibrate times by default, over this mix's lengths).
    started = time.perf_counter()
    grid = cal.calibration_grid(CAL_LENGTHS, CAPACITY, mixed=4, seed=0)
    seconds = cal.time_grid(
        model, grid, vocab=SHAPE["vocab"], repeats=args.repeats, warmup=1, seed=0,
        device="cpu", clock=clock, statistic=min,
    )  # fmt: skip
    fit = cal.fit_cost(grid, seconds)
    cal_seconds = time.perf_counter() - started
    print(
        f"calibrated in {cal_seconds:.0f}s: a={fit.a:.4g} b={fit.b:.4g} c={fit.c:.4g} "
        f"d={fit.d:.4g}, "
        f"fit error max {fit.max_error:.1%} median {fit.median_error:.1%}",
        file=sys.stderr,
    )
    calibrated = {
        "source": "calibrated", "a": fit.a, "b": fit.b, "c": fit.c, "d": fit.d,
        "fit_error": fit.fit_error(),
    }  # fmt: skip
    flop_cost = {"model": {"layers": SHAPE["layers"], "hidden": SHAPE["hidden"],
                           "vocab": SHAPE["vocab"]}}  # fmt: skip
    flop = parse_cost(flop_cost, "")
    coeffs = {
        "calibrated": (fit.a, fit.b, fit.c, fit.d),
        "flop": (flop.a, flop.b, 0.0, 0.0),
        "default": (DEFAULT_A, DEFAULT_B, 0.0, 0.0),
    }

    by_dp = {}
    for dp in args.dp:
        cal_plan = plan_steps(index, work, calibrated, dp, args.steps, "calibrated")
        flop_plan = plan_steps(index, work, flop_cost, dp, args.steps, "flop")
        samples = [ordered for _, ordered in cal_plan]
        assert samples == [ordered for _, ordered in flop_plan]  # the same samples per step
        by_dp[dp] = {
            "mds-calibrated": [ranks for ranks, _ in cal_plan],
            "mds-flop": [ranks for ranks, _ in flop_plan],
            "random": naive_steps(samples, dp, "random"),
            "round-robin": naive_steps(samples, dp, "round-robin"),
        }
    print(f"timing {len(PLANS)} plans x {args.steps} steps for D in {args.dp}", file=sys.stderr)
    started = time.perf_counter()
    flat = {(dp, name): plan for dp, plans in by_dp.items() for name, plan in plans.items()}
    by_index, grid_again = measure(
        model, dict(enumerate(flat.values())), grid, args.repeats, clock, seed=1
    )
    steps = dict(zip(flat, by_index.values(), strict=True))
    measure_seconds = time.perf_counter() - started
    # The same grid, re-timed in the measurement's rounds: a fit under the same machine load.
    refit = cal.fit_cost(grid, grid_again)
    nod = cal.fit_cost(grid, grid_again, per_sample=False)
    coeffs["same-rounds"] = (refit.a, refit.b, refit.c, refit.d)
    coeffs["no-d"] = (nod.a, nod.b, nod.c, 0.0)
    print(
        f"re-timed grid: a={refit.a:.4g} b={refit.b:.4g} c={refit.c:.4g} d={refit.d:.4g}, "
        f"fit error max {refit.max_error:.1%} median {refit.median_error:.1%}; without d: "
        f"max {nod.max_error:.1%} median {nod.median_error:.1%}",
        file=sys.stderr,
    )
    results = {}
    for dp, plans in by_dp.items():
        pred = {
            m: {name: predicted(plan, *coeffs[m]) for name, plan in plans.items()} for m in MODELS
        }
        results[dp] = {
            "measured_step_seconds": {name: steps[(dp, name)] for name in plans},
            "measured_total": {name: sum(steps[(dp, name)]) for name in plans},
            "predicted_total": pred,
        }
    dist_plans = by_dp.get(2)

    dist = None
    if dist_plans is not None and not args.no_torchrun:
        print("torchrun: 2 ranks (gloo)", file=sys.stderr)
        dist = run_torchrun(dist_plans, work, max(1, args.repeats - 1))
    fits = {"calibrated": fit, "same-rounds": refit, "no-d": nod}
    table = render(results, dist, fits, coeffs, grid, grid_again, args)
    data = {
        "shape": SHAPE,
        "steps": args.steps,
        "repeats": args.repeats,
        "samples_per_step": SAMPLES_PER_STEP,
        "micro_batches": MICRO,
        "capacity": CAPACITY,
        "clock": clock,
        "torch": torch.__version__,
        "calibration": {
            "a": fit.a,
            "b": fit.b,
            "c": fit.c,
            "d": fit.d,
            "fit_error": fit.fit_error(),
            "points": [[list(mb), s] for mb, s in zip(grid, seconds, strict=True)],
            "retimed": [[list(mb), s] for mb, s in zip(grid, grid_again, strict=True)],
            "retimed_fit": {
                "a": refit.a,
                "b": refit.b,
                "c": refit.c,
                "d": refit.d,
                "fit_error": refit.fit_error(),
            },
            "retimed_fit_no_d": {
                "a": nod.a,
                "b": nod.b,
                "c": nod.c,
                "fit_error": nod.fit_error(),
            },
            "seconds": cal_seconds,
        },  # fmt: skip
        "coefficients": coeffs,
        "results": {str(k): v for k, v in results.items()},
        "torchrun": dist,
        "measure_seconds": measure_seconds,
        "load_average": os.getloadavg(),
        "inspect": {f"{tag}/{dp}": v for (tag, dp), v in INSPECT.items()},
        "summary": summary(results),
    }
    write_report(args.out, "calibrate", table, data)


def ratios(results: dict) -> dict[str, list[float]]:
    """Per cost model, predicted / measured speedup over the rows of the main table (each
    mds plan against each naive plan, for every D)."""
    out: dict[str, list[float]] = {m: [] for m in MODELS}
    for r in results.values():
        meas = r["measured_total"]
        for plan in ("mds-calibrated", "mds-flop"):
            for base in BASELINES:
                m = meas[base] / meas[plan]
                for model in MODELS:
                    p = r["predicted_total"][model]
                    out[model].append(p[base] / p[plan] / m)
    return out


def summary(results: dict) -> dict[str, dict]:
    """Per cost model: range and mean absolute error of predicted / measured speedup, and in
    how many rows it is closer to measured than the FLOP formula."""
    rs = ratios(results)
    flop = [abs(x - 1) for x in rs["flop"]]
    return {
        m: {
            "min": min(v),
            "max": max(v),
            "mean_abs_error": statistics.fmean(abs(x - 1) for x in v),
            "closer_than_flop": sum(abs(x - 1) < f for x, f in zip(v, flop, strict=True)),
            "rows": len(v),
        }
        for m, v in rs.items()
    }


def residuals_by_count(grid: list, seconds: list, fits: dict) -> list[str]:
    """The fits' signed relative errors on the grid, grouped by samples per micro-batch."""
    groups = [(1, 1), (2, 4), (5, 16), (17, 10**9)]
    lines = [
        "| samples per micro-batch | points | " + " | ".join(
            f"{MODEL_NAMES[m]}: mean error | max abs." for m in ("same-rounds", "no-d")
        ) + " |",
        "|---|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for lo, hi in groups:
        idx = [i for i, mb in enumerate(grid) if lo <= len(mb) <= hi]
        if not idx:
            continue
        row = [f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi < 10**9 else f">= {lo}"), str(len(idx))]
        for m in ("same-rounds", "no-d"):
            err = [(fits[m].predict(grid[i]) - seconds[i]) / seconds[i] for i in idx]
            row += [f"{statistics.fmean(err):+.1%}", f"{max(abs(e) for e in err):.1%}"]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def render(results, dist, fits, coeffs, grid, grid_again, args) -> str:
    fit, refit, nod = fits["calibrated"], fits["same-rounds"], fits["no-d"]
    summ = summary(results)
    lines = [
        f"Cost model vs measured step time: built-in GPT {SHAPE}, {args.steps} steps of "
        f"{SAMPLES_PER_STEP} samples, {MICRO} micro-batches per rank, CPU time of 1 thread, "
        f"minimum of {args.repeats} rounds per distinct micro-batch. Load average at the end: "
        + ", ".join(f"{x:.2f}" for x in os.getloadavg())
        + ".",
        "",
        f"Calibrated: a = {fit.a:.4g} s/token, b = {fit.b:.4g} s/token^2, c = {fit.c:.4g} "
        f"s/micro-batch, d = {fit.d:.4g} s/sample; fit error max {fit.max_error:.1%}, median "
        f"{fit.median_error:.1%} over {len(fit.rel_errors)} micro-batches (timed before "
        "planning; the mds-calibrated plans use it). Same rounds: the same grid timed again in "
        f"the measurement's rounds, a = {refit.a:.4g}, b = {refit.b:.4g}, c = {refit.c:.4g}, "
        f"d = {refit.d:.4g}; fit error max {refit.max_error:.1%}, median "
        f"{refit.median_error:.1%}. Same rounds without d: a = {nod.a:.4g}, b = {nod.b:.4g}, "
        f"c = {nod.c:.4g}; fit error max {nod.max_error:.1%}, median {nod.median_error:.1%}. "
        f"FLOP formula: a = {coeffs['flop'][0]:.4g}, b = {coeffs['flop'][1]:.4g}. Default: "
        "a = 1, b = 1/24576.",
        "",
        "Predicted / measured speedup over the rows below, per cost model:",
        "",
        "| cost model | range | mean abs. error | closer than the FLOP formula |",
        "|---|---:|---:|---:|",
    ]
    for m in MODELS:
        x = summ[m]
        closer = "-" if m == "flop" else f"{x['closer_than_flop']} of {x['rows']}"
        lines.append(
            f"| {MODEL_NAMES[m]} | {x['min']:.3f} - {x['max']:.3f} | "
            f"{x['mean_abs_error']:.1%} | {closer} |"
        )
    lines += [
        "",
        "Speedup of each mds plan over each naive plan of the same samples (sum over steps of "
        "the slowest rank's time); predicted by each cost model, and predicted / measured:",
        "",
        "| D | plan | vs | measured | "
        + " | ".join(f"{MODEL_NAMES[m]} | ratio" for m in MODELS) + " |",
        "|---:|---|---|---:|" + "---:|---:|" * len(MODELS),
    ]  # fmt: skip
    for dp, r in results.items():
        meas = r["measured_total"]
        for plan in ("mds-calibrated", "mds-flop"):
            for base in BASELINES:
                m = meas[base] / meas[plan]
                row = [str(dp), plan, base, f"{m:.3f}x"]
                for model in MODELS:
                    p = r["predicted_total"][model]
                    s = p[base] / p[plan]
                    row += [f"{s:.3f}x", f"{s / m:.3f}"]
                lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Step time, calibrated predictions vs measured (sum over steps, seconds):",
        "",
        "| D | plan | measured s | calibrated s | ratio | same rounds s | ratio "
        "| same rounds, no d s | ratio |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for dp, r in results.items():
        for plan in PLANS:
            m = r["measured_total"][plan]
            row = [str(dp), plan, f"{m:.3f}"]
            for model in ("calibrated", "same-rounds", "no-d"):
                p = r["predicted_total"][model][plan]
                row += [f"{p:.3f}", f"{p / m:.3f}"]
            lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Fit error on the grid timed in the measurement's rounds, by samples per micro-batch "
        "(signed: predicted / measured - 1):",
        "",
        *residuals_by_count(grid, grid_again, fits),
        "",
        "`mds inspect`'s own prediction for the mds-calibrated plan (its naive baseline is a "
        "seeded random deal of the same samples, like `random`, though not the same deal):",
        "",
        "| D | speedup_vs_naive | speedup_vs_naive_with_c | measured vs random |",
        "|---:|---:|---:|---:|",
    ]
    for dp, r in results.items():
        per_sample, with_c = INSPECT[("calibrated", dp)]
        meas = r["measured_total"]["random"] / r["measured_total"]["mds-calibrated"]
        lines.append(f"| {dp} | {per_sample:.3f}x | {with_c or per_sample:.3f}x | {meas:.3f}x |")
    if dist is not None and 2 in results:
        wall = {k: sum(v) for k, v in dist["step_seconds"].items()}
        pred = results[2]["predicted_total"]["calibrated"]
        lines += [
            "",
            "2-rank torchrun (gloo), wall clock per step incl. the gradient all-reduce "
            "(sum over steps):",
            "",
            "| plan | wall s | speedup vs random | predicted | speedup vs round-robin | predicted |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for plan in PLANS:
            lines.append(
                f"| {plan} | {wall[plan]:.3f} | {wall['random'] / wall[plan]:.3f}x | "
                f"{pred['random'] / pred[plan]:.3f}x | {wall['round-robin'] / wall[plan]:.3f}x | "
                f"{pred['round-robin'] / pred[plan]:.3f}x |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
