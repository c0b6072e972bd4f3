"""Put this folder on sys.path (the catalog's tests share `catalog_helpers`), and a plan that
reads many files a step."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture(scope="module")
def many_files(tmp_path_factory) -> Path:
    """Twelve one-file Parquet sources (two row groups each) and a plan of 16 samples a
    step, so each step reads most of the files."""
    from catalog_helpers import plan_of  # on sys.path from here on

    root = tmp_path_factory.mktemp("many")
    rng = np.random.default_rng(11)
    (root / "d").mkdir()
    sources = []
    for f in range(12):
        rows = [rng.integers(0, 1000, int(n)).tolist() for n in rng.integers(2, 40, 30)]
        pq.write_table(pa.table({"t": rows}), root / "d" / f"f{f:02d}.parquet", row_group_size=15)
        sources.append({"name": f"s{f:02d}", "path": f"d/f{f:02d}.parquet", "tokens": "t"})
        sources[-1]["weight"] = 1
    return plan_of(root, sources, dp_size=2, micro_batches=2, steps=12, samples_per_step=16)[1]
