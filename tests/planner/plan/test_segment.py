"""Online mixing's segments: each window is a re-plan of the one before with the policy's
weights, every cursor kept; the footer names what it was made from; a replay from the
signal log alone is byte-identical."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from plan_builders import plan_config, synthetic, train_table

from mds.core.planfile_reader import PlanReader
from mds.core.segments import online_facts, run_facts, segment_path
from mds.core.signal_log import SignalLog, window_signal
from mds.errors import PlanError
from mds.planner.plan.build import build_plan
from mds.planner.plan.segment import plan_segment, replay_segments

STEPS, WINDOW = 16, 4
SOURCES = ("a", "b", "c")


def online_data(root, policy="doremi", **online):
    lengths = {"a": [10 + i % 7 for i in range(40)], "b": [5 + i % 3 for i in range(30)],
               "c": [20 + i % 11 for i in range(50)]}
    table = {"policy": policy, "window": WINDOW, **online}
    if policy == "doremi":
        table.setdefault("reference", {"a": 1.0, "b": 1.0, "c": 1.0})
    data = synthetic(
        root,
        {n: {"lengths": lengths[n], "weight": w} for n, w in zip(SOURCES, (0.5, 0.3, 0.2), strict=True)},
        train_table(steps=STEPS),
    )
    data["mixing"] = {"online": table}
    return data


def fake_log(plan_id: str, windows: int) -> SignalLog:
    log = SignalLog(plan_id, SOURCES, WINDOW)
    for k in range(windows):
        loss = [30.0 + 10 * k, 10.0 + 5 * k, 20.0]  # mean loss 3+k, 1+k/2, 2
        log.append(window_signal(k, k * WINDOW, (k + 1) * WINDOW, loss, [10, 10, 10]))
    return log


def run(root, data, log_windows=1):
    """Plan every segment as a run would, with the signals of a fake log."""
    config = plan_config(root, data)
    plan = root / "run" / "plan.mds"
    first = plan_segment(config, plan, 0)
    log = fake_log(first.plan_id, log_windows)
    for k in range(1, 3):
        plan_segment(config, plan, k, log)
    return config, plan, log


def test_segments_continue_the_cursors_and_record_their_weights(tmp_path):
    data = online_data(tmp_path)
    config, plan, log = run(tmp_path, data)
    # the same three windows as one re-plan chain with the recorded weights, by hand
    facts = []
    for k in range(3):
        with PlanReader(segment_path(plan, k)) as reader:
            facts.append(online_facts(reader.footer, plan))
            assert reader.first_step == k * WINDOW and reader.steps == (k + 1) * WINDOW
            if k:
                assert reader.footer["lineage"]["at_step"] == k * WINDOW
    assert facts[0].weights == facts[1].weights  # window 1 has no complete signal yet
    assert facts[2].weights != facts[1].weights  # window 0's losses moved window 2
    assert facts[2].signal_windows == 1 and facts[2].signal_digest == log.digest(1)
    assert pytest.approx(sum(facts[2].weights.values())) == 1.0
    # source a's loss exceeds its reference most: DoReMi raises its share
    assert facts[2].weights["a"] > facts[1].weights["a"]
    assert run_facts(plan) == facts  # the weights over time, from the footers alone


def test_a_replay_from_the_log_is_byte_identical(tmp_path):
    data = online_data(tmp_path)
    _config, plan, log = run(tmp_path, data)
    log.write(tmp_path / "signals.json")
    audit = tmp_path / "audit" / "plan.mds"
    summaries = replay_segments(
        plan_config(tmp_path, data), audit, SignalLog.read(tmp_path / "signals.json")
    )
    assert len(summaries) == 3  # windows 0, 1 and 2: the log's window 0 decides window 2
    for k in range(3):
        assert segment_path(audit, k).read_bytes() == segment_path(plan, k).read_bytes()


def test_a_segment_from_another_log_is_refused(tmp_path):
    data = online_data(tmp_path)
    config, plan, log = run(tmp_path, data)
    other = fake_log(log.plan_id, 2)
    other.windows[0] = window_signal(0, 0, WINDOW, [9.0, 1.0, 1.0], [10, 10, 10])
    with pytest.raises(PlanError, match="does not hold window 2"):
        plan_segment(config, plan, 3, other)


def test_a_segment_from_another_config_is_refused(tmp_path):
    data = online_data(tmp_path)
    config, plan, log = run(tmp_path, data)
    data["mixing"]["online"]["step_size"] = 2.0
    with pytest.raises(PlanError, match="another config"):
        plan_segment(plan_config(tmp_path, data), plan, 3, fake_log(log.plan_id, 2))


def test_a_replay_with_another_index_or_config_is_refused(tmp_path):
    data = online_data(tmp_path)
    _config, plan, log = run(tmp_path, data)
    data["train"]["seed"] = 8
    with pytest.raises(PlanError, match="replay with the run's config"):
        replay_segments(plan_config(tmp_path, data), tmp_path / "b" / "plan.mds", log)


def test_the_segments_sample_what_one_plan_with_their_weights_samples(tmp_path):
    """Exactness of the cursors: segments 0..2 hold the same samples per step as one chain of
    `--from --at-step` re-plans made by hand with the segments' weights."""
    data = online_data(tmp_path)
    config, plan, _log = run(tmp_path, data)
    from dataclasses import replace

    from mds.planner.plan.schedule import WeightSchedule

    chain = tmp_path / "chain"
    parent = None
    for k in range(3):
        with PlanReader(segment_path(plan, k)) as reader:
            weights = online_facts(reader.footer, plan).weights
        sources = tuple(
            replace(s, weight=WeightSchedule("constant", (0,), (weights[s.name],)))
            for s in config.sources
        )
        cfg = replace(config, sources=sources, online=None,
                      train=replace(config.train, steps=(k + 1) * WINDOW))
        out = chain / f"{k}.mds"
        build_plan(cfg, out, parent=parent, at_step=k * WINDOW if k else None)
        parent = out
        with PlanReader(out) as mine, PlanReader(segment_path(plan, k)) as theirs:
            for c in range(len(mine.chunks)):
                for r in range(mine.dp):
                    assert np.array_equal(mine.rank_chunk(c, r).ids, theirs.rank_chunk(c, r).ids)


@pytest.mark.parametrize("policy", ["bandit", "tests_policy:weights"])
def test_other_policies_plan_and_replay(tmp_path, policy, monkeypatch):
    module = tmp_path / "tests_policy.py"
    module.write_text(
        "def weights(window, history):\n"
        "    last = history.signals[-1]\n"
        "    return {s: 1.0 + (last.mean_loss[s] or 0.0) for s in history.sources}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    data = online_data(tmp_path, policy=policy)
    _config, plan, log = run(tmp_path, data)
    audit = tmp_path / "audit" / "plan.mds"
    replay_segments(plan_config(tmp_path, data), audit, log)
    assert segment_path(audit, 2).read_bytes() == segment_path(plan, 2).read_bytes()


def test_a_failing_policy_is_one_line_and_leaves_the_segments(tmp_path, monkeypatch):
    (tmp_path / "bad_policy.py").write_text(
        "def weights(window, history):\n    raise ValueError('no luck\\nsecond line')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    data = online_data(tmp_path, policy="bad_policy:weights")
    config = plan_config(tmp_path, data)
    plan = tmp_path / "run" / "plan.mds"
    first = plan_segment(config, plan, 0)
    plan_segment(config, plan, 1)
    before = segment_path(plan, 1).read_bytes()
    with pytest.raises(PlanError) as err:
        plan_segment(config, plan, 2, fake_log(first.plan_id, 1))
    assert str(err.value) == (
        "[mixing] online policy 'bad_policy:weights' at window 2 raised ValueError: no luck"
    )
    assert segment_path(plan, 1).read_bytes() == before
    assert not segment_path(plan, 2).exists()
    shutil.rmtree(tmp_path / "run")


def test_a_shorter_last_window_and_segments_in_order(tmp_path):
    data = online_data(tmp_path)
    data["train"]["steps"] = 14  # windows [0, 4) [4, 8) [8, 12) [12, 14)
    config = plan_config(tmp_path, data)
    plan = tmp_path / "run" / "plan.mds"
    with pytest.raises(PlanError, match="window 0's segment is missing"):
        plan_segment(config, plan, 1)
    first = plan_segment(config, plan, 0)
    log = fake_log(first.plan_id, 2)
    for k in range(1, 4):
        plan_segment(config, plan, k, log)
    with PlanReader(segment_path(plan, 3)) as reader:
        assert (reader.first_step, reader.steps) == (12, 14)
        assert online_facts(reader.footer, plan).windows == 4
