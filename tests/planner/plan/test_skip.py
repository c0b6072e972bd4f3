"""--skip-steps: the old plan from K without the skipped steps, nothing else moved, the run's
length kept by planning the missing steps at the end; re-plans from it stay exact."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_builders import (
    per_source,
    plan_slots,
    sample_index,
    sample_plan_config,
    step_ids,
    stream_prefix,
)

from mds.core.planfile_reader import PlanReader
from mds.errors import ConfigError
from mds.planner.plan.build import build_plan, with_overrides
from mds.planner.plan.skip import kept_segments

STEPS = 40


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    index = sample_index(tmp_path_factory)
    config = with_overrides(sample_plan_config(index), steps=STEPS)
    out = tmp_path_factory.mktemp("skip") / "parent.mds"
    build_plan(config, out)
    return config, out


def test_kept_segments_leave_out_each_range():
    assert kept_segments(10, 40, [(12, 15), (20, 22)]) == [(10, 10, 12), (12, 15, 20), (17, 22, 40)]
    assert kept_segments(10, 40, [(10, 40)]) == []
    assert kept_segments(10, 40, [(30, 40)]) == [(10, 10, 30)]


def test_skipping_keeps_every_other_step_exactly(parent, tmp_path):
    config, old = parent
    out = tmp_path / "skip.mds"
    summary = build_plan(config, out, parent=old, at_step=10, skipped=[(12, 15), (20, 22)])
    assert (summary.first_step, summary.steps, summary.skipped) == (10, STEPS, [[12, 15], [20, 22]])
    before = {(s, r, m, g) for s, r, m, g in plan_slots(old)}
    after = plan_slots(out)

    def old_step(t):
        return t if t < 12 else t + 3 if t < 17 else t + 5

    for s, r, m, g in after:
        if s < STEPS - 5:
            assert (old_step(s), r, m, g) in before
    old_slots = [x for x in plan_slots(old) if x[0] >= 10 and not 12 <= x[0] < 15 and not 20 <= x[0] < 22]
    assert sorted((old_step(s), r, m, g) for s, r, m, g in after if s < STEPS - 5) == sorted(old_slots)
    # every sample drawn (old steps before K, the skipped ones, the new plan's): the streams'
    # prefix, so nothing repeats inside an epoch and nothing unconsumed is passed over
    drawn = [i for ids in step_ids(old, 0, 10).values() for i in ids]
    drawn += [i for a, b in ((12, 15), (20, 22)) for ids in step_ids(old, a, b).values() for i in ids]
    drawn += [i for ids in step_ids(out, 10, STEPS).values() for i in ids]
    assert Counter(drawn) == stream_prefix(config, per_source(old, drawn))
    with PlanReader(out) as reader:
        lineage = reader.footer["lineage"]
        assert (lineage["at_step"], lineage["skipped"], lineage["parent_path"]) == (
            10, [[12, 15], [20, 22]], "../" + old.parent.name + "/parent.mds"
        )
    # same inputs, same bytes
    again = tmp_path / "again.mds"
    build_plan(config, again, parent=old, at_step=10, skipped=[(12, 15), (20, 22)])
    assert again.read_bytes() == out.read_bytes()


def test_a_re_plan_from_a_skipping_plan_continues_its_cursors(parent, tmp_path):
    config, old = parent
    mid = tmp_path / "skip.mds"
    build_plan(config, mid, parent=old, at_step=5, skipped=[(6, 16)])
    out = tmp_path / "next.mds"
    build_plan(config, out, parent=mid, at_step=20)
    drawn = [i for ids in step_ids(old, 0, 16).values() for i in ids]
    drawn += [i for ids in step_ids(mid, 6, 20).values() for i in ids]
    drawn += [i for ids in step_ids(out, 20, STEPS).values() for i in ids]
    assert Counter(drawn) == stream_prefix(config, per_source(old, drawn))


@pytest.mark.parametrize(
    ("skip", "needle"),
    [((8, 12), "within --at-step 10"), ((30, 50), "within --at-step 10")],
)
def test_a_range_outside_the_old_plan_is_refused(parent, tmp_path, skip, needle):
    config, old = parent
    with pytest.raises(ConfigError, match=needle):
        build_plan(config, tmp_path / "x.mds", parent=old, at_step=10, skipped=[skip])


def test_skipping_keeps_the_old_geometry(parent, tmp_path):
    config, old = parent
    other = with_overrides(config, dp_size=2)
    with pytest.raises(ConfigError, match="keep its dp_size"):
        build_plan(other, tmp_path / "x.mds", parent=old, at_step=10, skipped=[(12, 14)])


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_skipping_never_loses_or_repeats_a_sample(parent, tmp_path_factory, data):
    """Random K and ranges: the old steps before K, the skipped ones and the new plan's
    draw each source's stream prefix (nothing repeated inside an epoch, nothing passed
    over), and the new plan holds the old steps it keeps, each once."""
    config, old = parent
    at = data.draw(st.integers(0, STEPS - 2))
    cuts = sorted(data.draw(st.sets(st.integers(at, STEPS), min_size=2, max_size=6)))
    ranges = [(a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=False)]
    out = tmp_path_factory.mktemp("skip") / "skip.mds"
    build_plan(config, out, parent=old, at_step=at, skipped=ranges)
    skipped = sum(b - a for a, b in ranges)
    drawn = [i for ids in step_ids(old, 0, at).values() for i in ids]
    drawn += [i for a, b in ranges for ids in step_ids(old, a, b).values() for i in ids]
    new = step_ids(out, at, STEPS)
    drawn += [i for ids in new.values() for i in ids]
    assert Counter(drawn) == stream_prefix(config, per_source(old, drawn))
    kept = [s for s in range(at, STEPS) if not any(a <= s < b for a, b in ranges)]
    old_ids = step_ids(old, at, STEPS)
    assert [old_ids[s] for s in kept] == [new[t] for t in range(at, STEPS - skipped)]
