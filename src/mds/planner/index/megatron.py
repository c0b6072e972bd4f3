"""Scan a Megatron indexed dataset: lengths are the .idx `sizes`, the .bin is never read."""

from __future__ import annotations

import polars as pl

from mds.errors import SourceDataError
from mds.formats.megatron import check_bin, read_index
from mds.planner.index.discover import DataFile
from mds.planner.index.lengths import checked_lengths
from mds.planner.index.scan import ScanContext

__all__ = ["scan_megatron"]


def scan_megatron(file: DataFile, ctx: ScanContext) -> pl.DataFrame:
    assert file.companion is not None
    index = read_index(file.companion)
    if index.dtype.kind not in "iu":  # Megatron's float32/float64 codes hold no token ids
        raise SourceDataError(
            f"{file.rel}: token dtype {index.dtype.name} in {file.companion.name}; token ids "
            "are integers (a Megatron dataset of token ids uses an integer dtype)"
        )
    check_bin(index, file.path)
    n_tokens = checked_lengths(
        pl.Series(index.sizes).cast(pl.Int64), lambda i: f"{file.rel} sequence {i}"
    )
    return pl.DataFrame(
        {"file_row": pl.int_range(len(n_tokens), dtype=pl.Int64, eager=True), "n_tokens": n_tokens}
    )
