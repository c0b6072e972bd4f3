"""Re-planning from step K: the new plan continues every source's cursor, follows the new mix
exactly from K, and the executor hands over from the old plan's state at K."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from cli_helpers import mds, one_error_line
from executor_builders import open_executor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_builders import per_source, sample_index, sample_plan_config, step_ids, stream_prefix

from mds.core.planfile_reader import PlanReader
from mds.errors import ConfigError, PlanError
from mds.planner.plan.build import build_plan, with_overrides
from mds.planner.plan.chunk import Planner
from mds.planner.plan.config import MixSpec
from mds.planner.plan.schedule import parse_schedule

STEPS = 40


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    index = sample_index(tmp_path_factory)
    config = with_overrides(sample_plan_config(index), steps=STEPS)
    out = tmp_path_factory.mktemp("derive") / "parent.mds"
    build_plan(config, out)
    return config, out


def reweighted(config, weights: dict[str, float], **train):
    """`config` with constant weights (sources not named leave the mix) and [train] changes."""
    sources = tuple(
        MixSpec(s.name, parse_schedule(weights[s.name], s.name), s.filter, s.max_epochs)
        for s in config.sources
        if s.name in weights
    )
    return replace(config, sources=sources, train=replace(config.train, **train))


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    at=st.integers(1, STEPS - 1),
    dp=st.sampled_from([2, 4, 8]),
    web=st.sampled_from([0.0, 0.1, 0.6]),
)
def test_the_new_plan_continues_every_cursor_and_follows_the_new_mix(
    parent, tmp_path_factory, at, dp, web
):
    config, old = parent
    weights = {"web": web, "books": 0.3, "forum": 0.2, "code": 0.2, "math": 0.3}  # wiki leaves
    new = reweighted(config, weights, dp_size=dp)
    out = tmp_path_factory.mktemp("child") / "child.mds"
    build_plan(new, out, parent=old, at_step=at)
    before, after = step_ids(old, 0, at), step_ids(out, at, STEPS)
    drawn = [i for ids in before.values() for i in ids] + [i for ids in after.values() for i in ids]
    # no sample consumed before K again inside its epoch, none unconsumed skipped
    assert Counter(drawn) == stream_prefix(config, per_source(old, drawn))
    with PlanReader(out) as reader:
        assert (reader.first_step, reader.steps, reader.dp) == (at, STEPS, dp)
        lineage = reader.footer["lineage"]
        assert (lineage["at_step"], lineage["cursors"]["wiki"][0] > 0) == (at, True)
        counts = np.asarray(reader.section("source_samples"))
        names = [s["name"] for s in reader.footer["sources"]]
    # the mix from K follows the new weights within one sample, at every step
    share = np.array([weights[n] for n in names]) / sum(weights.values())
    since = np.cumsum(counts, axis=0)
    ideal = 32 * np.arange(1, STEPS - at + 1)[:, None] * share[None, :]
    assert np.abs(since - ideal).max() <= 1 + 1e-9
    assert "wiki" not in names


def test_a_source_that_leaves_and_comes_back_continues_its_cursor(parent, tmp_path):
    config, old = parent
    weights = {"web": 0.4, "books": 0.2, "forum": 0.2, "code": 0.2, "wiki": 0.2}  # math leaves
    b, c = tmp_path / "b.mds", tmp_path / "c.mds"
    build_plan(reweighted(config, weights), b, parent=old, at_step=10)
    build_plan(config, c, parent=b, at_step=25)  # everything back, math included
    drawn = [
        i
        for plan, lo, hi in ((old, 0, 10), (b, 10, 25), (c, 25, STEPS))
        for ids in step_ids(plan, lo, hi).values()
        for i in ids
    ]
    assert Counter(drawn) == stream_prefix(config, per_source(old, drawn))
    with PlanReader(c) as reader:
        assert reader.footer["lineage"]["cursors"] == {}  # math is live again


def test_the_executor_hands_over_at_k_and_refuses_other_states(parent, tmp_path):
    config, old = parent
    child = tmp_path / "child.mds"
    build_plan(with_overrides(config, dp_size=2), child, parent=old, at_step=13)
    with open_executor(old, 1) as a, open_executor(child, 1) as b:
        assert b.position == (13, 0) and b.first_step == 13
        a.seek(13)
        b.load_state_dict(a.state_dict())
        got = [int(i) for mb in b for i in mb["sample_id"]]
        with open_executor(child, 0) as b0:
            got += [int(i) for mb in b0 for i in mb["sample_id"]]
        assert sorted(got) == sorted(i for ids in step_ids(child, 13, STEPS).values() for i in ids)
        a.seek(12, 1)
        with pytest.raises(PlanError, match="switches to it only at step 13 itself"):
            b.load_state_dict(a.state_dict())  # the old dp_size: its steps cannot be replayed
        a.seek(14)
        with pytest.raises(PlanError, match="already trained old steps the new plan re-plans"):
            b.load_state_dict(a.state_dict())
        with pytest.raises(PlanError, match=r"outside the plan's steps 13 to 39"):
            b.seek(12)


def test_changes_that_would_break_the_streams_are_refused(parent, tmp_path):
    config, old = parent
    out = tmp_path / "x.mds"
    with pytest.raises(ConfigError, match="seed 5 differs"):
        build_plan(replace(config, train=replace(config.train, seed=5)), out, parent=old, at_step=3)
    changed = replace(
        config,
        sources=tuple(
            replace(s, filter="score >= 1") if s.name == "forum" else s for s in config.sources
        ),
    )
    with pytest.raises(ConfigError, match="source 'forum': `filter` changed"):
        build_plan(changed, out, parent=old, at_step=3)
    with pytest.raises(ConfigError, match="--at-step 41 is outside"):
        build_plan(with_overrides(config, steps=50), out, parent=old, at_step=41)
    assert not out.exists()


def test_cli_replans_and_inspect_and_diff_show_the_lineage(parent, tmp_path):
    config, old = parent
    child = tmp_path / "child.mds"
    base = ["plan", "sample_data/mds.toml", "--index", str(config.index), "--steps", str(STEPS)]
    result = mds(*base, "-o", child, "--from", old, "--at-step", "7", "--dp-size", "2")
    assert result.exit_code == 0, result.output
    shown = mds("inspect", child, "--json")
    header = __import__("json").loads(shown.output)["header"]
    assert header["first_step"] == 7 and header["lineage"]["at_step"] == 7
    assert "re-planned from" in mds("inspect", child).output
    diff = mds("diff", old, child).output
    assert "lineage" in diff and "first_step" in diff
    assert mds("verify", child).exit_code == 0
    assert "--from and --at-step go together" in one_error_line(
        mds(*base, "-o", child, "--from", old)
    )


def test_tokens_per_step_plans_continue_their_cursors_too(tmp_path):
    from plan_builders import plan_config, synthetic, train_table

    rng = np.random.default_rng(5)
    sources = {
        name: {"lengths": rng.integers(5, 60, 200).tolist(), "weight": w}
        for name, w in (("a", 0.5), ("b", 0.3), ("c", 0.2))
    }
    train = train_table(samples_per_step=None, tokens_per_step=600, weight_by="tokens", steps=24)
    train["max_tokens_per_micro_batch"] = 2000
    data = synthetic(tmp_path, sources, train)
    config = plan_config(tmp_path, data)
    old, new = tmp_path / "old.mds", tmp_path / "new.mds"
    build_plan(config, old)
    build_plan(reweighted(config, {"a": 0.1, "b": 0.1, "c": 0.8}), new, parent=old, at_step=9)
    drawn = [
        i
        for plan, lo, hi in ((old, 0, 9), (new, 9, 24))
        for ids in step_ids(plan, lo, hi).values()
        for i in ids
    ]
    assert Counter(drawn) == stream_prefix(config, per_source(old, drawn))
    with PlanReader(new) as b:
        consumed, tokens = b.section("cursor_consumed")[0], b.section("cursor_tokens")[0]
    planner = Planner(config)  # the tokens at K are exactly those of the samples drawn by K
    for s, stream in enumerate(planner.streams):
        assert tokens[s] == stream.tokens_between(0, int(consumed[s])) > 0
