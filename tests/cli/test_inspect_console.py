"""src/mds/cli/inspect_console.py: report dicts drawn on the terminal (the reports of real
indexes and plans are drawn in tests/cli/test_inspect_cli.py)."""

from __future__ import annotations

from mds.cli.inspect_console import print_index, print_step
from mds.cli.output import console


def _drawn(draw, *args) -> str:
    with console.capture() as captured:
        draw(*args)
    return captured.get()


def test_a_step_is_drawn_sample_by_sample_with_rank_totals():
    report = {
        "step": 3,
        "dp_size": 2,
        "ranks": [1],
        "samples": [
            {"rank": 1, "micro_batch": 0, "source": "web", "row": 7, "file": "a/[b].jsonl",
             "file_row": 2, "n_tokens": 1200, "cost": 12.5},
        ],  # fmt: skip
        "rank_totals": [
            {"rank": 1, "samples": 1, "tokens": 1200, "cost": 12.5, "cost_units": 25,
             "micro_batches": [{"tokens": 1200}]},
        ],  # fmt: skip
        "stats": {"samples": 2, "tokens": 2000, "max_rank_cost": 25, "lower_bound": 20,
                  "naive_max_rank_cost": 30},  # fmt: skip
    }
    text = _drawn(print_step, report, "FLOPs")
    assert "step 3 (rank 1); cost in FLOPs" in text
    assert "a/[b].jsonl" in text  # markup in a file name is printed as it is
    assert "step: 2 samples, 2,000 tokens" in text
    assert "max rank cost 12.5, lower bound 10, naive 15" in text  # in configured units


def test_an_index_marks_estimated_token_counts():
    source = {
        "name": "web", "format": "jsonl", "rows": 3, "tokens": 30, "exact": False,
        "lengths": {"p50": 10, "p90": 12, "p99": 12, "max": 12},
        "length": {"kind": "estimate", "rule": "bytes/4"}, "histogram": [], "metadata": [],
        "files": [],
    }  # fmt: skip
    report = {
        "path": "idx", "format_version": 1, "fingerprint": "f", "fingerprint_mode": "sampled",
        "root": "/data", "rows": 3, "tokens": 30, "exact": False, "sources": [source],
    }  # fmt: skip
    text = _drawn(print_index, report)
    assert "~30" in text and "~10" in text
    assert "~ estimated token counts" in text
    assert "web (jsonl, lengths: estimate bytes/4)" in text
