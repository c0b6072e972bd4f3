"""Flatten a plan into one row per planned sample, joined with its index location.

For DuckDB or Polars: (step, rank, micro_batch, sample_id, source, row, epoch, location,
n_tokens, planned_tokens, cost); docs/plan-format.md lists the columns.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl

from mds.core.planfile import RankChunk
from mds.core.planfile_reader import PlanReader
from mds.core.storage import as_place, is_url
from mds.core.vision import VisionGeometry
from mds.errors import ConfigError
from mds.planner.index.tables import IndexManifest, source_frame
from mds.planner.plan.pool import RANGE_FORMATS
from mds.planner.plan.sqlexpr import signed_ints, sql_expr
from mds.planner.plan.vision import image_parts, is_image_text
from mds.planner.report.common import plan_index
from mds.planner.runtime.atomic import atomic_path, cannot_write

__all__ = [
    "EXPORT_COLUMNS",
    "block_frame",
    "check_selection",
    "export_plan",
    "locate",
    "plan_frame",
    "planned_tokens",
    "sample_cost",
    "chunk_restarts",
    "sample_epochs",
    "with_cost_units",
]

# The leading columns of the export, in order; kept metadata columns follow. No name is a
# reserved word of SQL engines such as DuckDB (hence byte_offset, not offset).
EXPORT_COLUMNS = (
    "step",
    "rank",
    "micro_batch",
    "sample_id",
    "source",
    "row",
    "epoch",
    "file",
    "file_id",
    "file_row",
    "byte_offset",
    "byte_length",
    "n_tokens",
    "planned_tokens",
    "cost",
    "cost_units",
)


_SLOT_SCHEMA = {"step": pl.Int64, "rank": pl.Int64, "micro_batch": pl.Int64, "gid": pl.Int64}


def block_frame(block: RankChunk, rank: int) -> pl.DataFrame:
    """One rank's block as rows of (step, rank, micro_batch, gid), in plan order."""
    T, M = block.counts.shape
    flat = block.counts.ravel()
    return pl.DataFrame(
        {
            "step": np.repeat(block.step_start + np.arange(T).repeat(M), flat),
            "rank": np.full(len(block.ids), rank, dtype=np.int64),
            "micro_batch": np.repeat(np.tile(np.arange(M), T), flat),
            "gid": block.ids.astype(np.int64),
        },
        schema=_SLOT_SCHEMA,
    )


def _slots(reader: PlanReader) -> pl.DataFrame:
    parts = [
        block_frame(reader.rank_chunk(chunk, rank), rank)
        for chunk in range(len(reader.chunks))
        for rank in range(reader.dp)
    ]
    return pl.concat(parts) if parts else pl.DataFrame(schema=_SLOT_SCHEMA)


def planned_tokens(train: dict) -> pl.Expr:
    """`n_tokens` as the plan packs it: capped at the micro-batch's capacity under
    overlong = "truncate"."""
    planned = pl.col("n_tokens").cast(pl.Int64)
    if train["overlong"] == "truncate":
        planned = pl.min_horizontal(planned, pl.lit(train["max_tokens_per_micro_batch"]))
    return planned


def with_cost_units(frame: pl.DataFrame, scale: float) -> pl.DataFrame:
    """`cost_units`, the integers the balancer summed: max(1, round(cost * cost_scale)); of
    a vision plan (columns `encoder_cost`, `patches`) each part on its own, then summed, and
    `cost` the two parts' sum."""

    def units(column: str) -> pl.Expr:
        return (pl.col(column) * scale).round(0, mode="half_to_even").cast(pl.Int64)

    if "encoder_cost" not in frame.columns:
        return frame.with_columns(pl.max_horizontal(units("cost"), pl.lit(1)).alias("cost_units"))
    # As the planner quantizes a vision plan's costs: each part on its own, then summed.
    encoder = pl.when((units("encoder_cost") == 0) & (pl.col("patches") > 0))
    encoder = encoder.then(1).otherwise(units("encoder_cost"))
    frame = frame.with_columns((pl.max_horizontal(units("cost"), pl.lit(1)) + encoder).alias("cost_units"))
    return frame.with_columns((pl.col("cost") + pl.col("encoder_cost")).alias("cost"))


def sample_cost(
    frame: pl.DataFrame, cost: dict, capacity: int, truncate: bool, length: str = "n_tokens"
) -> pl.Series:
    """Each row's cost in configured units, from the canonical `cost` of a plan's config;
    `length` names the column the cost is of (a vision plan's `backbone_tokens`)."""
    n = pl.col(length).cast(pl.Int64)
    if truncate:
        n = pl.min_horizontal(n, pl.lit(capacity))
    if "expr" in cost:
        # with_columns broadcasts a constant expression, as the planner's pools do
        expr = sql_expr(str(cost["expr"]), "the plan's [cost] expr")
        return signed_ints(frame).with_columns(expr.cast(pl.Float64).alias("cost"))["cost"]
    L = n.cast(pl.Float64)
    raw = cost["a"] * L + cost["b"] * L * L
    if cost.get("d"):  # the per-sample constant, only in plans whose [cost] sets it
        raw = raw + cost["d"]
    return frame.select(raw.alias("cost"))["cost"]


def locate(slots: pl.DataFrame, manifest: IndexManifest, footer: dict) -> pl.DataFrame:
    """Join planned slots (columns `gid`, `order`, ...) to their index rows: source, row,
    file path, file_row (offset, length), n_tokens, kept metadata, cost and cost units
    (the integers the balancer used). Rows come back in `order`."""
    index_sources = footer["index"]["sources"]
    bases = np.array([s["base"] for s in index_sources], dtype=np.int64)
    sid = np.searchsorted(bases, slots["gid"].to_numpy(), side="right") - 1
    slots = slots.with_columns(
        pl.Series("source_id", sid), (pl.col("gid") - pl.Series(bases[sid])).alias("row")
    )
    train = footer["config"]["train"]
    out = []
    for (s,), part in slots.group_by("source_id", maintain_order=True):
        name = index_sources[int(s)]["name"]
        files = manifest.source(name)["files"]
        paths = pl.DataFrame(
            {"file_id": [f["id"] for f in files], "file": [f["path"] for f in files]},
            schema={"file_id": pl.UInt32, "file": pl.String},
        )
        table = (
            source_frame(manifest, name)
            .with_row_index("row")
            .with_columns(pl.col("row").cast(pl.Int64))
            .filter(pl.col("row").is_in(part["row"].unique().implode()))
            .collect()
        )
        if manifest.source(name)["format"] not in RANGE_FORMATS:
            # a Parquet token list's `offset` counts values in its row group, not bytes:
            # how the executor reads it, not a place for a reader of the export
            table = table.drop("offset", strict=False)
        joined = part.join(table, on="row", how="left").join(paths, on="file_id", how="left")
        vision = footer["config"].get("vision")
        if vision is not None:
            joined = _image_columns(joined, footer, manifest.source(name))
        joined = joined.with_columns(
            pl.lit(name).alias("source"),
            sample_cost(
                joined,
                footer["config"]["cost"],
                train["max_tokens_per_micro_batch"],
                train["overlong"] == "truncate",
                "n_tokens" if vision is None else "backbone_tokens",
            ),
        )
        out.append(joined)
    frame = pl.concat(out, how="diagonal_relaxed").sort("order")
    return with_cost_units(frame, float(footer["cost_scale"]))


def _image_columns(frame: pl.DataFrame, footer: dict, entry: dict) -> pl.DataFrame:
    """A vision plan's per-sample `backbone_tokens`, `patches` and `encoder_cost`, as the
    planner computed them (src/mds/planner/plan/vision.py)."""
    encoder = footer["config"]["cost"]["encoder"]
    if is_image_text(entry):
        geometry = VisionGeometry.from_json(footer["config"]["vision"], "plan footer: vision")
        parts = image_parts(frame, geometry, entry["name"])
        tokens, patches = parts.image_tokens, parts.patches
        enc = parts.encoder_cost(float(encoder["a"]), float(encoder["b"]), float(encoder.get("d", 0.0)))
    else:
        tokens = patches = np.zeros(frame.height, np.int64)
        enc = np.zeros(frame.height, np.float64)
    return frame.with_columns(
        (pl.col("n_tokens").cast(pl.Int64) + pl.Series(tokens)).alias("backbone_tokens"),
        pl.Series("patches", patches),
        pl.Series("encoder_cost", enc),
    )


def chunk_restarts(reader: PlanReader, cursors: np.ndarray, c0: int) -> list[tuple[int, np.ndarray]]:
    """(step offset from chunk `c0`'s first step, stream positions) at each later chunk's
    start, from the `cursor_consumed` section: `sample_epochs`' restarts."""
    first = reader.chunks[c0][0]
    return [(int(reader.chunks[c][0]) - first, cursors[c]) for c in range(c0 + 1, len(reader.chunks))]


def sample_epochs(
    slots: pl.DataFrame,
    footer: dict,
    counts: np.ndarray,
    start: np.ndarray,
    manifest: IndexManifest | None = None,
    restarts: list[tuple[int, np.ndarray]] | None = None,
) -> pl.Series:
    """Each slot's epoch of its source's stream (0-based), for slots (columns `step` and
    `gid`) in plan order; `counts` is the `source_samples` section and `start` the first row
    of `cursor_consumed` (every planned source's stream position at the plan's first step).
    `restarts`: (step offset, stream positions) where the positions are known again, each
    chunk's `cursor_consumed` row: in a plan made with --skip-steps the streams jump over
    the skipped steps' draws at a chunk start, which counts alone cannot tell.

    A step draws source s's stream positions [p, p + n), of epochs p div E to
    (p + n - 1) div E (E eligible samples). When those are one epoch, that is every sample's
    epoch. A step that crosses from epoch lo to hi holds the tail of lo, every sample once
    per full epoch between, and the head of hi; a sample seen one time beyond the full
    epochs is in lo's tail unless it was already drawn in lo by an earlier step. When lo
    began before a re-planned plan's first step, the plan alone cannot tell that, and such
    samples are counted against the tail's size. If that leaves a choice and `manifest` (the
    plan's index) is given, every epoch of that source is recomputed from its stream
    (`_stream_epochs`); else those epochs are null."""
    sources = footer["sources"]
    first_step = int(footer.get("first_step", 0))
    # samples per epoch: the eligible ones, less those a plan made with --exclude left out
    eligible = np.array(
        [max(int(x.get("epoch_size", x["eligible"])), 1) for x in sources], dtype=np.int64
    )
    counts = np.asarray(counts, dtype=np.int64)
    before = np.cumsum(counts, axis=0) - counts + np.asarray(start, dtype=np.int64)
    for t0, row in restarts or ():
        if 0 < t0 < len(before):
            before[t0:] += np.asarray(row, dtype=np.int64) - before[t0]
    index_sources = footer["index"]["sources"]
    bases = np.array([x["base"] for x in index_sources], dtype=np.int64)
    planned = {x["name"]: i for i, x in enumerate(sources)}
    to_planned = np.array([planned.get(x["name"], -1) for x in index_sources], dtype=np.int64)
    gids = slots["gid"].to_numpy()
    src = to_planned[np.searchsorted(bases, gids, side="right") - 1]
    t = slots["step"].to_numpy() - first_step
    p, n = before[t, src], counts[t, src]
    lo, hi = p // eligible[src], (p + n - 1) // eligible[src]
    epoch = lo.astype(np.float64)
    crossing = np.flatnonzero(lo != hi)
    for s in np.unique(src[crossing]):
        rows = np.flatnonzero(src == s)  # in step order
        steps = t[rows]
        ends = before[:, s] + counts[:, s]  # stream position after each step
        for step in np.unique(t[crossing][src[crossing] == s]):  # earlier crossings first
            here = rows[np.searchsorted(steps, step) : np.searchsorted(steps, step, "right")]
            first = int(lo[here[0]])
            # rows of the steps since epoch `first` began, before this one
            began = np.searchsorted(ends, first * eligible[s], side="right")
            span = rows[np.searchsorted(steps, began) : np.searchsorted(steps, step)]
            seen = set(gids[span[epoch[span] == first]].tolist())
            _settle(epoch, here, gids, seen, first, int(hi[here[0]]), int(p[here[0]]), eligible[s])
    if manifest is not None:
        for s in np.unique(src[np.isnan(epoch)]):
            rows = np.flatnonzero(src == s)
            _stream_epochs(epoch, rows, t[rows], gids[rows], footer, int(s), manifest, before)
    return pl.Series("epoch", epoch).fill_nan(None).cast(pl.Int64)


def _stream_epochs(
    epoch: np.ndarray, rows: np.ndarray, steps: np.ndarray, gids: np.ndarray, footer: dict,
    s: int, manifest: IndexManifest, before: np.ndarray,
) -> None:  # fmt: skip
    """Every epoch of planned source `s` (its slots `rows`, in plan order, with their step
    offsets and ids), from the source's stream as the planner drew it: stream position q is
    eligible sample perm_e(q mod E) of epoch e = q div E, the eligible samples found with
    the planner's own rule (`eligible_rows`) on the plan's index and config. Left as they
    are if the draws this recomputes are not exactly the plan's (a different index)."""
    from functools import partial
    from types import SimpleNamespace

    from mds.planner.index.tables import source_table
    from mds.planner.plan.pool import eligible_rows, needed_columns
    from mds.planner.plan.stream import SourceStream

    source = footer["sources"][s]
    name, size = source["name"], int(source["eligible"])
    train = footer["config"]["train"]
    mix = {x["name"]: x for x in footer["config"]["sources"]}.get(name, {})
    filt = mix.get("filter")
    table = source_table(manifest, name, partial(needed_columns, exprs=[filt] if filt else []))
    eligible, *_ = eligible_rows(
        table, name, filt, int(train["max_tokens_per_micro_batch"]), str(train["overlong"])
    )
    if eligible is None:
        eligible = np.arange(table.height, dtype=np.int64)
    if len(eligible) != size or size == 0:
        return
    base = {x["name"]: int(x["base"]) for x in footer["index"]["sources"]}[name]
    stream = SourceStream(SimpleNamespace(name=name, n=size), int(train["seed"]))
    drawn_steps, drawn_gids, drawn_epochs = [], [], []
    for step, n in zip(*(x.tolist() for x in np.unique(steps, return_counts=True)), strict=True):
        q = int(before[step, s])
        drawn_steps.append(np.full(n, step, dtype=np.int64))
        drawn_gids.append(base + eligible[stream.positions(q, n)].astype(np.int64))
        drawn_epochs.append(np.arange(q, q + n, dtype=np.int64) // size)
    drawn_steps, drawn_gids, drawn_epochs = (
        np.concatenate(x) for x in (drawn_steps, drawn_gids, drawn_epochs)
    )
    slot_order = np.lexsort((gids, steps))  # stable: a repeated sample keeps plan order
    draw_order = np.lexsort((drawn_epochs, drawn_gids, drawn_steps))
    if np.array_equal(steps[slot_order], drawn_steps[draw_order]) and np.array_equal(
        gids[slot_order], drawn_gids[draw_order]
    ):
        epoch[rows[slot_order]] = drawn_epochs[draw_order]


def _settle(
    epoch: np.ndarray, rows: np.ndarray, gids: np.ndarray, seen: set, first: int, last: int,
    position: int, eligible: int,
) -> None:  # fmt: skip
    """The epochs of one step's samples of one source (`rows`, in plan order) whose draws
    from stream `position` on cross epochs first..last; `seen`: drawn in `first` before."""
    full = last - first - 1
    tail = (first + 1) * int(eligible) - position  # draws left in epoch `first`
    by_gid: dict[int, list[int]] = {}
    for r in rows:
        by_gid.setdefault(int(gids[r]), []).append(int(r))
    both, single = [], []
    for gid, occurrences in by_gid.items():
        extra = len(occurrences) - full
        if extra == 2:
            both.append(occurrences)
        elif extra == 1:
            single.append((gid, occurrences))
        elif extra == 0:
            epoch[occurrences] = np.arange(first + 1, last)
        else:  # more or fewer draws than the epochs hold: cannot be told
            epoch[occurrences] = np.nan
    for occurrences in both:
        epoch[occurrences] = np.arange(first, last + 1)
    unseen = sum(gid not in seen for gid, _ in single)
    in_tail = tail - len(both)  # draws of the tail left for samples drawn once beyond
    for gid, occurrences in single:
        if gid in seen or in_tail == 0:
            epoch[occurrences] = np.arange(first + 1, last + 1)
        elif in_tail == unseen:
            epoch[occurrences] = np.arange(first, last)
        else:
            epoch[occurrences] = np.nan


def _select(slots: pl.DataFrame, steps: tuple[int, int] | None, ranks: list[int] | None):
    if steps is not None:
        slots = slots.filter(pl.col("step").is_between(steps[0], steps[1], closed="left"))
    if ranks:
        slots = slots.filter(pl.col("rank").is_in(ranks))
    return slots


def plan_frame(
    plan: str | Path,
    index: str | Path | None = None,
    steps: tuple[int | None, int | None] | None = None,
    ranks: list[int] | None = None,
) -> pl.DataFrame:
    """The plan as a DataFrame, one row per planned sample, in (step, rank, micro_batch)
    order; only steps [a, b) (None: the plan's end) and the given DP ranks if `steps` /
    `ranks` say so."""
    plan = as_place(plan)
    with PlanReader(plan) as reader:
        reader.verify_sections()
        footer = reader.footer
        steps = check_selection(reader, steps, ranks)
        slots = _slots(reader).with_row_index("order")
        counts = np.asarray(reader.section("source_samples"), dtype=np.int64)
        cursors = np.asarray(reader.section("cursor_consumed"), dtype=np.int64)
        restarts = chunk_restarts(reader, cursors, 0)
    start = cursors[0]
    manifest = plan_index(plan, footer, index)
    # Epochs need the whole stream's order: (step, rank, micro_batch), and a micro-batch's
    # samples in their order in the plan (file order is (chunk, rank, step, ...)).
    slots = slots.sort("step", "rank", "micro_batch", "order")
    epochs = sample_epochs(slots, footer, counts, start, manifest, restarts)
    slots = _select(slots.with_columns(epochs), steps, ranks)
    frame = locate(slots, manifest, footer).sort("step", "rank", "micro_batch", "order")
    frame = frame.with_columns(
        pl.col("gid").alias("sample_id"),
        planned_tokens(footer["config"]["train"]).alias("planned_tokens"),
    ).rename({"offset": "byte_offset", "length": "byte_length"}, strict=False)
    lead = [c for c in EXPORT_COLUMNS if c in frame.columns]
    internal = ("order", "gid", "source_id")
    # kept metadata in the index's order of sources and columns, whichever rows are shown
    kept = list(dict.fromkeys(c for x in manifest.sources for c in x.get("keep") or ()))
    rest = [c for c in frame.columns if c not in (*lead, *internal)]
    rest.sort(key=lambda c: kept.index(c) if c in kept else len(kept))
    # Int64 throughout, so that sums over a large plan (n_tokens) do not wrap at 2^32.
    return signed_ints(frame.select(*lead, *rest))


def check_selection(
    reader: PlanReader, steps, ranks, given: str | None = None
) -> tuple[int, int] | None:
    """--steps inside the plan's steps (an open end is the plan's), --rank inside
    [0, dp_size): the resolved steps, else a ConfigError; `given` names the steps as the
    user gave them (default: `--steps A:B`)."""
    first, end = reader.first_step, reader.steps
    if steps is not None:
        a, b = (first if steps[0] is None else steps[0]), (end if steps[1] is None else steps[1])
        if not first <= a < b <= end:
            shown = given or "--steps " + ":".join("" if x is None else str(x) for x in steps)
            raise ConfigError(f"{shown} is not inside the plan's steps {first}:{end}")
        steps = (a, b)
    for rank in ranks or ():
        if not 0 <= rank < reader.dp:
            raise ConfigError(f"--rank {rank} is not a DP rank of the plan (0 to {reader.dp - 1})")
    return steps


def export_plan(
    plan: str | Path,
    output: str | Path,
    index: str | Path | None = None,
    steps: tuple[int | None, int | None] | None = None,
    ranks: list[int] | None = None,
    extra: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
) -> int:
    """Write `plan_frame` to Parquet atomically; returns the number of rows. `extra` adds
    columns the planner cannot compute (the CLI's content hashes, read from the data)."""
    from mds.planner.runtime.outputs import check_output, index_inputs

    if is_url(output):
        raise ConfigError(
            f"-o {output}: export writes a local Parquet file; give a path, then copy it"
        )
    output = Path(output)
    inputs = index_inputs(None if index is None or is_url(index) else Path(index), output)
    plan_file = None if is_url(plan) else Path(plan)
    check_output("-o", output, [("plan file", plan_file), *inputs])
    frame = plan_frame(plan, index, steps, ranks)
    if extra is not None:
        frame = extra(frame)
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(output) as tmp:
            frame.write_parquet(tmp)
    except (OSError, pl.exceptions.ComputeError) as exc:
        raise cannot_write(output, "the export", exc) from exc
    return frame.height
