"""What an index holds, per source: size, token lengths (percentiles and a log2 histogram),
kept metadata and files. Read from the manifest and the source tables, computed with Polars.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from mds.planner.index.tables import IndexManifest, source_frame
from mds.planner.report.common import SCHEMA, finite

__all__ = ["TOP_VALUES", "index_report", "length_histogram", "length_stats", "metadata_stats"]

TOP_VALUES = 10
_PERCENTILES = (50, 90, 99)


def length_stats(n_tokens: pl.Series) -> dict[str, Any]:
    """min, mean, p50/p90/p99 (nearest rank, as the manifest's) and max of `n_tokens`."""
    if n_tokens.len() == 0:
        return {key: None for key in ("min", "mean", "p50", "p90", "p99", "max")}
    out: dict[str, Any] = {"min": int(n_tokens.min()), "mean": float(n_tokens.mean())}
    for p in _PERCENTILES:
        out[f"p{p}"] = int(n_tokens.quantile(p / 100, interpolation="nearest"))
    out["max"] = int(n_tokens.max())
    return out


def length_histogram(n_tokens: pl.Series) -> list[dict[str, int]]:
    """Counts per log2 bucket [lo, hi): [0, 1) for empty samples, then [1, 2), [2, 4), ...
    every bucket from the shortest sample's to the longest's, empty ones included."""
    n = n_tokens.cast(pl.Int64).to_numpy()
    if n.size == 0:
        return []
    # frexp gives the exact binary exponent: floor(log2(x)) = exponent - 1 for x >= 1.
    bucket = np.where(n > 0, np.frexp(np.maximum(n, 1).astype(np.float64))[1], 0)
    counts = np.bincount(bucket)
    first = int(bucket.min())
    out = []
    for k in range(first, len(counts)):
        lo, hi = (0, 1) if k == 0 else (1 << (k - 1), 1 << k)
        out.append({"lo": lo, "hi": hi, "count": int(counts[k])})
    return out


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return finite(value)
    return str(value)


def metadata_stats(frame: pl.DataFrame, column: str) -> dict[str, Any]:
    """Numeric column: min/mean/max; any other: the TOP_VALUES most frequent values."""
    series = frame[column]
    out: dict[str, Any] = {
        "column": column,
        "dtype": str(series.dtype),
        "nulls": int(series.null_count()),
    }
    if series.dtype.is_numeric():
        values = series.drop_nulls()
        empty = values.len() == 0
        out.update(
            kind="numeric",
            min=None if empty else _json_value(values.min()),
            mean=None if empty else finite(values.mean()),
            max=None if empty else _json_value(values.max()),
        )
        return out
    counts = (
        frame.group_by(column)
        .len()
        .with_columns(pl.col(column).cast(pl.String).alias("_key"))
        .sort(["len", "_key"], descending=[True, False], nulls_last=True)
    )
    top = counts.head(TOP_VALUES)
    out.update(
        kind="categorical",
        distinct=counts.height,
        top=[
            {"value": _json_value(v), "count": int(c)}
            for v, c in zip(top[column].to_list(), top["len"].to_list(), strict=True)
        ],
        other=int(counts["len"].sum() - top["len"].sum()),
    )
    return out


def _files(entry: dict[str, Any]) -> list[dict[str, Any]]:
    keys = ("id", "path", "index_path", "size", "fingerprint", "rows", "tokens")
    return [{k: f.get(k) for k in keys} for f in entry["files"]]


def source_report(manifest: IndexManifest, entry: dict[str, Any]) -> dict[str, Any]:
    frame = source_frame(manifest, entry["name"]).collect()
    n_tokens = frame["n_tokens"]
    length = entry.get("length", {})
    return {
        "name": entry["name"],
        "format": entry.get("format"),
        "rows": frame.height,
        "tokens": int(n_tokens.sum()),
        "exact": bool(length.get("exact", True)),
        "length": length,
        "lengths": length_stats(n_tokens),
        "histogram": length_histogram(n_tokens),
        "metadata": [metadata_stats(frame, col) for col in entry.get("keep", {})],
        "files": _files(entry),
    }


def index_report(manifest: IndexManifest) -> dict[str, Any]:
    """The `mds inspect INDEX_DIR` report (docs/inspect.md, kind "index")."""
    data = manifest.data
    sources = [source_report(manifest, entry) for entry in manifest.sources]
    return {
        "schema": SCHEMA,
        "kind": "index",
        "path": str(manifest.path),
        "format_version": data["version"],
        "fingerprint": manifest.fingerprint,
        "fingerprint_mode": data.get("fingerprint_mode"),
        "root": data.get("root"),
        "rows": sum(s["rows"] for s in sources),
        "tokens": sum(s["tokens"] for s in sources),
        "exact": all(s["exact"] for s in sources),
        "sources": sources,
    }
