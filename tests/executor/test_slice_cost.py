"""A rank pays for its slice of the plan, not for the corpus: `PlanExecutor(plan, 0)` and its
first micro-batch cost the same bytes read, files touched and memory over a small corpus A
and a large corpus B planned with the same geometry (20 steps x 16 samples, dp_size 4).

Two pairs, built with `mds index` and `mds plan`:
- rows: one Megatron dataset of 100k vs 3M sequences (sparse .bin, real .idx);
- files: one source of 10 vs 2,000 tiny JSONL files (4 lines each). 2,000 keeps `mds index`
  near 6 s here (it scans ~3 ms per file on 2 cores); 20k files would take over a minute.

Each start-up runs in a fresh interpreter (tests/slice_probe.py) that imports torch, pyarrow
and mds.executor first and measures only the window from the constructor to the first
micro-batch. No timing is asserted. B may exceed A by 10% plus a small absolute slack per
quantity (see SLACK): what a rank's own 80 samples and their files can legitimately add.

On the executor that loads each used source's index-table columns and the whole manifest,
and validates a Megatron .idx in full (main at 62947d3), 8 of the 12 checks fail (A -> B):
  rows:  rchar 0.20 -> 4.5 MB, traced peak 2.6 -> 33.6 MB, arrow peak 1.3 -> 24.0 MB,
         mapped .idx/.bin 1.5 -> 36.3 MB (the .idx's 12 bytes per row), RSS peak 12 -> 107 MB;
  files: files touched 10 -> 2,000, rchar 12 KB -> 621 KB, traced peak 0.09 -> 2.2 MB.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import mds
from scale_corpus import MEGATRON_PATH, write_scale_config, write_small_files, write_sparse_megatron
from slice_probe import measure_start_ups

STEPS, SAMPLES_PER_STEP, DP = 20, 16, 4
RANK_SAMPLES = STEPS * SAMPLES_PER_STEP // DP  # rank 0's samples over the whole plan: 80
CORPORA = {"rows": ("megatron", 100_000, 3_000_000), "files": ("files", 10, 2_000)}
RATIO = 1.1
KB, MB = 1 << 10, 1 << 20
# What B may add to A's cost without scaling with the corpus. A rank's plan block names at
# most RANK_SAMPLES samples, so at most that many files and file records; its first
# micro-batch reads 4 samples of at most a few KB each.
SLACK = {
    # every file its own samples live in, whether opened or stat'ed
    "files": RANK_SAMPLES,
    # 80 file records (path, size, fingerprint: < 200 B each) and 4 payloads, with room for
    # a reader's read-ahead block per sample
    "rchar": 256 * KB,
    # Python and numpy objects for 80 samples and 80 file records are tens of KB
    "traced_peak": 1 * MB,
    "arrow_peak": 1 * MB,
    # pages of the 4 samples' data plus the kernel's fault-around (64 KB) each
    "mapped_rss": 1 * MB,
    # coarse: allocator arenas and the page cache of code first run in the window
    "rss_peak": 16 * MB,
}


def _build(root: Path, kind: str, size: int) -> Path:
    if kind == "megatron":
        write_sparse_megatron(root / MEGATRON_PATH, size)
    else:
        write_small_files(root / "data", size)
    config = write_scale_config(
        root, kind, steps=STEPS, samples_per_step=SAMPLES_PER_STEP, dp_size=DP
    )
    for args in (
        ("index", config, "-o", root / "index"),
        ("plan", config, "--index", root / "index", "-o", root / "plan.mds"),
    ):
        result = mds(*args)
        assert result.exit_code == 0, result.output
    return root


@pytest.fixture(scope="module")
def costs(tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    """pair -> (cost over corpus A, cost over corpus B)."""
    jobs, keys = [], []
    for pair, (kind, *sizes) in CORPORA.items():
        for size in sizes:
            root = _build(tmp_path_factory.mktemp(f"{pair}-{size}-"), kind, size)
            jobs.append((root / "plan.mds", {"data": root / "data", "index": root / "index"}))
            keys.append(pair)
    results = measure_start_ups(jobs)
    out: dict[str, list[dict]] = {}
    for key, result in zip(keys, results, strict=True):
        out.setdefault(key, []).append(result)
    return {k: (a, b) for k, (a, b) in out.items()}


def _value(cost: dict, quantity: str) -> int:
    return cost["files"]["data"] if quantity == "files" else cost[quantity]


def _describe(pair: str, a: dict, b: dict) -> str:
    kind, small, large = CORPORA[pair]
    lines = [f"{pair}: corpus A {small:,} vs B {large:,} ({kind}), rank 0 of dp_size {DP}"]
    for q in SLACK:
        x, y = _value(a, q), _value(b, q)
        lines.append(f"  {q:>12}: A {x:>12,}  B {y:>12,}  bound {RATIO * x + SLACK[q]:>14,.0f}")
    lines.append(f"  B touched e.g. {b['touched']['data'][:3]}; index files {b['files']['index']}")
    return "\n".join(lines)


def test_the_probe_sees_the_start_up(costs):
    """Guards the measurement itself: both start-ups read data files and yielded tokens."""
    for pair, (a, b) in costs.items():
        for cost in (a, b):
            assert cost["batch_tokens"], _describe(pair, a, b)
            assert cost["files"]["data"] >= 1, _describe(pair, a, b)
            assert cost["rchar"] > 0, _describe(pair, a, b)


@pytest.mark.parametrize("quantity", list(SLACK))
@pytest.mark.parametrize("pair", list(CORPORA))
def test_start_up_cost_does_not_grow_with_the_corpus(costs, pair, quantity):
    a, b = costs[pair]
    assert _value(b, quantity) <= RATIO * _value(a, quantity) + SLACK[quantity], _describe(
        pair, a, b
    )
