"""A plan's footer, the JSON at the end of the file (docs/plan-format.md): the config, the
index the plan was made from, per-source totals, what the executor needs to fetch samples,
and the paths recorded relative to the plan's directory so the bytes do not depend on
where the tree lies."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from mds.core import storage
from mds.core.index_manifest import index_sources
from mds.planner.plan.chunk import Planner, stat_columns
from mds.planner.plan.fetch import source_facts
from mds.planner.plan.mixing import MixState
from mds.planner.plan.pool import COST_SCALE
from mds.planner.runtime.outputs import recorded_root

__all__ = ["PLAN_FORMAT", "fetch_facts", "index_anchor", "plan_footer", "recorded_path"]

PLAN_FORMAT = "mds-plan"


def plan_footer(
    planner: Planner, output: Path | str, final: MixState, stats: np.ndarray
) -> dict[str, Any]:
    """The plan's footer: the config, the index it was made from, what each source gave
    (samples, epochs, tokens), what the executor needs to fetch samples (fetch_facts), the
    cost scale and the stats' columns; a derived plan's first step and lineage."""
    config, manifest = planner.config, planner.manifest
    peak = max((float(p.raw_costs.max()) for p in planner.pools if p.n), default=0.0)
    sources = []
    for s, pool in enumerate(planner.pools):
        consumed = int(final.consumed[s])
        size = planner.streams[s].epoch_size  # eligible less excluded (plan/stream.py)
        sources.append(
            {
                "name": pool.name,
                "base": pool.base,
                "eligible": pool.n,
                "dropped_overlong": pool.dropped,
                "truncated": pool.truncated,
                "samples": consumed,
                "tokens": int(final.tokens[s]) if config.train.tokens_per_step else None,
                "epochs": round(consumed / size, 6) if size else 0.0,
                "epochs_started": -(-consumed // size) if size else 0,
            }
        )
        if size != pool.n:  # --exclude left samples out of the stream's epochs
            sources[-1]["epoch_size"] = size
    return {
        "format": PLAN_FORMAT,
        "config": config.canonical(),
        "index": {
            "fingerprint": manifest.fingerprint,
            "path": planner.index_place
            or recorded_path(str(manifest.path), output, index_anchor(planner)),
            "sources": index_sources(manifest),
        },
        "sources": sources,
        "fetch": fetch_facts(planner, output),
        "cost_scale": (COST_SCALE / peak) if peak > 0 else 0.0,
        "stats_columns": list(stat_columns(config)),
        "steps": config.train.steps,
        **({"online": config.segment} if config.segment is not None else {}),
        **(
            {"first_step": planner.first_step, "lineage": planner.lineage}
            if planner.lineage is not None
            else {}
        ),
    }


def recorded_path(path: str, plan: Path | str, anchor: Path | None = None) -> str:
    """`path` as a plan at `plan` records it: a URL as it is; a file relative to the plan's
    directory, or, for a plan written to object storage, relative to `anchor`, the directory
    of the local index it was made from (index_anchor), so that it records what a plan
    written beside that index records (the same plan id); absolute without an anchor."""
    if storage.is_url(path):
        return path
    if storage.is_url(plan):
        return os.path.relpath(path, anchor) if anchor is not None else os.path.abspath(path)
    return os.path.relpath(path, Path(plan).parent)


def index_anchor(planner: Planner) -> Path | None:
    """Where a plan written to object storage is taken to lie for the local paths it
    records: the directory that holds the local index it was made from (a tree copied to
    the store keeps that layout, and the plan resolves them against its own URL). None for
    an index in the store: local paths are then recorded absolute."""
    if planner.index_place is not None:
        return None
    return Path(os.path.abspath(planner.manifest.path)).parent


def fetch_facts(planner: Planner, output: Path | str) -> dict[str, Any]:
    """What the executor needs besides the blocks' records: the data root (relative to the
    plan's directory, as the index's path is, so the bytes do not depend on where the
    tree lies), and for each planned source how to read and tokenize it."""
    manifest = planner.manifest
    sources = {}
    for pool in planner.pools:
        sources[pool.name] = source_facts(manifest.source(pool.name))
    root = manifest.data["root"]
    if storage.is_url(output):
        return {"root": recorded_path(root, output, index_anchor(planner)), "sources": sources}
    return {"root": recorded_root(root, Path(output).parent), "sources": sources}
