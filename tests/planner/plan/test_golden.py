"""The golden plan: planning sample_data/mds.toml must give the recorded summary and bytes."""

from __future__ import annotations

import json

from plan_builders import GOLDEN, golden_summary

HOW_TO_UPDATE = "if this change is intended, run `make golden` and say why in the commit message"


def test_sample_plan_matches_the_golden_file(tmp_path):
    assert GOLDEN.exists(), f"{GOLDEN} is missing; {HOW_TO_UPDATE}"
    expected = json.loads(GOLDEN.read_text(encoding="utf-8"))
    got = golden_summary(tmp_path)
    changed = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
    detail = ", ".join(
        f"{k}: {expected.get(k)!r} -> {got.get(k)!r}" for k in changed if k != "sources"
    )
    if "sources" in changed:
        detail += ", sources differ"
    assert got == expected, f"the sample plan changed ({detail}); {HOW_TO_UPDATE}"
