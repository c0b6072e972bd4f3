"""Benchmark the cost models on a real model class: a tiny transformers Llama.

The model is `AutoModelForCausalLM.from_config` of a Llama config (2 layers, hidden 256,
4 heads, 2 KV heads, ffn 688, vocab 32000; random weights, SDPA), run as `mds calibrate
--hf-config` runs it: each sample of a micro-batch its own causal sequence. The same
samples per step (bench_calibrate.py's two-source mix) are planned five ways for D in
{2, 8}: mds with the calibrated cost (`mds calibrate --hf-config`'s fit), mds with the cost
of the model's shape (`[cost] hf_config`, the FLOP model), mds with the built-in default (no
`[cost]`), a random deal and round-robin. Every distinct micro-batch of every plan is timed
(forward + backward, one thread, process CPU time, the minimum of the rounds, in a seeded
random order per round); a rank's time is the sum of its micro-batches, a step's the
slowest rank's (ranks timed one after another in one process). Reported: per cost, the
speedup its plan was predicted to give (by that cost, and by `mds inspect`) against the
measured one. Then the D=2 plans run in a real 2-rank `torchrun` (gloo; one thread per rank,
each rank pinned to its own core; bench/real_model_rank.py): wall time per step between
barriers, the median over steps of each plan's speedup against the random deal, over
several rounds, with the load average before and after each round (--only-torchrun: only
this part, after the calibration it needs). Method and results: bench/README.md.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_calibrate as bc  # noqa: E402
from report import write_report  # noqa: E402

LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 688,
    "vocab_size": 32000,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
CAL_LENGTHS = (32, 64, 128, 256, 512, 1024)
CAL_MAX_TOKENS = 2048
COSTS = ("calibrated", "shape", "default")
PLAN_OF = {"calibrated": "mds-calibrated", "shape": "mds-shape", "default": "mds-default"}
PLANS = (*PLAN_OF.values(), "random", "round-robin")
BASELINES = ("random", "round-robin")


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def time_unique(model, micro_batches, vocab: int, repeats: int, seed: int) -> dict:
    """Seconds of each distinct micro-batch: the minimum of `repeats` rounds (one warm-up
    round first), every round in a seeded random order; the load average after each round."""
    from mds.planner.calibrate.fit import time_grid

    unique = sorted({tuple(mb) for mb in micro_batches})
    rounds_load = []

    def advance(_: int, count=[0]) -> None:  # noqa: B006 - a counter across calls
        count[0] += 1
        if count[0] % len(unique) == 0:
            rounds_load.append(load())

    seconds = time_grid(
        model, unique, vocab=vocab, repeats=repeats, warmup=1, seed=seed,
        device="cpu", clock="cpu", advance=advance, statistic=min,
    )  # fmt: skip
    return {"times": dict(zip(unique, seconds, strict=True)), "load_per_round": rounds_load}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/bench"))
    ap.add_argument("--data", type=Path, default=Path("build/bench-data/real-model"))
    ap.add_argument("--steps", type=int, default=4, help="steps measured per plan")
    ap.add_argument("--samples", type=int, default=32, help="samples per step")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds (minimum)")
    ap.add_argument("--cal-repeats", type=int, default=3, help="calibration rounds (minimum)")
    ap.add_argument("--dp", type=int, nargs="*", default=[2, 8])
    ap.add_argument("--torchrun-rounds", type=int, default=3, help="rounds of the 2-rank run")
    ap.add_argument("--only-torchrun", action="store_true",
                    help="calibrate, plan D=2 and run only the 2-rank torchrun part")
    ap.add_argument("--no-torchrun", action="store_true", help="skip the 2-rank torchrun part")
    args = ap.parse_args()
    if args.only_torchrun:
        args.dp = [2]

    import torch

    from mds.planner.calibrate import fit as cal
    from mds.planner.calibrate.packed_hf import build_hf_model
    from mds.planner.plan.config import DEFAULT_A, DEFAULT_B, parse_cost

    torch.set_num_threads(1)
    bc.SAMPLES_PER_STEP = args.samples
    index = bc.make_index(args.data)
    work = args.data / "work"
    work.mkdir(parents=True, exist_ok=True)
    config = (work / "llama-tiny").resolve()
    config.mkdir(exist_ok=True)
    (config / "config.json").write_text(json.dumps(LLAMA, indent=1))
    model, vocab = build_hf_model(config, seed=0)

    # 1. Calibrate: what `mds calibrate --hf-config ... --threads 1 --statistic min` does.
    load_before = load()
    started = time.perf_counter()
    grid = cal.calibration_grid(CAL_LENGTHS, CAL_MAX_TOKENS, mixed=4, seed=0)
    seconds = cal.time_grid(
        model, grid, vocab=vocab, repeats=args.cal_repeats, warmup=1, seed=0,
        device="cpu", clock="cpu", statistic=min,
    )  # fmt: skip
    fit = cal.fit_cost(grid, seconds)
    calibration = {
        "a": fit.a, "b": fit.b, "c": fit.c, "d": fit.d, "fit_error": fit.fit_error(),
        "seconds": time.perf_counter() - started, "load_before": load_before, "load_after": load(),
        "points": [[list(mb), s, e] for mb, s, e in zip(grid, seconds, fit.rel_errors,
                                                         strict=True)],
    }  # fmt: skip
    print(
        f"calibrated in {calibration['seconds']:.0f}s: a={fit.a:.4g} b={fit.b:.4g} "
        f"c={fit.c:.4g} d={fit.d:.4g}; max error {fit.max_error:.1%}",
        file=sys.stderr,
    )
    cost_tables = {
        "calibrated": {"source": "calibrated", "a": fit.a, "b": fit.b, "c": fit.c, "d": fit.d,
                       "fit_error": fit.fit_error()},
        "shape": {"hf_config": str(config / "config.json")},
        "default": {},
    }  # fmt: skip
    shape = parse_cost(cost_tables["shape"], "")
    coeffs = {
        "calibrated": (fit.a, fit.b, fit.c, fit.d),
        "shape": (shape.a, shape.b, 0.0, 0.0),
        "default": (DEFAULT_A, DEFAULT_B, 0.0, 0.0),
    }

    # 2. Plan the same samples five ways.
    by_dp, inspect = {}, {}
    for dp in args.dp:
        plans, samples = {}, None
        for kind in COSTS:
            steps = bc.plan_steps(index, work, cost_tables[kind], dp, args.steps, kind)
            ordered = [o for _, o in steps]
            assert samples is None or samples == ordered  # the same samples per step
            samples = ordered
            plans[PLAN_OF[kind]] = [ranks for ranks, _ in steps]
            inspect[(kind, dp)] = inspect_prediction(work / f"plan-{kind}-d{dp}.mds", index)
        plans["random"] = bc.naive_steps(samples, dp, "random")
        plans["round-robin"] = bc.naive_steps(samples, dp, "round-robin")
        by_dp[dp] = plans

    step_s_d2 = None
    if not args.only_torchrun:
        step_s_d2 = measure_one_process(args, model, vocab, by_dp, coeffs, calibration, inspect,
                                        fit, torch.__version__)  # fmt: skip
    if not args.no_torchrun:
        dist = torchrun_part(by_dp.get(2), coeffs, config, work, args.torchrun_rounds)
        dist["calibration_load"] = [calibration["load_before"], calibration["load_after"]]
        dist["steps"], dist["samples_per_step"] = args.steps, args.samples
        table = render_torchrun(dist, step_s_d2)
        write_report(args.out, "real_model_torchrun", table, dist)


def measure_one_process(args, model, vocab, by_dp, coeffs, calibration, inspect, fit,
                        torch_version: str) -> dict | None:
    """Step 3 and the real_model report: every distinct micro-batch timed in this process.
    Returns the D=2 plans' measured step times (for the torchrun report)."""
    # 3. Measure every distinct micro-batch.
    every = [mb for plans in by_dp.values() for plan in plans.values() for ranks in plan
             for rank in ranks for mb in rank if mb]  # fmt: skip
    print(f"timing {len(set(map(tuple, every)))} distinct micro-batches", file=sys.stderr)
    load_before = load()
    started = time.perf_counter()
    timed = time_unique(model, every, vocab, args.repeats, seed=1)
    measurement = {
        "seconds": time.perf_counter() - started,
        "load_before": load_before,
        "load_per_round": timed["load_per_round"],
    }
    times = timed["times"]
    results = {}
    for dp, plans in by_dp.items():
        step_s = {
            name: [max(sum(times[tuple(mb)] for mb in rank if mb) for rank in ranks)
                   for ranks in plan]
            for name, plan in plans.items()
        }  # fmt: skip
        total = {name: sum(v) for name, v in step_s.items()}
        results[dp] = {
            "measured_step_seconds": step_s,
            "measured_total": total,
            "predicted_total": {
                kind: {name: bc.predicted(plan, *coeffs[kind]) for name, plan in plans.items()}
                for kind in COSTS
            },
        }
    data = {
        "model": LLAMA,
        "steps": args.steps,
        "samples_per_step": args.samples,
        "micro_batches": bc.MICRO,
        "capacity": bc.CAPACITY,
        "repeats": args.repeats,
        "torch": torch_version,
        "calibration": calibration,
        "coefficients": coeffs,
        "measurement": measurement,
        "inspect": {f"{k}/{dp}": v for (k, dp), v in inspect.items()},
        "results": {str(dp): r for dp, r in results.items()},
        "load_average_end": load(),
    }
    write_report(args.out, "real_model", render(data, results, inspect, fit, coeffs), data)
    return results[2]["measured_step_seconds"] if 2 in results else None


def torchrun_part(plans: dict | None, coeffs: dict, config: Path, work: Path, rounds: int) -> dict:
    """The D=2 plans in a 2-rank torchrun (bench/real_model_rank.py), or why not: the
    ranks' step times per round with the load average around each round, and every plan's
    predicted time per step (by each cost)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return {"skipped": f"{len(cores)} core available to this process; the 2-rank run "
                           "pins each rank to its own core and needs 2"}  # fmt: skip
    if plans is None:
        return {"skipped": "D = 2 is not among --dp"}
    spec, result = work / "torchrun-spec.json", work / "torchrun-result.json"
    spec.write_text(json.dumps({"config": str(config), "plans": plans, "rounds": rounds,
                                "seed": 2, "cores": cores[:2]}))  # fmt: skip
    result.unlink(missing_ok=True)
    cmd = [
        str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node=2",
        str(Path(__file__).with_name("real_model_rank.py")), str(spec), str(result),
    ]  # fmt: skip
    print(f"torchrun: 2 ranks (gloo) on cores {cores[:2]}, {rounds} rounds", file=sys.stderr)
    load_before, started = load(), time.perf_counter()
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True)  # fmt: skip
    print(proc.stderr[-3000:], file=sys.stderr)
    if proc.returncode != 0 or not result.exists():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"skipped": f"torchrun exited with {proc.returncode}: {last[:200]}"}
    out = json.loads(result.read_text())
    out.update(load_before=load_before, load_after=load(), seconds=time.perf_counter() - started,
               cores_available=cores, torchrun_rounds=rounds)  # fmt: skip
    out["predicted_step_seconds"] = {
        kind: {name: [bc.predicted([ranks], *coeffs[kind]) for ranks in plan]
               for name, plan in plans.items()}
        for kind in COSTS
    }  # fmt: skip
    return out


def median_speedup(base: list[float], plan: list[float]) -> float:
    """The median over steps of base / plan, the two given as per-step times."""
    if len(base) != len(plan) or not base:
        raise ValueError(f"need per-step times of equal, non-zero length: {len(base)}, {len(plan)}")
    return statistics.median(b / p for b, p in zip(base, plan, strict=True))


def render_torchrun(dist: dict, one_process: dict | None) -> str:
    """The 2-rank table: per plan the predicted and measured speedup over the random deal
    (medians over steps; measured: the median over rounds, and the rounds' range)."""
    head = "2-rank torchrun (gloo), D = 2"
    if "skipped" in dist:
        return f"{head}: skipped: {dist['skipped']}.\n"
    rounds = dist["rounds"]
    mds_plans = [PLAN_OF[k] for k in COSTS]
    others = [p for p in PLANS if p != "random"]

    def walls(r: dict, name: str) -> list[float]:
        return [s["wall"] for s in r["steps"][name]]

    def cpus(r: dict, name: str) -> list[float]:
        return [max(s["cpu"]) for s in r["steps"][name]]

    lines = [
        f"{head}: {dist['steps']} steps of {dist['samples_per_step']} samples, the same "
        "samples in every plan; one torch thread per rank (OMP_NUM_THREADS=1), ranks 0 and 1 "
        f"pinned to cores {dist['cores']} (one each), tiny Llama forward + backward of the rank's "
        "micro-batches, no gradient all-reduce; a barrier before and after each step, the "
        "step's time is rank 0's wall time between them. Every (step, plan) pair once per "
        f"round in a seeded order, after one untimed step per plan; {len(rounds)} rounds, "
        f"{dist['seconds']:.0f} s in all. Load average (1, 5, 15 min; 2 cores) "
        f"{dist['load_before']} before the run, {dist['load_after']} after; while "
        f"calibrating {dist['calibration_load'][0]} to {dist['calibration_load'][1]}.",
        "",
        "Speedup over the random deal, the median over steps (measured: of each round, then "
        "the median over rounds and the rounds' range; `slowest CPU`: the same with each "
        "step's time the slower rank's CPU time instead of wall time; `one process`: "
        "real_model.md's per-micro-batch CPU times summed per rank):",
        "",
        "| plan | predicted (own cost) | predicted (calibrated) | measured (wall) | rounds | "
        "slowest CPU | one process | step s (median) | busy slower / faster rank |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]  # fmt: skip
    pred = dist["predicted_step_seconds"]
    for name in PLANS:
        own = next((k for k in COSTS if PLAN_OF[k] == name), None)
        p_own = (f"{median_speedup(pred[own]['random'], pred[own][name]):.3f}x"
                 if own else "-")  # fmt: skip
        p_cal = median_speedup(pred["calibrated"]["random"], pred["calibrated"][name])
        per_round = [median_speedup(walls(r, "random"), walls(r, name)) for r in rounds]
        cpu = statistics.median(median_speedup(cpus(r, "random"), cpus(r, name)) for r in rounds)
        one = (f"{median_speedup(one_process['random'], one_process[name]):.3f}x"
               if one_process else "-")  # fmt: skip
        step = statistics.median(w for r in rounds for w in walls(r, name))
        skew = statistics.median(max(s["busy"]) / min(s["busy"])
                                 for r in rounds for s in r["steps"][name])  # fmt: skip
        lines.append(
            f"| {name} | {p_own} | {p_cal:.3f}x | {statistics.median(per_round):.3f}x | "
            f"{min(per_round):.3f} - {max(per_round):.3f} | {cpu:.3f}x | {one} | {step:.3f} | "
            f"{skew:.3f} |"
        )
    lines += [
        "",
        "Per round: the load average before and after it, and each plan's measured speedup "
        "over the random deal (wall, median over steps):",
        "",
        "| round | load before | load after | " + " | ".join(others) + " |",
        "|---:|---|---|" + "---:|" * len(others),
    ]
    for i, r in enumerate(rounds):
        cells = " | ".join(f"{median_speedup(walls(r, 'random'), walls(r, n)):.3f}x"
                           for n in others)  # fmt: skip
        lines.append(f"| {i + 1} | {r['load_before']} | {r['load_after']} | {cells} |")
    lines += [
        "",
        "The number holds for ranks that each own a core and nothing else runs: shared cores "
        "and outside load hide imbalance. Pinned, a rank that finishes early leaves its core "
        "idle and the other borrows nothing from it; but with unpinned threads (or more "
        "threads than cores), or with other processes on the cores, the slow rank's step is "
        "stretched by whatever else runs, the fast rank's wait absorbs outside work, and the "
        "measured speedup shrinks toward 1. With a load average above the 2 cores, wall "
        "times measure the other work as much as the plans: the measured column is then "
        "not the plans' speedup (it can fall below 1x, as noise); `slowest CPU` (each rank's "
        "own CPU time) is less disturbed by load than wall time but still slowed by cache "
        "and memory contention. "
        f"({', '.join(mds_plans)}: mds plans with each cost.)",
    ]
    return "\n".join(lines) + "\n"


def inspect_prediction(plan: Path, index: Path) -> dict:
    """What `mds inspect --json` predicts for a plan: speedup vs naive and, with the
    default cost, its range over b x 0.25 to x 4."""
    from mds.core.planfile_reader import PlanReader
    from mds.planner.report.plan import plan_report

    with PlanReader(plan) as reader:
        report = plan_report(reader, index)
    imb = report["imbalance"]
    band = imb.get("speedup_vs_naive_band")
    return {
        "speedup_vs_naive": imb["speedup_vs_naive"],
        "speedup_vs_naive_with_c": imb["speedup_vs_naive_with_c"],
        "band": [band["low"], band["high"]] if band else None,
        "label": report["header"]["cost_label"],
    }


def render(data: dict, results: dict, inspect: dict, fit, coeffs) -> str:
    m = data["measurement"]
    c = data["calibration"]
    lines = [
        f"Tiny Llama (transformers {_version()}, 2 layers, hidden 256, 4 heads / 2 KV, ffn 688, "
        f"vocab 32000, SDPA, each sample its own causal sequence), {data['steps']} steps of "
        f"{data['samples_per_step']} samples, {data['micro_batches']} micro-batches per rank, "
        f"CPU time of 1 thread, minimum of {data['repeats']} rounds per distinct micro-batch; "
        "ranks timed one after another in one process, a step's time is its slowest rank's.",
        "",
        f"Calibrated: a = {fit.a:.4g} s/token, b = {fit.b:.4g} s/token^2, c = {fit.c:.4g} "
        f"s/micro-batch, d = {fit.d:.4g} s/sample, fit error max {fit.max_error:.1%}, median "
        f"{fit.median_error:.1%} (load average {c['load_before']} before, {c['load_after']} "
        f"after). b/a: calibrated {_ratio(fit.a, fit.b)}, shape (FLOP model) "
        f"{_ratio(*coeffs['shape'][:2])}, default 1/24576.",
        "",
        f"Measurement load average: {m['load_before']} before, per round "
        + "; ".join(str(x) for x in m["load_per_round"])
        + ". Shared cores and outside load add time to every rank alike only on average: "
        "they hide imbalance (a slow spell on the fast rank shrinks the measured gap), which "
        "the minimum over rounds reduces but does not remove.",
        "",
        "Predicted vs measured speedup of each mds plan (its own cost's prediction; `inspect` "
        "is mds inspect's speedup_vs_naive against its own random deal, with the default's "
        "band over b x 0.25 to x 4):",
        "",
        "| D | cost | vs | predicted | measured | predicted / measured | inspect | inspect band |",
        "|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for dp, r in results.items():
        meas = r["measured_total"]
        for kind in COSTS:
            plan = PLAN_OF[kind]
            pred = r["predicted_total"][kind]
            ins = inspect[(kind, dp)]
            band = f"{ins['band'][0]:.3f} - {ins['band'][1]:.3f}" if ins["band"] else "-"
            for base in BASELINES:
                p, x = pred[base] / pred[plan], meas[base] / meas[plan]
                lines.append(
                    f"| {dp} | {kind} | {base} | {p:.3f}x | {x:.3f}x | {p / x:.3f} | "
                    f"{ins['speedup_vs_naive']:.3f}x | {band} |"
                )
    lines += [
        "",
        "Measured time of the plans (sum over steps of the slowest rank, seconds), and each "
        "mds plan against the calibrated one:",
        "",
        "| D | " + " | ".join(PLANS) + " | shape / calibrated | default / calibrated |",
        "|---:|" + "---:|" * (len(PLANS) + 2),
    ]
    for dp, r in results.items():
        t = r["measured_total"]
        cal_t = t["mds-calibrated"]
        lines.append(
            f"| {dp} | " + " | ".join(f"{t[p]:.3f}" for p in PLANS)
            + f" | {t['mds-shape'] / cal_t:.3f} | {t['mds-default'] / cal_t:.3f} |"
        )  # fmt: skip
    lines += [
        "",
        "The calibrated cost's prediction of every plan (predicted / measured speedup over "
        "random; how well the calibrated model describes the others' plans too):",
        "",
        "| D | plan | predicted (calibrated cost) | measured | ratio |",
        "|---:|---|---:|---:|---:|",
    ]
    for dp, r in results.items():
        pred, meas = r["predicted_total"]["calibrated"], r["measured_total"]
        for plan in PLAN_OF.values():
            p, x = pred["random"] / pred[plan], meas["random"] / meas[plan]
            lines.append(f"| {dp} | {plan} | {p:.3f}x | {x:.3f}x | {p / x:.3f} |")
    return "\n".join(lines) + "\n"


def _ratio(a: float, b: float) -> str:
    return f"1/{a / b:.0f}" if b > 0 else "0 (b = 0)"


def _version() -> str:
    import transformers

    return transformers.__version__


if __name__ == "__main__":
    main()
