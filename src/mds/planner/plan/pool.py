"""The samples each source can contribute: index rows after filter and overlong handling,
with their effective lengths and integer costs.

Costs are quantized to integers, here, so every later sum and comparison is exact and the
plan comes out byte-identical on any machine.

Loading is one pass over a source's `n_tokens` (and the columns its `filter` or cost `expr`
names; no other column is decoded). What stays per eligible row is the lengths, int32 (int64
only when the micro-batch capacity passes 2^31; a read-only view of the decoded column when
no row is left out), plus uint32 rows where some are left out and float64 costs where a cost
`expr` gives them; other rows and costs are computed at the positions read
(src/mds/planner/plan/columns.py, and docs/plan-format.md, "Cost of planning").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np
import polars as pl

from mds.errors import ConfigError, PlanError
from mds.planner.index.tables import IndexManifest, source_table
from mds.planner.plan.columns import AllRows, LengthCosts, QuantizedCosts
from mds.planner.plan.config import CostSpec, PlanConfig
from mds.planner.plan.sqlexpr import first_overflow, overflow_error, signed_ints, sql_expr
from mds.planner.plan.vision import IMAGE_COLUMNS, image_parts, is_image_text

__all__ = [
    "COST_SCALE",
    "SourcePool",
    "eligible_rows",
    "load_pools",
    "location_columns",
    "needed_columns",
]

JSONL_FORMATS = ("jsonl", "jsonl.zst")
# Formats whose samples are byte ranges of their files: JSONL lines, WebDataset samples.
RANGE_FORMATS = (*JSONL_FORMATS, "webdataset")
# What such a sample's fetch record needs besides n_tokens: its row and its byte range.
JSONL_COLUMNS = ("file_row", "offset", "length")
# A Parquet token list's: where the row's values start in its row group (payload "offsets").
ROW_GROUP_COLUMNS = ("offset",)


def location_columns(entry: dict) -> tuple[str, ...]:
    """The index columns a manifest source's fetch records copy besides n_tokens."""
    if entry["format"] in RANGE_FORMATS:
        return JSONL_COLUMNS
    if (entry.get("payload") or {}).get("offsets") == "row_group":
        return ROW_GROUP_COLUMNS
    return ()


# The largest per-sample cost maps to this integer; 2^40 leaves room for 2^23 samples per rank-step.
COST_SCALE = float(1 << 40)


@dataclass
class SourcePool:
    """One source's eligible samples, addressed by position p in [0, n)."""

    name: str
    index: int  # position in the plan's source list
    base: int  # global id of the source's index row 0
    index_rows: int  # all rows of the source in the index
    # Index row of each position: uint32 (int64 if base + index_rows > 2^32).
    rows: np.ndarray | AllRows
    # n_tokens after truncation: int32 (int64 if the capacity needs it), read-only.
    lengths: np.ndarray
    raw_costs: np.ndarray | LengthCosts  # float64, before quantization
    costs: np.ndarray | QuantizedCosts | None = None  # int64, set by quantize()
    max_epochs: int | None = None
    dropped: int = 0  # overlong samples removed with overlong = "drop"
    truncated: int = 0
    # By index row, what the plan's fetch records copy (src/mds/planner/plan/fetch.py): `n_tokens` as
    # indexed, and `location_columns` (JSONL: `file_row`, `offset`, `length`; a Parquet token
    # list: `offset`). Views of the decoded columns.
    by_row: dict[str, np.ndarray] = field(default_factory=dict)
    # Plans with [vision]: per position, the encoder's part of raw_costs (float64), its
    # quantized part of `costs` (int64, set by quantize()) and the sample's patches.
    enc_raw: np.ndarray | None = None
    enc_costs: np.ndarray | None = None
    patches: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.rows)


def _collect(frame: pl.LazyFrame, where: str, expr: str) -> pl.DataFrame:
    try:
        return frame.collect()
    except pl.exceptions.ColumnNotFoundError as exc:
        raise ConfigError(
            f"{where}: {expr!r} uses an unknown column ({str(exc).splitlines()[0]})"
        ) from None
    except (pl.exceptions.PolarsError, ValueError) as exc:
        raise ConfigError(
            f"{where}: cannot evaluate {expr!r} ({str(exc).splitlines()[0]})"
        ) from None


def _overflow(frame: pl.LazyFrame, expr: pl.Expr, where: str, text: str) -> int | None:
    """The first row position where `expr` would wrap int64 (errors as `_collect` says)."""
    try:
        return first_overflow(frame, expr, where, text)
    except pl.exceptions.ColumnNotFoundError:
        return None  # the evaluation itself names the column
    except (pl.exceptions.PolarsError, ValueError) as exc:
        raise ConfigError(
            f"{where}: cannot evaluate {text!r} ({str(exc).splitlines()[0]})"
        ) from None


def _costs(
    table: pl.DataFrame, rows: np.ndarray | None, lengths: np.ndarray, cost: CostSpec, name: str
) -> np.ndarray | LengthCosts:
    """Per eligible row, float64. `rows`: the eligible rows of `table` (None: all of them)."""
    if cost.expr is None:
        return LengthCosts(lengths, cost.a, cost.b, cost.d)
    where = f"[cost] `expr` (source '{name}')"
    expr = sql_expr(cost.expr, where)
    frame = table.lazy()
    # The row index costs 8 bytes a row once cast: add it only where the expression may
    # need it (it names `row`, or a column not read, whose error then lists every column).
    if not set(expr.meta.root_names()) <= set(table.columns) - {"row"}:
        frame = frame.with_row_index("row")
    if rows is not None:
        frame = frame.select(pl.all().gather(rows))
    frame = signed_ints(frame)
    wrapped = _overflow(frame, expr, where, cost.expr)
    if wrapped is not None:
        raise overflow_error(where, cost.expr, _index_row(rows, wrapped))
    # with_columns, not select: a constant (`expr = "1"`) is broadcast to one value per row.
    values = _collect(frame.with_columns(expr.alias("cost")).select("cost"), where, cost.expr)[
        "cost"
    ]
    if not values.dtype.is_numeric():
        raise ConfigError(f"{where}: must be numeric, got {values.dtype}")
    if values.null_count():
        row = _index_row(rows, int(values.is_null().arg_true()[0]))
        raise ConfigError(f"{where}: gives null for index row {row}; costs must be finite and >= 0")
    out = values.cast(pl.Float64).to_numpy()
    del values
    # min >= 0 fails for a NaN or a negative, max < inf for an inf: no per-row mask is made
    # unless one of them is there.
    if out.size and not (out.min() >= 0 and out.max() < np.inf):
        bad = np.flatnonzero(~np.isfinite(out) | (out < 0))
        raise ConfigError(
            f"{where}: gives {out[bad[0]]} for index row {_index_row(rows, int(bad[0]))}; "
            "costs must be finite and >= 0"
        )
    return out


def _index_row(rows: np.ndarray | None, position: int) -> int:
    return position if rows is None else int(rows[position])


def needed_columns(
    schema: pl.Schema, exprs: list[str], extra: tuple[str, ...] = ()
) -> list[str] | None:
    """The index columns a source's pool needs: `n_tokens`, `extra` and those the expressions
    name, in table order; None (every column) where a name is unknown, so the error lists
    them all."""
    names = {"n_tokens", *extra}
    for expr in exprs:
        try:
            names.update(sql_expr(expr, "").meta.root_names())
        except (ConfigError, pl.exceptions.PolarsError):
            return None  # refused later, with its message, where it is evaluated
    names.discard("row")  # the row index, added where an expression is evaluated
    if not names <= set(schema):
        return None
    return [c for c in schema if c in names]


def _narrow_lengths(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Lengths, each now in [1, capacity], as int32 (int64 if the capacity passes 2^31); a
    32-bit integer column is viewed as int32, not copied (its values are below 2^31)."""
    if capacity >= 2**31:
        return lengths.astype(np.int64)
    if lengths.dtype.kind in "iu" and lengths.dtype.itemsize == 4:
        return lengths.view(np.int32)
    return lengths.astype(np.int32)


def _check_fits_step(pool: SourcePool, tokens_per_step: int | None) -> None:
    """A sample longer than tokens_per_step can never be planned into a step; refuse the config
    rather than plan steps that overshoot their token budget or never reach it."""
    if tokens_per_step is None or not pool.n:
        return
    if pool.lengths.max() > tokens_per_step:
        j = int(np.argmax(pool.lengths))
        raise ConfigError(
            f"[train] `tokens_per_step` ({tokens_per_step}) is smaller than source '{pool.name}' "
            f"row {int(pool.rows[j])} ({int(pool.lengths[j])} tokens, after filter and overlong); "
            "raise tokens_per_step to at least the longest eligible sample, or filter such samples out"
        )


def eligible_rows(
    table: pl.DataFrame,
    name: str,
    filt: str | None,
    capacity: int,
    overlong: str,
    planned: np.ndarray | None = None,
) -> tuple[np.ndarray | None, np.ndarray, pl.Series, int, int]:
    """A source's eligible samples: the index rows of `table` (ascending; None: all of them)
    that pass `filt`, are not empty and, with overlong = "drop", fit `capacity`; with their
    lengths (truncated with "truncate"), the `n_tokens` column, and how many samples were
    dropped and truncated. `planned`: per index row, the length to plan with instead of
    `n_tokens` (an image-text sample's backbone length). The planner's pools and `mds
    export` both use this rule."""
    rows = None  # the eligible rows of `table`, ascending; None while that is all of them
    if filt is not None:
        where = f"source '{name}': `filter`"
        expr = sql_expr(filt, where)
        # The row index as the filter sees it is Int64, like every integer column; where
        # the filter does not name it, it stays Polars' UInt32: 4 bytes a row, no cast.
        if "row" in expr.meta.root_names():
            frame = signed_ints(table.lazy().with_row_index("row"))
        else:
            frame = signed_ints(table.lazy()).with_row_index("row")
        wrapped = _overflow(frame, expr, where, filt)
        if wrapped is not None:
            raise overflow_error(where, filt, wrapped)
        # A row whose filter is null is not selected, as in SQL's WHERE.
        frame = frame.filter(expr).select("row")
        rows = _collect(frame, where, filt)["row"].rechunk().to_numpy()
        if len(rows) == table.height:  # ascending and distinct: every row, in order
            rows = None
    tokens = table["n_tokens"]
    # One contiguous copy in Polars' memory (none when the column is one chunk already),
    # which numpy then views: no corpus-sized numpy allocation.
    tokens = (tokens.fill_null(0) if tokens.null_count() else tokens).rechunk()
    lengths = tokens.to_numpy() if planned is None else planned
    if rows is not None:
        lengths = lengths[rows]
    # Empty samples train nothing and would never advance a token-budget step.
    if lengths.size and lengths.min() <= 0:
        kept = np.flatnonzero(lengths > 0)
        rows, lengths = (kept if rows is None else rows[kept]), lengths[kept]
    dropped = truncated = 0
    if lengths.size and lengths.max() > capacity:
        over = lengths > capacity
        if overlong == "error":
            j = int(np.flatnonzero(over)[0])
            raise PlanError(
                f"source '{name}' row {_index_row(rows, j)}: {lengths[j]} tokens exceed "
                f"max_tokens_per_micro_batch = {capacity} ({int(over.sum())} such samples); "
                'set [train] overlong = "drop" or "truncate", or filter them out'
            )
        if overlong == "drop":
            dropped = int(over.sum())
            kept = np.flatnonzero(~over)
            rows, lengths = (kept if rows is None else rows[kept]), lengths[kept]
        else:
            truncated = int(over.sum())
            lengths = np.minimum(lengths, capacity)
    return rows, lengths, tokens, dropped, truncated


def load_pools(config: PlanConfig, manifest: IndexManifest) -> list[SourcePool]:
    """Read every planned source's index table, apply filters and the overlong rule."""
    train = config.train
    capacity = train.max_tokens_per_micro_batch
    pools: list[SourcePool] = []
    bases = {}
    base = 0
    for entry in manifest.sources:
        bases[entry["name"]] = base
        base += entry["rows"]
    known = [s["name"] for s in manifest.sources]
    for i, mix in enumerate(config.sources):
        if mix.name not in bases:
            raise ConfigError(
                f"source {mix.name!r} is in the mix but not in the index {manifest.path} "
                f"(it has {', '.join(known)}); re-run `mds index`"
            )
        entry = manifest.source(mix.name)
        exprs = [e for e in (mix.filter, config.cost.expr) if e is not None]
        located = location_columns(entry)
        images = config.vision is not None and is_image_text(entry)
        extra = located + IMAGE_COLUMNS if images else located
        needed = partial(needed_columns, exprs=exprs, extra=extra)
        table = source_table(manifest, mix.name, needed)
        parts = image_parts(table, config.vision.geometry, mix.name) if images else None
        planned = None
        if parts is not None:
            planned = table["n_tokens"].fill_null(0).to_numpy().astype(np.int64) + parts.image_tokens
            _check_image_truncation(planned, parts.patches, capacity, train.overlong, mix.name)
        rows, lengths, tokens, dropped, truncated = eligible_rows(
            table, mix.name, mix.filter, capacity, train.overlong, planned
        )
        patches = None
        if config.vision is not None:
            patches = parts.patches if parts is not None else np.zeros(table.height, np.int64)
            rows, lengths, patches, more = _patch_room(
                rows, lengths, patches, train.max_patches_per_micro_batch, train.overlong, mix.name
            )
            dropped += more
        lengths = _narrow_lengths(lengths, capacity)
        base = bases[mix.name]
        # uint32 rows as long as base + row (a global id, made in plan_chunk) stays below 2^32.
        row_type = np.uint32 if base + entry["rows"] <= 2**32 else np.int64
        eligible = (
            AllRows(len(lengths), row_type) if rows is None else rows.astype(row_type, copy=False)
        )
        # An image-text sample's fetch record carries its whole backbone length, which the
        # executor checks once it has read the images' sizes (docs/vision.md).
        by_row = {"n_tokens": tokens.to_numpy() if planned is None else planned}
        for c in located:
            by_row[c] = table[c].rechunk().to_numpy()
        bb_raw = _costs(table, rows, lengths, config.cost, mix.name)
        enc_raw = None
        if config.vision is not None:
            enc_raw = np.zeros(len(lengths), np.float64)
            if parts is not None:
                pos = slice(None) if rows is None else rows
                enc_raw = parts.encoder_cost(config.vision.a, config.vision.b, pos)
        pools.append(
            SourcePool(
                name=mix.name,
                index=i,
                base=base,
                index_rows=entry["rows"],
                rows=eligible,
                lengths=lengths,
                raw_costs=bb_raw if enc_raw is None else np.asarray(bb_raw) + enc_raw,
                max_epochs=mix.max_epochs,
                dropped=dropped,
                truncated=truncated,
                by_row=by_row,
                enc_raw=enc_raw,
                patches=patches,
            )
        )
        del table, tokens, rows, eligible, by_row, parts  # the next source's table need not share memory
        _check_fits_step(pools[-1], train.tokens_per_step)
    quantize(pools)
    return pools


def quantize(pools: list[SourcePool]) -> None:
    """Integer costs: round(cost / max cost * 2^40), at least 1 for a non-empty sample."""
    peak = max((float(p.raw_costs.max()) for p in pools if p.n), default=0.0)
    scale = COST_SCALE / peak if peak > 0 else 0.0
    for p in pools:
        if p.enc_raw is None:
            p.costs = QuantizedCosts(p.raw_costs, p.lengths, scale)
            continue
        # Each part rounded on its own, so a sample's cost is exactly its two parts' sum.
        backbone = np.asarray(QuantizedCosts(p.raw_costs - p.enc_raw, p.lengths, scale))
        p.enc_costs = np.rint(p.enc_raw * scale).astype(np.int64)
        p.enc_costs[(p.enc_costs == 0) & (p.patches > 0)] = 1
        p.costs = backbone + p.enc_costs


def _check_image_truncation(
    planned: np.ndarray, patches: np.ndarray, capacity: int, overlong: str, name: str
) -> None:
    """Images cannot be cut: under overlong = "truncate", an image-text sample longer than
    the micro-batch is refused (text-only samples are still truncated)."""
    if overlong != "truncate":
        return
    over = np.flatnonzero((planned > capacity) & (patches > 0))
    if over.size:
        row = int(over[0])
        raise PlanError(
            f"source '{name}' row {row}: {int(planned[row])} backbone tokens (text and images) "
            f"exceed max_tokens_per_micro_batch = {capacity}, and a sample with images cannot "
            'be truncated; use overlong = "drop", filter such samples out, or raise the capacity'
        )


def _patch_room(
    rows: np.ndarray | None,
    lengths: np.ndarray,
    patches: np.ndarray,
    capacity: int | None,
    overlong: str,
    name: str,
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, int]:
    """The eligible samples' patches; samples with more patches than a micro-batch holds
    are an error, or dropped (and counted) under overlong = "drop"."""
    patches = patches if rows is None else patches[rows]
    if capacity is None or not patches.size or patches.max() <= capacity:
        return rows, lengths, patches, 0
    over = patches > capacity
    if overlong != "drop":
        j = int(np.flatnonzero(over)[0])
        raise PlanError(
            f"source '{name}' row {_index_row(rows, j)}: {int(patches[j])} image patches exceed "
            f"max_patches_per_micro_batch = {capacity} ({int(over.sum())} such samples); "
            'set [train] overlong = "drop", filter them out, or lower [vision] max_pixels'
        )
    kept = np.flatnonzero(~over)
    rows = kept if rows is None else rows[kept]
    return rows, lengths[kept], patches[kept], int(over.sum())
