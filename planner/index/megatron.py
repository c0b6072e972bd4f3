"""Scan a Megatron indexed dataset: lengths are the .idx `sizes`, the .bin is never read."""

from __future__ import annotations

import polars as pl

from mds.executor.megatron import check_bin, read_index
from mds.planner.index.discover import DataFile
from mds.planner.index.lengths import checked_lengths
from mds.planner.index.scan import ScanContext

__all__ = ["scan_megatron"]


def scan_megatron(file: DataFile, ctx: ScanContext) -> pl.DataFrame:
    assert file.companion is not None
    index = read_index(file.companion)
    check_bin(index, file.path)
    n_tokens = checked_lengths(
        pl.Series(index.sizes).cast(pl.Int64), lambda i: f"{file.rel} sequence {i}"
    )
    return pl.DataFrame(
        {"file_row": pl.int_range(len(n_tokens), dtype=pl.Int64, eager=True), "n_tokens": n_tokens}
    )
