"""Re-planning from step K: the exact mixing state a plan reached at K, as the start of a
new plan with another config (mix, schedule, dp_size, micro-batches, sources).

Every source continues from its stream position at K, so nothing consumed before K is
drawn again inside the same epoch and nothing unconsumed is skipped. The new schedule's
cumulative target starts at what each source had consumed, so the mix from K follows the
new weights exactly. A source that leaves the mix keeps its cursor in the lineage, so a
later plan that brings it back continues it too.

With an exclusion (`--exclude`, plan/exclude.py) the listed samples leave their sources'
streams from K on: each cursor is carried over to the stream without them (the next kept
draw at or after it), so the other samples keep their order. A plan's exclusions hold for
every plan derived from it (its `excluded` section). Cursors a lineage carries for sources
out of the mix are positions of the stream without exclusions.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mds.core.index_manifest import index_sources
from mds.core.planfile_reader import PlanReader
from mds.errors import ConfigError, PlanError
from mds.planner.plan.exclude import Exclusion, positions_of
from mds.planner.plan.mixing import MixState

if TYPE_CHECKING:
    from mds.planner.plan.chunk import Planner

__all__ = ["derive_start", "parent_cursors"]


def parent_cursors(
    reader: PlanReader, at_step: int
) -> tuple[dict[str, tuple[int, int | None]], dict[str, int]]:
    """A plan's cursors at step K: per source (stream position, tokens at the chunk boundary
    before K, or None in samples mode), including sources its own lineage carries; and the
    samples each planned source took between that boundary and K."""
    first, steps = reader.first_step, reader.steps
    if not first <= at_step <= steps:
        raise ConfigError(
            f"--at-step {at_step} is outside {reader.path}'s steps {first} to {steps}"
        )
    footer = reader.footer
    names = [s["name"] for s in footer["sources"]]
    reader.verify_sections()
    consumed = reader.section("cursor_consumed")
    tokens = reader.section("cursor_tokens")
    per_step = reader.section("source_samples")
    chunk = len(reader.chunks) if at_step == steps else reader.chunk_of(at_step)
    start = reader.chunks[chunk][0] if chunk < len(reader.chunks) else steps
    rows = (len(reader.chunks) + 1, len(names))
    if consumed.shape != rows or tokens.shape != rows or per_step.shape[1:] != rows[1:]:
        raise PlanError(f"{reader.path}: corrupt plan (cursor sections do not match its sources)")
    taken = per_step[start - first : at_step - first].sum(axis=0)
    tokens_mode = footer["config"]["train"].get("tokens_per_step") is not None
    out: dict[str, tuple[int, int | None]] = dict(
        (name, tuple(c)) for name, c in (footer.get("lineage") or {}).get("cursors", {}).items()
    )
    for s, name in enumerate(names):
        out[name] = (
            int(consumed[chunk, s] + taken[s]),
            int(tokens[chunk, s]) if tokens_mode else None,
        )
    return out, {name: int(taken[s]) for s, name in enumerate(names)}


def _index_problem(planner: Planner, footer: dict[str, Any]) -> str | None:
    """The new index must hold every source of the parent's index unchanged (same rows in
    the same global id range), so the parent's sample ids mean the same samples."""
    now = {s["name"]: s for s in index_sources(planner.manifest)}
    for s in footer["index"]["sources"]:
        if now.get(s["name"]) != s:
            return s["name"]
    return None


def parent_excluded(reader: PlanReader) -> np.ndarray:
    """The global ids a plan leaves out (its own exclusions and its ancestors'), sorted."""
    if "excluded" not in reader.sections:
        return np.zeros(0, np.int64)
    return np.asarray(reader.section("excluded"), dtype=np.int64)


def derive_start(
    planner: Planner,
    parent: Path | str,
    at_step: int,
    exclusion: Exclusion | None = None,
    start_step: int | None = None,
) -> tuple[MixState, dict[str, Any]]:
    """The start state at `at_step` for `planner`'s config, continuing plan `parent`, and the
    lineage the new plan's footer records. With `exclusion`, its samples leave the streams
    (the planner's config and streams are updated; see the module docstring). `start_step`:
    the new plan's step that continues the parent's `at_step` (default: the same step; a
    plan that skips steps continues the parent's end earlier)."""
    start = at_step if start_step is None else start_step
    with PlanReader(parent) as reader:
        footer = reader.footer
        old = footer["config"]
        new = planner.config
        if old["train"]["seed"] != new.train.seed:
            raise ConfigError(
                f"[train] seed {new.train.seed} differs from {parent}'s {old['train']['seed']}: "
                "every source's order would change; keep the seed when re-planning"
            )
        if (old["train"].get("tokens_per_step") is None) != (new.train.tokens_per_step is None):
            raise ConfigError(
                "[train] samples_per_step / tokens_per_step: keep the parent plan's step unit"
            )
        if new.train.steps <= start:
            what = "--at-step" if start_step is None else "the steps kept of the old plan"
            raise ConfigError(f"[train] steps {new.train.steps} must be > {what} {start}")
        changed = _index_problem(planner, footer)
        if changed is not None:
            raise PlanError(
                f"source {changed!r} differs between {parent}'s index and this one; re-plan "
                "from the index the parent plan was made from (sources may only be added)"
            )
        cursors, taken = parent_cursors(reader, at_step)
        filters = {s["name"]: s.get("filter") for s in old["sources"]}
        eligible = {s["name"]: s["eligible"] for s in footer["sources"]}
        parent_id = reader.plan_id
        before = parent_excluded(reader)
    planned = set(eligible)  # the parent's own sources: cursors of its (kept) streams
    new_ids = exclusion.ids if exclusion is not None else np.zeros(0, np.int64)
    every = np.union1d(before, new_ids).astype(np.int64)
    live = {pool.name for pool in planner.pools}
    for name in planned - live:
        pool_base = next(s for s in footer["index"]["sources"] if s["name"] == name)
        lo, hi = int(pool_base["base"]), int(pool_base["base"]) + int(pool_base["rows"])
        if ((before >= lo) & (before < hi)).any():
            raise ConfigError(
                f"source '{name}' leaves the mix but {parent} excludes some of its samples; "
                "keep it in the config with weight 0 so its cursor stays exact"
            )
    report: dict[str, dict[str, int]] = {}
    left_out: list[tuple[str, np.ndarray]] = []
    n = len(planner.pools)
    consumed = np.zeros(n, np.int64)
    tokens = np.zeros(n, np.int64)
    for i, (pool, stream) in enumerate(zip(planner.pools, planner.streams, strict=True)):
        if pool.name not in cursors:
            continue  # a source new to the mix starts at the beginning of its stream
        spec = new.sources[i]
        if pool.name in filters and filters[pool.name] != spec.filter:
            raise ConfigError(
                f"source '{pool.name}': `filter` changed from {filters[pool.name]!r} to "
                f"{spec.filter!r}; its remaining epoch order would change, so it cannot "
                "continue (add it as a new source name instead)"
            )
        if pool.name in eligible and eligible[pool.name] != pool.n:
            raise ConfigError(
                f"source '{pool.name}': {pool.n} eligible samples, the parent plan had "
                f"{eligible[pool.name]} (`overlong` or the capacity changed which samples "
                "qualify); keep them as they were"
            )
        consumed[i], tok = cursors[pool.name]
        stream.exclude(positions_of(pool, before)[0])  # the parent's stream
        if tok is not None:
            between = taken.get(pool.name, 0)  # tokens of the steps from the boundary to K
            tokens[i] = tok + stream.tokens_between(int(consumed[i]) - between, between)
        raw = stream.raw_position(int(consumed[i])) if pool.name in planned else int(consumed[i])
        if len(every):
            mine, ineligible = positions_of(pool, every)
            stream.exclude(mine)
            consumed[i] = stream.position_of_raw(raw)
            left_out.append((pool.name, mine))
            if exclusion is not None:
                report[pool.name] = _excluded_report(stream, pool, new_ids, raw)
    for pool, stream in zip(planner.pools, planner.streams, strict=True):
        if pool.name not in cursors and len(every):  # new to the mix: excluded from the start
            mine, _ = positions_of(pool, every)
            stream.exclude(mine)
            left_out.append((pool.name, mine))
            if exclusion is not None:
                report[pool.name] = _excluded_report(stream, pool, new_ids, 0)
    planner.config = replace(planner.config, excluded=tuple(left_out))
    planner.excluded_ids = every
    target = (tokens if new.train.tokens_per_step else consumed).astype(np.float64)
    # the cursors of the sources out of the mix (the new plan's own are in its sections)
    carried = {name: c for name, c in cursors.items() if name not in live}
    lineage = {
        "parent": parent_id,
        "at_step": at_step,
        "cursors": {name: list(c) for name, c in sorted(carried.items())},
    }
    if exclusion is not None:
        lineage["exclude"] = exclusion_lineage(exclusion, report, planner)
    return MixState(start, consumed, tokens, target), lineage


def cursor_state(planner: Planner, reader: PlanReader, old_step: int, new_step: int) -> MixState:
    """The mixing state of the parent plan (`reader`) at its step `old_step`, as the state of
    the new plan at `new_step`: the cursors of the parent's streams (the planner's streams
    must be the parent's: same sources, same exclusions)."""
    cursors, taken = parent_cursors(reader, old_step)
    n = len(planner.pools)
    consumed, tokens = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for i, (pool, stream) in enumerate(zip(planner.pools, planner.streams, strict=True)):
        consumed[i], tok = cursors[pool.name]
        if tok is not None:
            between = taken.get(pool.name, 0)
            tokens[i] = tok + stream.tokens_between(int(consumed[i]) - between, between)
    target = (tokens if planner.config.train.tokens_per_step else consumed).astype(np.float64)
    return MixState(new_step, consumed, tokens, target)


def _excluded_report(stream, pool, new_ids: np.ndarray, raw: int) -> dict[str, int]:
    """For one planned source: the list's samples that matched it, how many of them the
    stream had already drawn before K (raw cursor `raw`), how many are not eligible."""
    mine, ineligible = positions_of(pool, new_ids)
    epoch, offset = divmod(raw, pool.n) if pool.n else (0, 0)
    if epoch >= 1:
        trained = len(mine)
    else:
        trained = int((stream.offsets(mine, 0) < offset).sum())
    return {"matched": len(mine) + ineligible, "trained_before": trained, "ineligible": ineligible}


def exclusion_lineage(exclusion: Exclusion, report: dict, planner: Planner) -> dict[str, Any]:
    """What the footer's lineage records of an exclude list (docs/plan-format.md)."""
    sources = {}
    for entry in index_sources(planner.manifest):
        name = entry["name"]
        base, rows = int(entry["base"]), int(entry["rows"])
        matched = int(((exclusion.ids >= base) & (exclusion.ids < base + rows)).sum())
        if not matched and name not in exclusion.given:
            continue
        mine = report.get(name, {"matched": matched, "trained_before": 0, "ineligible": 0})
        sources[name] = {
            "given": exclusion.given.get(name, 0),
            **mine,
            "planned": name in report,
        }
    return {
        "list": exclusion.name,
        "digest": exclusion.digest,
        "entries": exclusion.entries,
        "matched": int(len(exclusion.ids)),
        "trained_before": sum(s["trained_before"] for s in sources.values()),
        "sources": sources,
    }
