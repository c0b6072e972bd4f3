"""How a plan turned out: target vs realized mix (whole run and per schedule phase), epochs,
per-step rank imbalance, capacity fill, and per-step series for charts.

Everything comes from the plan file (footer, `stats`, `source_samples`) except realized
token shares (`weight_by = "tokens"`), which need the index through `plan_frame`.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mds.core.planfile_reader import PlanReader
from mds.errors import PlanError
from mds.planner.plan.config import epoch_warnings
from mds.planner.plan.cost_label import cost_label, cost_model, cost_note
from mds.planner.plan.schedule import parse_schedule
from mds.planner.report.common import SCHEMA, buckets, ratio, summary
from mds.planner.report.cp import cp_report
from mds.planner.report.vision import vision_report

__all__ = [
    "MAX_PHASES",
    "MIN_PHASE_FRACTION",
    "SERIES_POINTS",
    "breakpoints",
    "phases",
    "plan_report",
    "realized_amounts",
    "step_stats",
    "target_shares",
]

MAX_PHASES = 8
MIN_PHASE_FRACTION = 0.01
SERIES_POINTS = 600


def target_shares(footer: dict[str, Any], steps: int, first: int = 0) -> np.ndarray:
    """[steps - first, sources]: each planned source's weight at each step from `first` over
    the step's total."""
    at = np.arange(first, steps)
    sources = footer["config"]["sources"]
    if not sources:
        return np.zeros((len(at), 0))
    weights = np.stack(
        [
            parse_schedule(s["weight"], f"plan config sources[{i}].weight").at(at)
            for i, s in enumerate(sources)
        ],
        axis=1,
    )
    total = weights.sum(axis=1, keepdims=True)
    return np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)


def breakpoints(footer: dict[str, Any], steps: int) -> list[int]:
    """Every step strictly inside the run where some source's schedule has a point."""
    cuts = set()
    for i, s in enumerate(footer["config"]["sources"]):
        schedule = parse_schedule(s["weight"], f"plan config sources[{i}].weight")
        if schedule.kind != "constant":
            cuts.update(x for x in schedule.steps if 0 < x < steps)
    return sorted(cuts)


def phases(
    cuts: list[int],
    steps: int,
    max_phases: int = MAX_PHASES,
    min_fraction: float = MIN_PHASE_FRACTION,
) -> list[tuple[int, int]]:
    """The intervals between `cuts`; the shortest is merged into its shorter neighbour
    while it is under `min_fraction` of the run or there are more than `max_phases`."""
    edges = sorted({0, steps, *(c for c in cuts if 0 < c < steps)})
    spans = [[a, b] for a, b in zip(edges, edges[1:], strict=False)]
    while len(spans) > 1:
        lengths = [b - a for a, b in spans]
        i = int(np.argmin(lengths))
        if lengths[i] >= min_fraction * steps and len(spans) <= max_phases:
            break
        if i == 0:
            j = 1
        elif i == len(spans) - 1:
            j = i - 1
        else:
            j = i - 1 if lengths[i - 1] <= lengths[i + 1] else i + 1
        lo, hi = min(i, j), max(i, j)
        spans[lo : hi + 1] = [[spans[lo][0], spans[hi][1]]]
    return [(a, b) for a, b in spans]


def realized_amounts(reader: PlanReader, index: str | Path | None = None) -> tuple[str, np.ndarray]:
    """("samples" or "tokens", [steps, sources]): what each planned source put in each step.

    Tokens (weight_by = "tokens") are the index's n_tokens, capped at the capacity when
    overlong = "truncate", summed from `plan_frame`; samples come from `source_samples`."""
    footer = reader.footer
    train = footer["config"]["train"]
    if train.get("weight_by", "samples") != "tokens":
        return "samples", np.asarray(reader.section("source_samples"), dtype=np.int64)
    from mds.planner.report.export import plan_frame

    names = [s["name"] for s in footer["sources"]]
    frame = plan_frame(reader.path, index)
    n = pl.col("n_tokens").cast(pl.Int64)
    if train["overlong"] == "truncate":
        n = pl.min_horizontal(n, pl.lit(train["max_tokens_per_micro_batch"]))
    sums = frame.group_by("step", "source").agg(n.sum().alias("tokens"))
    out = np.zeros((reader.steps - reader.first_step, len(names)), dtype=np.int64)
    col = {name: i for i, name in enumerate(names)}
    for step, source, tokens in sums.iter_rows():
        out[step - reader.first_step, col[source]] = tokens
    return "tokens", out


def step_stats(reader: PlanReader) -> dict[str, np.ndarray]:
    """The `stats` section as {column name: int64 per-step array}."""
    stats = np.asarray(reader.section("stats"), dtype=np.int64)
    names = list(reader.footer.get("stats_columns", []))
    if stats.ndim != 2 or stats.shape != (reader.steps - reader.first_step, len(names)):
        raise PlanError(f"{reader.path}: corrupt plan (stats section shape {stats.shape})")
    return {name: stats[:, i] for i, name in enumerate(names)}


def _shares(amounts: np.ndarray) -> np.ndarray:
    total = amounts.sum(axis=0 if amounts.ndim == 1 else -1, keepdims=True)
    return np.divide(amounts, total, out=np.zeros(amounts.shape), where=total > 0)


def _mix(
    names: list[str], target: np.ndarray, amounts: np.ndarray, a: int, b: int
) -> list[dict[str, Any]]:
    want = target[a:b].mean(axis=0) if b > a else np.zeros(len(names))
    got = _shares(amounts[a:b].sum(axis=0).astype(np.float64))
    return [
        {"name": n, "target": float(t), "realized": float(r)}
        for n, t, r in zip(names, want, got, strict=True)
    ]


def _imbalance(col: dict[str, np.ndarray], dp: int, rank_overhead: float | None) -> dict[str, Any]:
    """Balance against the lower bound and two naive baselines: a seeded random deal
    (`naive`) and in-order interleaving (`interleave`; None in plans made before it was
    recorded). `stronger_baseline` names the one with the lower total of slowest ranks.
    `rank_overhead`: a rank's per-step constant in cost units (the cost model's c per
    micro-batch x micro-batches), or None when the cost model has no c."""
    planned = int(col["max_rank_cost"].sum())
    naive = int(col["naive_max_rank_cost"].sum())
    inter = col.get("interleave_max_rank_cost")
    with_c = None
    if rank_overhead is not None:
        extra = rank_overhead * len(col["max_rank_cost"])
        with_c = (naive + extra) / (planned + extra) if planned + extra else 1.0
    out: dict[str, Any] = {
        "max_over_mean": summary(ratio(col["max_rank_cost"] * dp, col["cost"])),
        "max_over_lower_bound": summary(ratio(col["max_rank_cost"], col["lower_bound"])),
        "naive_over_lower_bound": summary(ratio(col["naive_max_rank_cost"], col["lower_bound"])),
        "speedup_vs_naive": naive / planned if planned else 1.0,
        "speedup_vs_naive_with_c": with_c,
        "interleave_over_lower_bound": None,
        "speedup_vs_interleave": None,
        "stronger_baseline": "naive",
    }
    if inter is not None:
        total = int(inter.sum())
        out["interleave_over_lower_bound"] = summary(ratio(inter, col["lower_bound"]))
        out["speedup_vs_interleave"] = total / planned if planned else 1.0
        out["stronger_baseline"] = "interleave" if total < naive else "naive"
    return out


def _rank_overhead(footer: dict[str, Any], micro: int) -> float | None:
    """The cost model's c per micro-batch, in cost units, for every micro-batch of a rank."""
    c = footer["config"]["cost"].get("c")
    if not c:
        return None
    return float(c) * float(footer.get("cost_scale") or 0.0) * micro


def _series(
    names: list[str],
    target: np.ndarray,
    amounts: np.ndarray,
    col: dict[str, np.ndarray],
    steps: int,
    points: int,
    first: int = 0,
) -> dict[str, Any]:
    size, starts = buckets(steps, points)
    if steps == 0:
        empty: dict[str, Any] = {"bucket": size, "start": [], "ratio": [], "naive_ratio": []}
        return {**empty, "interleave_ratio": [], "sources": []}
    counts = np.diff(np.append(starts, steps))

    def mean(x: np.ndarray) -> np.ndarray:
        return np.add.reduceat(np.asarray(x, dtype=np.float64), starts, axis=0) / (
            counts if x.ndim == 1 else counts[:, None]
        )

    realized = _shares(np.add.reduceat(amounts.astype(np.float64), starts, axis=0))
    want = mean(target)
    return {
        "bucket": size,
        "start": (starts + first).tolist(),
        "ratio": mean(ratio(col["max_rank_cost"], col["lower_bound"])).tolist(),
        "naive_ratio": mean(ratio(col["naive_max_rank_cost"], col["lower_bound"])).tolist(),
        "interleave_ratio": mean(ratio(inter, col["lower_bound"])).tolist()
        if (inter := col.get("interleave_max_rank_cost")) is not None
        else None,
        "sources": [
            {"name": n, "target": want[:, i].tolist(), "realized": realized[:, i].tolist()}
            for i, n in enumerate(names)
        ],
    }


def _format_version(path: Path | str) -> int:
    from mds.core import storage

    if storage.is_url(path):
        from mds.planner.index.objects import head

        return struct.unpack("<8sI", head(str(path), 12))[1]
    with open(path, "rb") as f:
        return struct.unpack("<8sI", f.read(12))[1]


def _header(reader: PlanReader) -> dict[str, Any]:
    footer = reader.footer
    config, train = footer["config"], footer["config"]["train"]
    return {
        "format_version": _format_version(reader.path),
        "plan_id": reader.plan_id,
        "bytes": reader.size,
        "steps": reader.steps,
        "first_step": reader.first_step,
        "last_step": reader.steps - 1,
        "lineage": footer.get("lineage"),
        "dp_size": reader.dp,
        "micro_batches": reader.micro,
        "samples_per_step": train.get("samples_per_step"),
        "tokens_per_step": train.get("tokens_per_step"),
        "weight_by": train.get("weight_by", "samples"),
        "capacity": train["max_tokens_per_micro_batch"],
        "overlong": train.get("overlong"),
        "seed": train.get("seed"),
        "cost": config["cost"],
        "cost_model": cost_model(config["cost"]),
        "cost_label": cost_label(config["cost"]),
        "cost_scale": footer.get("cost_scale"),
        "index_fingerprint": footer["index"]["fingerprint"],
        "index_path": footer["index"]["path"],
        "chunk_steps": config.get("chunk_steps"),
        "chunks": len(reader.chunks),
    }


def _sources(footer: dict[str, Any], mix: list[dict[str, Any]]) -> list[dict[str, Any]]:
    config = {s["name"]: s for s in footer["config"]["sources"]}
    out = []
    for share, planned in zip(mix, footer["sources"], strict=True):
        spec = config.get(planned["name"], {})
        keys = ("eligible", "samples", "tokens", "epochs", "epochs_started")
        out.append(
            {
                **share,
                **{k: planned.get(k) for k in keys},
                "dropped_overlong": planned.get("dropped_overlong", 0),
                "truncated": planned.get("truncated", 0),
                "weight": spec.get("weight"),
                "filter": spec.get("filter"),
                "max_epochs": spec.get("max_epochs"),
            }
        )
    return out


def plan_report(
    reader: PlanReader, index: str | Path | None = None, points: int = SERIES_POINTS
) -> dict[str, Any]:
    """The `mds inspect PLAN` report (docs/inspect.md, kind "plan")."""
    # Rows are steps first..steps-1: a re-planned plan starts at its hand-over step.
    footer, first = reader.footer, reader.first_step
    steps = reader.steps - first
    names = [s["name"] for s in footer["sources"]]
    if [s["name"] for s in footer["config"]["sources"]] != names:
        raise PlanError(f"{reader.path}: corrupt plan footer (sources differ from the config's)")
    col = step_stats(reader)
    unit, amounts = realized_amounts(reader, index)
    if amounts.shape != (steps, len(names)):
        raise PlanError(f"{reader.path}: corrupt plan (source_samples shape {amounts.shape})")
    target = target_shares(footer, reader.steps, first)
    cuts = [c - first for c in breakpoints(footer, reader.steps) if c > first]
    capacity = footer["config"]["train"]["max_tokens_per_micro_batch"]
    out = {
        "schema": SCHEMA,
        "kind": "plan",
        "path": str(reader.path),
        "header": _header(reader),
        "totals": {"samples": int(col["samples"].sum()), "tokens": int(col["tokens"].sum())},
        "share_unit": unit,
        "sources": _sources(footer, _mix(names, target, amounts, 0, steps)),
        "phases": [
            {"start": first + a, "end": first + b, "sources": _mix(names, target, amounts, a, b)}
            for a, b in phases(cuts, steps)
        ],
        "imbalance": _imbalance(col, reader.dp, _rank_overhead(reader.footer, reader.micro)),
        "capacity_fill": {
            "step": summary(ratio(col["tokens"], reader.dp * reader.micro * capacity)),
            "max_micro_batch": summary(ratio(col["max_micro_tokens"], capacity)),
        },
        "series": _series(names, target, amounts, col, steps, points, first),
        "warnings": epoch_warnings(footer["config"], footer["sources"]),
    }
    note = cost_note(footer, out["imbalance"]["speedup_vs_naive"])
    if "band" in note:  # the built-in default cost only
        out["imbalance"]["speedup_vs_naive_band"] = note["band"]
    vision = vision_report(reader.path, col, footer, index)
    if vision is not None:  # plans made with [vision] only
        out["vision"] = vision
    cp = cp_report(col, footer)
    if cp is not None:  # plans made with cp_size > 1 only
        out["cp"] = cp
    return out
