"""online_segments.py: a segment on disk checked against the run's log, and the planning
subprocess's outcome (the end-to-end runs are in test_online.py)."""

from __future__ import annotations

import shutil
import sys

from executor_builders import tiny_data
from online_builders import STEPS, online_config, plan_first_segment

from mds.core.planfile_reader import PlanReader
from mds.core.segments import online_facts, segment_path
from mds.core.signal_log import SignalLog
from mds.executor.online_segments import SegmentPlanning, planning_failure, segment_problem


def test_planning_failure_is_the_error_message_else_the_last_line():
    out = 'progress...\n{\n  "error": {"kind": "PlanError", "message": "window 2: bad"}\n}\n'
    assert planning_failure(out, 1) == "window 2: bad"
    assert planning_failure("Traceback ...\nValueError: boom\n\n", 1) == "ValueError: boom"
    assert planning_failure('{"not": "json" ', 3) == '{"not": "json"'
    assert planning_failure("", 7) == "exit status 7"


def test_a_failed_subprocess_leaves_its_reason_under_its_window(tmp_path):
    script = 'import json; print(json.dumps({"error": {"message": "no index"}})); raise SystemExit(2)'
    planning = SegmentPlanning([sys.executable, "-c", script], tmp_path / "c.toml",
                               tmp_path / "plan.mds", ["--steps", "4"], [])
    planning.start(3, tmp_path / "log.json", 2)
    assert planning.window == 3
    planning.reap(block=True)
    assert planning.window is None and planning.failed == {3: "no index"}


def test_a_finished_subprocess_records_no_failure(tmp_path):
    planning = SegmentPlanning([sys.executable, "-c", "pass"], tmp_path / "c.toml",
                               tmp_path / "plan.mds", [], ["--index", "x"])
    planning.start(1, tmp_path / "log.json", 1)
    planning.reap(block=True)
    assert planning.window is None and planning.failed == {}


def test_segment_problem_names_what_differs(tmp_path):
    data_root = tmp_path / "data"
    data_root.mkdir()
    plan = plan_first_segment(data_root, online_config(tiny_data(data_root), steps=STEPS))
    with PlanReader(plan) as reader:
        first, dp, plan_id = online_facts(reader.footer, plan), reader.dp, reader.plan_id
        names = tuple(s["name"] for s in reader.footer["config"]["sources"])
    log = SignalLog(plan_id, names, first.window_steps)
    problem, facts = segment_problem(plan, 0, first, log, dp)
    assert problem is None and facts == first
    assert segment_problem(plan, 0, first, log, dp + 1)[0] == (
        f"planned for dp_size {dp}, the run has {dp + 1} there"
    )
    assert segment_problem(plan, 1, first, log, dp) == ("missing", None)
    shutil.copy(plan, segment_path(plan, 1))  # window 0's bytes where window 1 belongs
    assert segment_problem(plan, 1, first, log, dp)[0] == "not window 1 of an online run"
