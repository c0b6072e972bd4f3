"""Fetch records: what the plan's blocks say about where each planned sample lives."""

from __future__ import annotations

import numpy as np
import pytest
from plan_builders import sample_index, sample_plan_config

from mds.planner.plan.chunk import Planner


@pytest.fixture(scope="module")
def planner(tmp_path_factory):
    return Planner(sample_plan_config(sample_index(tmp_path_factory)))


def expected(planner: Planner, ids: np.ndarray):
    """Per id (source, file, row, tokens, offset, length), straight from the manifest."""
    out = []
    for g in ids.tolist():
        pool = next(p for p in planner.pools if p.base <= g < p.base + p.index_rows)
        entry = planner.manifest.source(pool.name)
        row = g - pool.base
        firsts = [int(f["first_row"]) for f in entry["files"]]
        fid = int(np.searchsorted(firsts, row, side="right")) - 1
        sid = [s["name"] for s in planner.manifest.sources].index(pool.name)
        if "file_row" in pool.by_row:
            where = tuple(int(pool.by_row[c][row]) for c in ("file_row", "offset", "length"))
        else:  # by row; a Parquet token list also by where its values start in the group
            where = (row - firsts[fid], int(pool.by_row.get("offset", [0] * (row + 1))[row]), 0)
        out.append((sid, fid, where[0], int(pool.by_row["n_tokens"][row]), *where[1:]))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_chunk_records_are_each_blocks_records(planner, seed):
    rng = np.random.default_rng(seed)
    ids = np.concatenate(
        [p.base + np.asarray(p.rows[rng.integers(0, p.n, 40)], np.int64) for p in planner.pools]
    )
    rng.shuffle(ids)
    cuts = np.sort(rng.integers(0, len(ids), 5))  # some blocks empty, some long
    bounds = np.concatenate([[0], cuts, [len(ids)]])
    columns, files = planner.fetch.chunk_records(ids, bounds)
    for k in range(len(bounds) - 1):
        lo, hi = bounds[k], bounds[k + 1]
        want = expected(planner, ids[lo:hi])
        named = sorted({(s, f) for s, f, *_ in want})
        assert [(s, f) for s, f, _ in files[k]] == named
        got = [
            (*named[int(columns[0][i])], *(int(c[i]) for c in columns[1:]))
            for i in range(lo, hi)
        ]
        assert got == want
        for s, f, entry in files[k]:
            source = planner.manifest.sources[s]
            assert entry["path"] == source["files"][f]["path"]
