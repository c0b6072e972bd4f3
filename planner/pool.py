"""The samples each source can contribute: index rows after filter and overlong handling,
with their effective lengths and integer costs.

Costs are quantized to integers once, here, so every later sum and comparison is exact and
the plan comes out byte-identical on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from mds.executor.errors import ConfigError, PlanError
from mds.planner.index.manifest import IndexManifest, source_frame
from mds.planner.plan_config import CostSpec, PlanConfig
from mds.planner.sqlexpr import signed_ints, sql_expr

__all__ = ["COST_SCALE", "SourcePool", "load_pools"]

# The largest per-sample cost maps to this integer; 2^40 leaves room for 2^23 samples per rank-step.
COST_SCALE = float(1 << 40)


@dataclass
class SourcePool:
    """One source's eligible samples, addressed by position p in [0, n)."""

    name: str
    index: int  # position in the plan's source list
    base: int  # global id of the source's index row 0
    index_rows: int  # all rows of the source in the index
    rows: np.ndarray  # int64: index row of each eligible position
    lengths: np.ndarray  # int64: effective n_tokens (after truncation)
    raw_costs: np.ndarray  # float64, before quantization
    costs: np.ndarray | None = None  # int64, set by quantize()
    max_epochs: int | None = None
    dropped: int = 0  # overlong samples removed with overlong = "drop"
    truncated: int = 0
    raw_tokens: np.ndarray | None = None  # the index's n_tokens where truncation changed it
    # JSONL only, per eligible position: line number, byte offset and length of the line.
    file_row: np.ndarray | None = None
    offset: np.ndarray | None = None
    length: np.ndarray | None = None

    @property
    def index_tokens(self) -> np.ndarray:
        """The index's token count per eligible position (what the executor checks)."""
        return self.lengths if self.raw_tokens is None else self.raw_tokens

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


def _costs(frame: pl.DataFrame, lengths: np.ndarray, cost: CostSpec, name: str) -> np.ndarray:
    if cost.expr is None:
        L = lengths.astype(np.float64)
        return cost.a * L + cost.b * L * L
    where = f"[cost] `expr` (source '{name}')"
    # with_columns, not select: a constant (`expr = "1"`) is broadcast to one value per row.
    values = _collect(
        frame.lazy().with_columns(sql_expr(cost.expr, where).alias("cost")).select("cost"),
        where,
        cost.expr,
    )["cost"]
    if not values.dtype.is_numeric():
        raise ConfigError(f"{where}: must be numeric, got {values.dtype}")
    if values.null_count():
        row = frame["row"][int(values.is_null().arg_true()[0])]
        raise ConfigError(f"{where}: gives null for index row {row}; costs must be finite and >= 0")
    out = values.cast(pl.Float64).to_numpy()
    bad = np.flatnonzero(~np.isfinite(out) | (out < 0))
    if bad.size:
        raise ConfigError(
            f"{where}: gives {out[bad[0]]} for index row {frame['row'][int(bad[0])]}; costs must be finite and >= 0"
        )
    return out


def _check_fits_step(pool: SourcePool, df: pl.DataFrame, tokens_per_step: int | None) -> None:
    """A sample longer than tokens_per_step can never be planned into a step; refuse the config
    rather than plan steps that overshoot their token budget or never reach it."""
    if tokens_per_step is None or not pool.n:
        return
    j = int(np.argmax(pool.lengths))
    if pool.lengths[j] > tokens_per_step:
        raise ConfigError(
            f"[train] `tokens_per_step` ({tokens_per_step}) is smaller than source '{pool.name}' "
            f"row {int(df['row'][j])} ({int(pool.lengths[j])} tokens, after filter and overlong); "
            "raise tokens_per_step to at least the longest eligible sample, or filter such samples out"
        )


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
        frame = signed_ints(source_frame(manifest, mix.name).with_row_index("row"))
        if mix.filter is not None:
            where = f"source '{mix.name}': `filter`"
            # A row whose filter is null is not selected, as in SQL's WHERE.
            frame = frame.filter(sql_expr(mix.filter, where))
            df = _collect(frame, where, mix.filter)
        else:
            df = frame.collect()
        # Empty samples train nothing and would never advance a token-budget step.
        df = df.filter(pl.col("n_tokens") > 0)
        lengths = df["n_tokens"].cast(pl.Int64).to_numpy()
        dropped = truncated = 0
        raw_tokens = None
        over = lengths > capacity
        if over.any():
            if train.overlong == "error":
                j = int(np.flatnonzero(over)[0])
                raise PlanError(
                    f"source '{mix.name}' row {int(df['row'][j])}: {lengths[j]} tokens exceed "
                    f"max_tokens_per_micro_batch = {capacity} ({int(over.sum())} such samples); "
                    'set [train] overlong = "drop" or "truncate", or filter them out'
                )
            if train.overlong == "drop":
                dropped = int(over.sum())
                df = df.filter(pl.Series(~over))
                lengths = lengths[~over]
            else:
                truncated = int(over.sum())
                raw_tokens = lengths
                lengths = np.minimum(lengths, capacity)
        jsonl = entry["format"] in ("jsonl", "jsonl.zst")
        pools.append(
            SourcePool(
                name=mix.name,
                index=i,
                base=bases[mix.name],
                index_rows=entry["rows"],
                rows=df["row"].cast(pl.Int64).to_numpy(),
                lengths=lengths,
                raw_costs=_costs(df, lengths, config.cost, mix.name),
                max_epochs=mix.max_epochs,
                dropped=dropped,
                truncated=truncated,
                raw_tokens=raw_tokens,
                **(
                    {c: df[c].to_numpy() for c in ("file_row", "offset", "length")} if jsonl else {}
                ),
            )
        )
        _check_fits_step(pools[-1], df, train.tokens_per_step)
    quantize(pools)
    return pools


def quantize(pools: list[SourcePool]) -> None:
    """Integer costs: round(cost / max cost * 2^40), at least 1 for a non-empty sample."""
    peak = max((float(p.raw_costs.max()) for p in pools if p.n), default=0.0)
    scale = COST_SCALE / peak if peak > 0 else 0.0
    for p in pools:
        q = np.rint(p.raw_costs * scale).astype(np.int64)
        p.costs = np.where((q == 0) & (p.lengths > 0), 1, q)
