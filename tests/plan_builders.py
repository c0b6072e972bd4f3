"""Builders for the planning tests: tiny synthetic indexes, plan configs, fake pools, and
independent re-computations of what a plan must contain.

A plain module (tests/conftest.py puts tests/ on sys.path): `from plan_builders import ...`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from planfile_builders import footer_json

from mds.core.planfile_reader import PlanReader
from mds.planner.index.build import build_index
from mds.planner.index.config import load_config, parse_config
from mds.planner.plan.chunk import Planner
from mds.planner.plan.config import PlanConfig, load_plan_config, plan_config_from_dict
from mds.planner.plan.pool import SourcePool, quantize

REPO = Path(__file__).resolve().parents[1]
SAMPLE_CONFIG = REPO / "sample_data" / "mds.toml"
GOLDEN = REPO / "tests" / "golden" / "sample_plan.json"

# --- synthetic data ----------------------------------------------------------------------------


def write_source(root: Path, name: str, lengths: Sequence[int], **columns: Sequence[Any]) -> str:
    """root/<name>/data.parquet with an `n` length column plus metadata; returns its path."""
    path = root / name / "data.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {"n": pa.array([int(x) for x in lengths], pa.int64())}
    data.update({k: list(v) for k, v in columns.items()})
    pq.write_table(pa.table(data), path)
    return f"{name}/data.parquet"


def synthetic(
    root: Path,
    sources: dict[str, dict[str, Any]],
    train: dict[str, Any],
    *,
    cost: dict[str, Any] | None = None,
    plan: dict[str, Any] | None = None,
    build: bool = True,
) -> dict[str, Any]:
    """Write every source's data under `root`, index it into root/index, return the config.

    `sources` maps a name to {"lengths": [...], "weight": ..., "meta": {col: values}, plus
    any other [[source]] planning keys (filter, max_epochs)}.
    """
    tables = []
    for name, spec in sources.items():
        spec = dict(spec)
        lengths = spec.pop("lengths")
        meta = spec.pop("meta", {})
        path = write_source(root, name, lengths, **meta)
        table = {"name": name, "path": path, "count": "n", **spec}
        if meta:
            table["keep"] = list(meta)
        tables.append(table)
    data: dict[str, Any] = {"index": {"output": "index"}, "source": tables, "train": dict(train)}
    if cost is not None:
        data["cost"] = cost
    if plan is not None:
        data["plan"] = plan
    if build:
        index_data(root, data)
    return data


def index_data(root: Path, data: dict[str, Any], output: Path | None = None) -> Path:
    """Build the index of config `data` (as if it were root/config.toml) into root/index."""
    output = output or root / "index"
    build_index(parse_config(data, path=root / "config.toml"), output, workers=1)
    return output


def plan_config(root: Path, data: dict[str, Any], **train: Any) -> PlanConfig:
    """The PlanConfig of `data` (relative to root), with [train] keys overridden."""
    data = dict(data)
    data["train"] = {**data["train"], **train}
    data["train"] = {k: v for k, v in data["train"].items() if v is not None}
    return plan_config_from_dict(data, base=root)


def train_table(**keys: Any) -> dict[str, Any]:
    """A small valid [train] table (samples mode) with `keys` overriding; None removes a key."""
    table: dict[str, Any] = {
        "steps": 8,
        "dp_size": 2,
        "micro_batches": 2,
        "samples_per_step": 8,
        "max_tokens_per_micro_batch": 1000,
        "seed": 7,
    }
    table.update(keys)
    return {k: v for k, v in table.items() if v is not None}


def mix_only_config(
    weights: dict[str, Any], base: Path, **train: Any
) -> PlanConfig:  # no index needed
    """A PlanConfig for sources `weights` (name -> weight spec); nothing is read from disk."""
    data = {
        "source": [
            {"name": n, "path": f"{n}/*", "count": "n", "weight": w} for n, w in weights.items()
        ],
        "train": train_table(**train),
    }
    return plan_config_from_dict(data, base=base)


# --- the sample data ---------------------------------------------------------------------------

_SAMPLE_INDEX: dict[str, Path] = {}


def sample_index(tmp_path_factory) -> Path:
    """The sample data's index, built once per test session (do not modify it)."""
    if "index" not in _SAMPLE_INDEX:
        out = tmp_path_factory.mktemp("sample") / "index"
        build_index(load_config(SAMPLE_CONFIG), out, workers=1)
        _SAMPLE_INDEX["index"] = out
    return _SAMPLE_INDEX["index"]


def sample_plan_config(index: Path, **overrides: Any) -> PlanConfig:
    """sample_data/mds.toml planned from `index`; keyword args replace PlanConfig fields."""
    config = replace(load_plan_config(SAMPLE_CONFIG), index=Path(index).resolve())
    return replace(config, **overrides) if overrides else config


def sample_workdir(root: Path) -> Path:
    """root/data (a copy of sample_data), root/index and root/plan.mds; returns root."""
    from mds.planner.plan.build import build_plan, with_overrides

    shutil.copytree(REPO / "sample_data", root / "data")
    config = root / "data" / "mds.toml"
    build_index(load_config(config), root / "index", workers=1)
    build_plan(with_overrides(load_plan_config(config), index=root / "index"), root / "plan.mds")
    return root


GOLDEN_MTIME_NS = 1_767_225_600 * 10**9  # 2026-01-01: any fixed time


def golden_summary(workdir: Path) -> dict[str, Any]:
    """What tests/golden/sample_plan.json holds: copy sample_data to workdir/data with fixed
    mtimes (the plan records each file's size and mtime), index it into workdir/index, plan
    into workdir/plan.mds (fixed relative layout: the footer stores the index's and the
    data's paths relative to the plan), and return the `mds plan --json` summary minus path,
    seconds and how it ran (workers, notice), plus sha256."""
    from mds.planner.plan.build import build_plan, with_overrides

    workdir = Path(workdir)
    data = workdir / "data"
    shutil.copytree(SAMPLE_CONFIG.parent, data)
    for path in sorted(data.rglob("*")):
        os.utime(path, ns=(GOLDEN_MTIME_NS, GOLDEN_MTIME_NS), follow_symlinks=False)
    index = workdir / "index"
    build_index(load_config(data / SAMPLE_CONFIG.name), index, workers=1)
    plan = workdir / "plan.mds"
    config = with_overrides(load_plan_config(data / SAMPLE_CONFIG.name), index=index)
    summary = build_plan(config, plan, workers=1).to_json()
    out = json.loads(json.dumps(summary))  # exactly what `--json` prints, parsed back
    del out["path"], out["seconds"], out["workers"], out["notice"]
    out["sha256"] = hashlib.sha256(plan.read_bytes()).hexdigest()
    return out


# --- fake pools (no index) ---------------------------------------------------------------------


def make_pool(
    name: str,
    lengths: Sequence[int],
    *,
    index: int = 0,
    base: int = 0,
    rows: Sequence[int] | None = None,
    max_epochs: int | None = None,
    a: float = 1.0,
    b: float = 0.0,
) -> SourcePool:
    lengths = np.asarray(lengths, dtype=np.int64)
    rows = np.arange(len(lengths), dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
    L = lengths.astype(np.float64)
    return SourcePool(
        name=name,
        index=index,
        base=base,
        index_rows=len(rows),
        rows=rows,
        lengths=lengths,
        raw_costs=a * L + b * L * L,
        max_epochs=max_epochs,
    )


def make_pools(lengths: dict[str, Sequence[int]], **kwargs: Any) -> list[SourcePool]:
    pools, base = [], 0
    for i, (name, ls) in enumerate(lengths.items()):
        pools.append(make_pool(name, ls, index=i, base=base, **kwargs))
        base += len(ls)
    quantize(pools)
    return pools


# --- independent re-computations ----------------------------------------------------------------


def schedule_weights(spec: Any, steps: np.ndarray) -> np.ndarray:
    """A [[source]] `weight` value evaluated at integer steps, written without the library."""
    steps = np.asarray(steps, dtype=np.float64)
    if isinstance(spec, int | float):
        return np.full(steps.shape, float(spec))
    kind, points = "linear", spec
    if isinstance(spec, dict):
        ((kind, points),) = spec.items()
        kind = "linear" if kind == "points" else "stages"
    xs = [float(p[0]) for p in points]
    ys = [float(p[1]) for p in points]
    out = np.empty(steps.shape)
    for i, t in enumerate(steps):
        if t <= xs[0]:
            out[i] = ys[0]
        elif t >= xs[-1]:
            out[i] = ys[-1]
        else:
            k = max(j for j in range(len(xs)) if xs[j] <= t)
            if kind == "stages":
                out[i] = ys[k]
            else:
                f = (t - xs[k]) / (xs[k + 1] - xs[k])
                out[i] = ys[k] + f * (ys[k + 1] - ys[k])
    return out


def ideal_targets(weights: Sequence[Any], size: int, steps: int) -> np.ndarray:
    """[steps, sources]: size * cumulative sum of normalized weights (the mix's promise)."""
    w = np.stack([schedule_weights(s, np.arange(steps)) for s in weights], axis=1)
    return size * np.cumsum(w / w.sum(axis=1, keepdims=True), axis=0)


def plan_slots(plan: Path) -> list[tuple[int, int, int, int]]:
    """Every planned sample as (step, rank, micro_batch, global id), read with PlanReader."""
    from mds.core.planfile_reader import PlanReader

    out = []
    with PlanReader(plan) as reader:
        for c in range(len(reader.chunks)):
            for r in range(reader.dp):
                block = reader.rank_chunk(c, r)
                k = 0
                for t in range(block.counts.shape[0]):
                    for m in range(block.counts.shape[1]):
                        for _ in range(int(block.counts[t, m])):
                            out.append((block.step_start + t, r, m, int(block.ids[k])))
                            k += 1
    return out


def raw_chunk_blocks(plan: Path) -> list[list[bytes]]:
    """The bytes of every (chunk, rank) block, parsed from the file by hand (not PlanReader):
    the trailer gives the footer, the footer's layout the chunk directories."""
    data = plan.read_bytes()
    layout = footer_json(data)["layout"]
    dp = layout["dp_size"]
    out = []
    for chunk in layout["chunks"]:
        dir_offset, blocks = chunk[2], []
        for r in range(dp):
            off, n, _c = struct.unpack_from("<QQ8s", data, dir_offset + 24 * r)
            blocks.append(data[off : off + n])
        out.append(blocks)
    return out


def frame_key(frame: pl.DataFrame) -> pl.DataFrame:
    """The plan's content independent of slot order: (step, rank, source, row), sorted."""
    return frame.select("step", "rank", "source", "row").sort("step", "rank", "source", "row")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def approx_le(a: float, b: float, tol: float = 1e-6) -> bool:
    return a <= b + tol * max(1.0, abs(b))


__all__ = [
    "GOLDEN",
    "REPO",
    "SAMPLE_CONFIG",
    "approx_le",
    "ceil_div",
    "frame_key",
    "golden_summary",
    "ideal_targets",
    "index_data",
    "make_pool",
    "make_pools",
    "mix_only_config",
    "plan_config",
    "plan_slots",
    "raw_chunk_blocks",
    "sample_index",
    "sample_plan_config",
    "schedule_weights",
    "synthetic",
    "train_table",
    "write_source",
]


# --- re-planned plans ----------------------------------------------------------------------------


def step_ids(plan, first: int, last: int) -> dict[int, list[int]]:
    """step -> every rank's global ids, for steps [first, last)."""
    out: dict[int, list[int]] = {}
    with PlanReader(plan) as reader:
        for step in range(first, last):
            ids = []
            for rank in range(reader.dp):
                block = reader.rank_chunk(reader.chunk_of(step), rank)
                flat = block.counts.ravel()
                local = (step - block.step_start) * reader.micro
                start = int(flat[:local].sum())
                ids += block.ids[
                    start : start + int(flat[local : local + reader.micro].sum())
                ].tolist()
            out[step] = ids
    return out


def stream_prefix(config, consumed: dict[str, int]) -> Counter:
    """The global ids of each source's first `consumed` stream positions: what a run that
    never changed course would have drawn, epoch after epoch, without repeats or skips."""
    planner = Planner(config)
    out: Counter = Counter()
    for pool, stream in zip(planner.pools, planner.streams, strict=True):
        n = consumed.get(pool.name, 0)
        out.update((pool.base + pool.rows[stream.positions(0, n)]).tolist())
    return out


def per_source(plan, ids) -> dict[str, int]:
    """Samples per source name among global ids (the index's id ranges, from the plan)."""
    with PlanReader(plan) as reader:
        ranges = [
            (s["base"], s["base"] + s["rows"], s["name"]) for s in reader.footer["index"]["sources"]
        ]
    counts: Counter = Counter()
    for gid in ids:
        counts[next(name for lo, hi, name in ranges if lo <= gid < hi)] += 1
    return dict(counts)
