"""The online part of a plan report (src/mds/planner/report/online.py) in token mode: the
realised shares count the window's tokens, read from its own segment; a fixed plan has none."""

from __future__ import annotations

import numpy as np
import pytest
from plan_builders import plan_config, synthetic, train_table

from mds.core.planfile_reader import PlanReader
from mds.core.segments import segment_path
from mds.core.signal_log import SignalLog, window_signal
from mds.planner.plan.build import build_plan
from mds.planner.plan.segment import plan_segment
from mds.planner.report.online import online_report
from mds.planner.report.plan import realized_amounts

WINDOW, STEPS = 3, 9


def test_token_shares_per_window(tmp_path):
    lengths = {"a": [10 + i % 9 for i in range(80)], "b": [30 + i % 17 for i in range(80)]}
    data = synthetic(
        tmp_path,
        {n: {"lengths": v, "weight": 1.0} for n, v in lengths.items()},
        train_table(steps=STEPS, samples_per_step=None, tokens_per_step=400, weight_by="tokens"),
    )
    data["mixing"] = {"online": {"policy": "doremi", "window": WINDOW,
                                 "reference": {"a": 1.0, "b": 1.0}}}  # fmt: skip
    config = plan_config(tmp_path, data)
    plan = tmp_path / "run" / "plan.mds"
    first = plan_segment(config, plan, 0)
    log = SignalLog(first.plan_id, ("a", "b"), WINDOW)
    log.append(window_signal(0, 0, WINDOW, [30.0, 90.0], [10, 10]))
    plan_segment(config, plan, 1, log)
    plan_segment(config, plan, 2, log)
    with PlanReader(segment_path(plan, 1)) as reader:
        out = online_report(reader)
    assert out["share_unit"] == "tokens" and out["signals"] is None
    assert out["written"] == out["windows"] == 3
    for k, row in enumerate(out["per_window"]):
        with PlanReader(segment_path(plan, k)) as seg:
            _, amounts = realized_amounts(seg)
        assert row["amounts"] == np.asarray(amounts).sum(axis=0).tolist()
        assert row["realized"] == pytest.approx([x / sum(row["amounts"]) for x in row["amounts"]])
    # b's excess loss (9 - 1 against a's 3 - 1) moves weight to it in window 2
    assert out["per_window"][2]["planned"][1] > out["per_window"][1]["planned"][1]
    assert out["per_window"][2]["realized"][1] > out["per_window"][1]["realized"][1]


def test_a_fixed_plan_has_no_online_part(tmp_path):
    data = synthetic(tmp_path, {"a": {"lengths": [5] * 20, "weight": 1.0}}, train_table(steps=2))
    plan = tmp_path / "plan.mds"
    build_plan(plan_config(tmp_path, data), plan)
    with PlanReader(plan) as reader:
        assert online_report(reader) is None
