"""Build a plan: mix, select, balance and encode every step, chunk by chunk.

A chunk of steps [a, b) is a pure function of the config, the index and the mixing state
at a (plan/chunk.py). A sequential pass computes the states (and counts) chunk by chunk,
ahead of the chunks themselves, which are planned independently (in worker processes
with --workers) and written in order, then the footer (plan/footer.py).
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from mds.core import storage
from mds.core.planfile import MAGIC, encode_chunk, plan_id_of
from mds.core.planfile_writer import PlanWriter
from mds.errors import ConfigError, Interrupted, PlanError
from mds.planner.index.objects import head, relative_key
from mds.planner.index.tables import MANIFEST, IndexManifest, download_index
from mds.planner.plan.chunk import ChunkResult, Planner, stat_columns
from mds.planner.plan.config import (
    PlanConfig,
    check_chunk_size,
    check_train,
    epoch_warnings,
    with_cp_linear,
)
from mds.planner.plan.cost_band import cost_band
from mds.planner.plan.cost_label import cost_note
from mds.planner.plan.exclude import Exclusion
from mds.planner.plan.footer import plan_footer
from mds.planner.plan.mixing import MixState
from mds.planner.runtime import upload
from mds.planner.runtime.atomic import clean_stale_temps, temp_sibling
from mds.planner.runtime.engine import Engine, EngineSpec, fork_shares_memory, open_engine
from mds.planner.runtime.lock import output_lock
from mds.planner.runtime.malloc import keep_freed_memory

__all__ = ["PlanSummary", "build_plan", "with_overrides"]


@dataclass
class PlanSummary:
    path: str
    plan_id: str
    steps: int
    dp_size: int
    micro_batches: int
    samples: int
    tokens: int
    bytes: int
    ratio_mean: float
    ratio_max: float
    naive_ratio_mean: float
    naive_ratio_max: float
    speedup_vs_naive: float
    interleave_ratio_mean: float
    interleave_ratio_max: float
    speedup_vs_interleave: float
    stronger_baseline: str  # "naive" or "interleave": the one whose max rank cost is lower
    seconds: float
    sources: list[dict[str, Any]] = field(default_factory=list)
    workers: int = 1  # processes (or Ray tasks in flight) that planned chunks; 1: this one
    notice: str | None = None  # why fewer workers were used than asked for
    # Plans with [vision]: {"encoder" | "backbone": {"ratio_mean", "ratio_max",
    # "naive_ratio_mean"}}, each part's most-loaded rank over its own lower bound.
    parts: dict[str, dict[str, float]] | None = None
    # Plans with cp_size > 1: the step time over DP x CP ranks over its lower bound for
    # mds's CP layout, head-tail everywhere and contiguous, and the CP layout's figures
    # (plan/cp.py, docs/context-parallel.md).
    cp: dict[str, Any] | None = None
    # Which cost the predictions use ({kind, label}), and with the built-in default cost the
    # speedup's range over b x 0.25 to b x 4 (`band`; plan/cost_label.py cost_note).
    cost: dict[str, Any] = field(default_factory=dict)
    # Steps first_step..steps-1 are planned (> 0 for a plan re-planned from another at K).
    first_step: int = 0
    # What the user should know before a long run: sources drawn more epochs than their
    # warn_epochs (config.epoch_warnings), one line each.
    warnings: list[str] = field(default_factory=list)
    # A re-plan with --exclude: what its lineage records of the list (plan/derive.py); with
    # --skip-steps: the old plan's step ranges [A, B) left out.
    exclude: dict[str, Any] | None = None
    skipped: list[list[int]] | None = None

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        if self.parts is None:
            del out["parts"]
        if self.cp is None:
            del out["cp"]
        for key in ("exclude", "skipped"):
            if out[key] is None:
                del out[key]
        # Only with the built-in default cost (its label and band), so the summaries of
        # plans with a [cost] keep their keys; `mds inspect` names every plan's cost.
        if self.cost.get("kind") != "default":
            del out["cost"]
        out["bytes_per_sample"] = round(self.bytes / self.samples, 3) if self.samples else None
        out["seconds"] = round(self.seconds, 3)
        return out


# Worker plumbing: each worker (a local process or a Ray worker) builds the Planner of a
# run once, keyed by the run's id, and plans that run's chunks with it.
_WORKER: tuple[str, Planner] | None = None


def _init_worker(run: str, config: PlanConfig) -> None:
    global _WORKER
    _WORKER = (run, Planner(config))


def _init_local_worker(run: str, config: PlanConfig) -> None:
    """A spawned planning process: malloc tuned (src/mds/planner/runtime/malloc.py), then the planner."""
    keep_freed_memory()
    _init_worker(run, config)


def _run_chunk(
    run: str, config: PlanConfig, state: MixState, end: int, counts: np.ndarray
) -> ChunkResult:
    """The unit of work an engine runs: steps [state.step, end) of the run `run`, its
    blocks encoded here (the writer then only copies bytes)."""
    if _WORKER is None or _WORKER[0] != run:
        _init_worker(run, config)
    assert _WORKER is not None
    planner = _WORKER[1]
    result = planner.plan_chunk(state, end, counts)
    train = planner.config.train
    result.blocks = encode_chunk(
        result.blocks, end - state.step, train.micro_batches, planner.id_width
    )
    return result


def with_overrides(
    config: PlanConfig,
    steps: int | None = None,
    dp_size: int | None = None,
    index: Path | str | None = None,
    micro_batches: int | None = None,
    samples_per_step: int | None = None,
) -> PlanConfig:
    """Apply --steps / --dp-size / --micro-batches / --samples-per-step / --index, each as if
    written in [train] (the plan's footer records the values used), and redo the checks
    between [train]'s keys that they affect."""
    if index is not None:
        where = str(index).rstrip("/") if storage.is_url(index) else Path(index).resolve()
        config = replace(config, index=where)
    train = config.train
    if steps is not None:
        if steps < 1:
            raise ConfigError(f"--steps must be >= 1, got {steps}")
        train = replace(train, steps=steps)
    if micro_batches is not None:
        if micro_batches < 1:
            raise ConfigError(f"--micro-batches must be >= 1, got {micro_batches}")
        train = replace(train, micro_batches=micro_batches)
    if samples_per_step is not None:
        if samples_per_step < 1:
            raise ConfigError(f"--samples-per-step must be >= 1, got {samples_per_step}")
        if train.samples_per_step is None:
            raise ConfigError(
                "--samples-per-step: the config sizes a step in tokens (`tokens_per_step`); "
                "set samples_per_step in [train] instead to size it in samples"
            )
        train = replace(train, samples_per_step=samples_per_step)
    if dp_size is not None:
        if dp_size < 1:
            raise ConfigError(f"--dp-size must be >= 1, got {dp_size}")
        train = replace(train, dp_size=dp_size)
        if train.samples_per_step is not None and train.samples_per_step < dp_size:
            raise ConfigError(
                f"--dp-size {dp_size} exceeds samples_per_step = {train.samples_per_step}"
            )
        room = train.bins * train.max_tokens_per_micro_batch
        if train.tokens_per_step is not None and train.tokens_per_step > room:
            # the check parse_train makes, redone for the new geometry
            raise ConfigError(
                f"--dp-size {dp_size}: tokens_per_step ({train.tokens_per_step}) exceeds the "
                f"step's capacity dp_size x micro_batches x max_tokens_per_micro_batch = {room}"
            )
    flags = "--steps/--dp-size"
    flags += "/--micro-batches" if micro_batches is not None else ""
    flags += "/--samples-per-step" if samples_per_step is not None else ""
    check_train(train, f"{flags}: ")  # parse_train's checks, for the new geometry
    train = with_cp_linear(train, config.cost, config.vision, "--dp-size: ")
    check_chunk_size(train, config.chunk_steps, f"{flags}: ")
    return replace(config, train=train)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    # An empty step (possible with tokens_per_step) is perfectly balanced: ratio 1, not 0.
    return np.where(den > 0, num / np.maximum(den, 1), 1.0)


def build_plan(
    config: PlanConfig,
    output: Path,
    *,
    workers: int | None = None,
    progress: Any = None,
    parent: Path | str | None = None,
    at_step: int | None = None,
    engine: EngineSpec | None = None,
    index_place: str | None = None,
    manifest: IndexManifest | None = None,
    exclusion: Exclusion | None = None,
    skipped: list[tuple[int, int]] | None = None,
) -> PlanSummary:
    """Plan every step of `config` into the file `output` (written atomically). With
    `parent` and `at_step` K, plan steps [K, steps) continuing the parent plan's cursors
    (see src/mds/planner/plan/derive.py). `engine`: where chunks are planned (default: the config's
    [plan] engine, else local processes with more than one worker, else this process).
    An index in object storage (config.index an s3:// URL) is downloaded to a temporary
    directory first; `output` may be an s3:// URL too (see _build_to_object). `manifest`:
    the local index's manifest, when the caller has read it already. `exclusion`: with
    `parent`, samples left out from K on (plan/exclude.py). `skipped`: with `parent`, the
    parent's step ranges [A, B) left out, the rest kept as it is (plan/skip.py)."""
    started = time.perf_counter()
    engine = engine or EngineSpec(config.engine, config.address)
    if storage.is_url(output):
        _check_object_output(str(output), config.index)
    if storage.is_url(config.index):
        with tempfile.TemporaryDirectory(prefix="mds-index-") as tmp:
            url = str(config.index)
            local = replace(config, index=download_index(url, Path(tmp) / "index"))
            return build_plan(
                local,
                output,
                workers=workers,
                progress=progress,
                parent=parent,
                at_step=at_step,
                engine=engine,
                index_place=url,
                exclusion=exclusion,
                skipped=skipped,
            )
    if (exclusion is not None or skipped) and parent is None:
        raise ConfigError("--exclude and --skip-steps re-plan a plan: give --from PLAN --at-step K")
    if exclusion is not None and skipped:
        raise ConfigError(
            "--skip-steps and --exclude: give them to two re-plans (skip first, then exclude "
            "from the skipping plan), so each keeps its promise"
        )
    args = (workers, parent, at_step, progress, engine, index_place, manifest, exclusion, skipped)
    if storage.is_url(output):
        with output_lock(str(output)) as held:
            return _build_to_object(config, str(output), held, *args)
    output = Path(output).resolve()
    with output_lock(output):
        _check_replaceable(output)
        return _build_locked(config, output, started, None, *args)


def _check_object_output(url: str, index: Path | str | None) -> None:
    """Refuse a plan URL that is, or holds, the index prefix, or replaces an object that is
    not a plan (an index's manifest or table, a source object, anything else)."""
    if storage.is_url(index):
        if relative_key(url, str(index)) == "":
            raise ConfigError(f"-o {url} is the index directory {index}; choose another output")
        if relative_key(str(index), url) is not None:
            raise ConfigError(f"-o {url} holds the index directory {index}; choose another output")
    _check_replaceable(url)


def _check_replaceable(output: Path | str) -> None:
    """A plan replaces only a plan: an existing file or object at `output` that has bytes and
    does not start as an mds plan does is someone else's, and is refused."""
    if storage.is_url(output):
        if not storage.exists(output):
            return
        first = head(str(output), len(MAGIC))
    else:
        try:
            with open(output, "rb") as f:
                first = f.read(len(MAGIC))
        except OSError:  # missing, or not a file: the write says what is wrong, if anything
            return
    if first and first != MAGIC:
        raise ConfigError(f"{output}: exists and is not an mds plan; pick another -o/--output")


def _build_to_object(config, url, held, *args) -> PlanSummary:
    """Plan into a local temporary file, then upload it as one object (upload.put_file): a
    failed or interrupted run leaves the previous object at `url` as it was, never a
    partial one. The recorded paths are those of the plan's place, `url`. `held`: its lock
    object, checked before the upload."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mds-plan-") as tmp:
        local = Path(tmp) / url.rsplit("/", 1)[-1]
        summary = _build_locked(config, local, started, url, *args)
        held.check()
        try:
            upload.put_file(local, url)
        except Interrupted:
            raise Interrupted(
                f"the new plan was written whole to {url} just before the interrupt"
            ) from None
    return replace(summary, path=url, seconds=time.perf_counter() - started)


def _build_locked(
    config,
    output,
    started,
    place,
    workers,
    parent,
    at_step,
    progress,
    engine,
    index_place,
    manifest,
    exclusion,
    skipped,
) -> PlanSummary:
    """The part of build_plan that writes, under the output's lock."""
    train = config.train
    chunks = -(-train.steps // config.chunk_steps)
    asked = workers or config.workers or 1
    run = uuid.uuid4().hex
    notice = None
    if engine.kind == "local":
        workers = max(1, min(asked, chunks, os.cpu_count() or 1))
        if asked > 1 and chunks == 1:
            notice = (
                f"1 of {asked} workers used: the plan's {train.steps} steps are one chunk "
                f"(chunk_steps = {config.chunk_steps}); a smaller chunk_steps plans in parallel"
            )
    else:  # on Ray, None: as many chunks in flight as the cluster has CPUs
        workers = min(workers, chunks) if workers else workers
    # Local workers are forked once this process has loaded the index, and share its pages;
    # where fork is not available they are spawned now and load the index while this
    # process does (a re-plan's, once its parent has given the config its exclusions, so
    # that each loads it once). Ray workers load it with their first chunk.
    fork = engine.kind == "local" and workers > 1 and fork_shares_memory()
    spawned = engine.kind != "local" or (workers > 1 and not fork)
    pool = _spawn(engine, workers, run, config) if spawned and parent is None else None
    failed = True
    global _WORKER
    try:
        planner = Planner(config, manifest)
        planner.index_place = index_place
        if parent is not None:
            assert at_step is not None
            _derive(planner, storage.as_place(parent), at_step, exclusion, skipped, place or output)
            if spawned:
                pool = _spawn(engine, workers, run, planner.config)
        if fork:
            _WORKER = (run, planner)  # what every forked worker starts with
            pool = open_engine(
                engine, workers, processes=True, fork=True, initializer=keep_freed_memory
            )
            _WORKER = None
        data, footer, stats_arr = _write(planner, output, pool, run, progress, place)
        failed = False
    finally:
        _WORKER = None
        if pool is not None:
            pool.close(wait=not failed)
    plan_id = plan_id_of(data)
    used = pool.workers if pool is not None else 1
    return _summary(
        output,
        plan_id,
        planner,
        stats_arr,
        footer,
        time.perf_counter() - started,
        workers=used,
        notice=notice,
    )


def _spawn(engine: EngineSpec, workers, run: str, config: PlanConfig) -> Engine:
    """Worker processes (or Ray tasks) that each make the run's Planner from `config` once;
    each must see a local index, checked first."""
    pool = open_engine(
        engine, workers, processes=True, initializer=_init_local_worker, initargs=(run, config)
    )
    if not storage.is_url(config.index):
        try:
            pool.check_visible([(f"index {config.index}", str(Path(config.index) / MANIFEST))])
        except BaseException:
            pool.close(wait=False)
            raise
    return pool


def _derive(planner: Planner, parent, at_step: int, exclusion, skipped, output) -> None:
    """Set `planner` to continue plan `parent` from `at_step` (plan/derive.py), leaving out
    `exclusion`'s samples or the `skipped` steps (plan/skip.py)."""
    from mds.core.planfile_reader import PlanReader
    from mds.planner.plan.derive import derive_start
    from mds.planner.plan.footer import index_anchor, recorded_path
    from mds.planner.plan.skip import check_skips, kept_segments

    if not skipped:
        planner.start, planner.lineage = derive_start(planner, parent, at_step, exclusion)
    else:
        with PlanReader(parent) as reader:
            if not reader.first_step <= at_step < reader.steps:
                raise ConfigError(
                    f"--at-step {at_step} is outside {parent}'s steps "
                    f"{reader.first_step} to {reader.steps - 1}"
                )
            check_skips(reader, planner, at_step, skipped)
            end = reader.steps
        segments = kept_segments(at_step, end, skipped)
        kept = sum(hi - lo for _new, lo, hi in segments)
        planner.start, planner.lineage = derive_start(
            planner, parent, end, start_step=at_step + kept
        )
        planner.lineage["at_step"] = at_step
        planner.lineage["skipped"] = [[a, b] for a, b in skipped]
        planner.parent, planner.copied = parent, segments
    planner.lineage["parent_path"] = recorded_path(str(parent), output, index_anchor(planner))


def _chunks(planner: Planner, pool: Engine | None, run: str, states: list[MixState]):
    """Planned chunks in order. The sequential mixing pass runs here, ahead of the workers,
    which get each chunk's counts with its start state. A plan that skips steps copies the
    parent's kept steps first (plan/skip.py)."""
    if planner.copied:
        from mds.planner.plan.skip import copied_chunks

        yield from copied_chunks(planner, planner.parent, planner.copied, states)
    states.append(planner.start_state())
    if pool is None:
        for state, b, counts, after in planner.mix_chunks():
            states.append(after)
            yield planner.plan_chunk(state, b, counts)
        return

    def units():
        for state, b, counts, after in planner.mix_chunks():
            states.append(after)
            yield run, planner.config, state, b, counts

    # _run_chunk is looked up here, at call time, so a test can wrap it.
    yield from pool.map(_run_chunk, units(), window=2 * pool.workers + 1)


def _write(planner: Planner, output: Path, pool: Engine | None, run: str, progress, place=None):
    """Plan every chunk (in `pool` when given) and write the file; returns footer bytes.
    `place`: where the plan will live if not at `output` (an object's URL)."""
    train = planner.config.train
    try:  # a PlanWriter that fails to start removes its temporary itself
        output.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(output)
        writer = PlanWriter(
            output,
            temp_sibling(output),
            dp_size=train.dp_size,
            micro_batches=train.micro_batches,
            id_width=planner.id_width,
        )
    except OSError as exc:
        raise _cannot_write(output, exc) from exc
    if progress is not None:
        progress.start(train.steps - planner.first_step)
    stats, mixed, bands = [], [], []
    states: list[MixState] = []
    try:
        for result in _chunks(planner, pool, run, states):
            writer.add_chunk(result.start, result.end, result.blocks)
            stats.append(result.stats)
            mixed.append(result.source_samples)
            if result.band is not None:
                bands.append(result.band)
            if progress is not None:
                progress.advance(result.end - result.start)
        stats_arr = (
            np.concatenate(stats)
            if stats
            else np.zeros((0, len(stat_columns(planner.config))), np.int64)
        )
        mixed_arr = np.concatenate(mixed) if mixed else np.zeros((0, len(planner.pools)), np.int64)
        writer.add_section("stats", stats_arr)
        writer.add_section("source_samples", mixed_arr, sparse=True)
        writer.add_section("cursor_consumed", np.stack([s.consumed for s in states]))
        writer.add_section("cursor_tokens", np.stack([s.tokens for s in states]))
        writer.add_section("cursor_target", np.stack([s.target for s in states]))
        if len(planner.excluded_ids):
            writer.add_section("excluded", planner.excluded_ids.astype(np.int64))
        footer = plan_footer(planner, place or output, states[-1], stats_arr)
        if bands:  # the built-in default cost only (plan/cost_band.py)
            footer["cost_band"] = cost_band(np.concatenate(bands))
        data = writer.commit(footer)
    except BaseException as exc:
        writer.abort()
        if isinstance(exc, OSError):
            raise _cannot_write(output, exc) from exc
        raise
    return data, footer, stats_arr


def _cannot_write(output: Path, exc: OSError) -> PlanError:
    """A failed write (disk full, read-only, permissions) as one line naming the plan."""
    return PlanError(f"{output}: cannot write the plan ({exc.strerror or exc})")


def _summary(
    output: Path,
    plan_id: str,
    planner: Planner,
    stats: np.ndarray,
    footer,
    seconds: float,
    workers: int = 1,
    notice: str | None = None,
) -> PlanSummary:
    col = {name: stats[:, i] for i, name in enumerate(stat_columns(planner.config))}
    ratio = _ratio(col["max_rank_cost"], col["lower_bound"])
    naive = _ratio(col["naive_max_rank_cost"], col["lower_bound"])
    inter = _ratio(col["interleave_max_rank_cost"], col["lower_bound"])
    planned = int(col["max_rank_cost"].sum())
    naive_total = int(col["naive_max_rank_cost"].sum())
    inter_total = int(col["interleave_max_rank_cost"].sum())
    train = planner.config.train
    return PlanSummary(
        path=str(output),
        plan_id=plan_id,
        steps=train.steps,
        dp_size=train.dp_size,
        micro_batches=train.micro_batches,
        samples=int(col["samples"].sum()),
        tokens=int(col["tokens"].sum()),
        bytes=output.stat().st_size,
        ratio_mean=round(float(ratio.mean()), 6) if len(ratio) else 1.0,
        ratio_max=round(float(ratio.max()), 6) if len(ratio) else 1.0,
        naive_ratio_mean=round(float(naive.mean()), 6) if len(naive) else 1.0,
        naive_ratio_max=round(float(naive.max()), 6) if len(naive) else 1.0,
        speedup_vs_naive=round(naive_total / planned, 6) if planned else 1.0,
        interleave_ratio_mean=round(float(inter.mean()), 6) if len(inter) else 1.0,
        interleave_ratio_max=round(float(inter.max()), 6) if len(inter) else 1.0,
        speedup_vs_interleave=round(inter_total / planned, 6) if planned else 1.0,
        stronger_baseline="interleave" if inter_total < naive_total else "naive",
        seconds=seconds,
        sources=footer["sources"],
        workers=workers,
        notice=notice,
        parts=_part_ratios(col) if "encoder_cost" in col else None,
        cp=_cp_ratios(col, train.cp_size) if "cp_max_rank_work" in col else None,
        cost=cost_note(footer, round(naive_total / planned, 6) if planned else 1.0),
        first_step=planner.first_step,
        warnings=epoch_warnings(footer["config"], footer["sources"]),
        exclude=(planner.lineage or {}).get("exclude"),
        skipped=(planner.lineage or {}).get("skipped"),
    )


def _cp_ratios(col: dict[str, np.ndarray], cp: int) -> dict[str, Any]:
    """The plan summary's CP figures: per layout the step time over its lower bound (mean,
    and max for mds's) and the mean CP-rank imbalance; samples split and padding."""

    def mean(x):
        return round(float(np.mean(x)), 6) if len(x) else 1.0

    bound = col["cp_lower_bound"]
    ratio = _ratio(col["cp_max_rank_work"], bound)
    return {
        "cp_size": cp,
        "ratio_mean": mean(ratio),
        "ratio_max": round(float(ratio.max()), 6) if len(ratio) else 1.0,
        "headtail_ratio_mean": mean(_ratio(col["cp_headtail_max_rank_work"], bound)),
        "contiguous_ratio_mean": mean(_ratio(col["cp_contiguous_max_rank_work"], bound)),
        "imbalance_mean": mean(col["cp_imbalance_ppm"] / 1e6),
        "contiguous_imbalance_mean": mean(col["cp_contiguous_imbalance_ppm"] / 1e6),
        "samples_split": int(col["cp_split_samples"].sum()),
        "padding_tokens": int(col["cp_padding"].sum()),
    }


def _part_ratios(col: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    out = {}
    for part in ("encoder", "backbone"):
        mine = _ratio(col[f"max_rank_{part}"], col[f"{part}_lower_bound"])
        naive = _ratio(col[f"naive_max_rank_{part}"], col[f"{part}_lower_bound"])
        out[part] = {
            "ratio_mean": round(float(mine.mean()), 6) if len(mine) else 1.0,
            "ratio_max": round(float(mine.max()), 6) if len(mine) else 1.0,
            "naive_ratio_mean": round(float(naive.mean()), 6) if len(naive) else 1.0,
        }
    return out
