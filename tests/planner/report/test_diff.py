"""`diff_plans`: header differences, the first differing step and rank, and source shares,
checked against plans of the sample data made with one setting changed."""

from __future__ import annotations

import tomllib
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from plan_builders import SAMPLE_CONFIG, plan_slots, sample_index

from mds.errors import PlanError
from mds.planner.plan.build import build_plan, with_overrides
from mds.planner.plan.config import plan_config_from_dict
from mds.planner.report.diff import HeaderDiff, diff_plans, header_diff


def sample_toml() -> dict:
    return tomllib.loads(SAMPLE_CONFIG.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Path]:
    """The sample plan, and variants that each change one thing."""
    index = sample_index(tmp_path_factory)
    out = tmp_path_factory.mktemp("diff")

    def plan(name: str, data: dict | None = None, where: Path = out, **overrides) -> None:
        config = plan_config_from_dict(data or sample_toml(), base=SAMPLE_CONFIG.parent)
        build_plan(with_overrides(config, index=index, **overrides), where / f"{name}.mds")

    plan("base")
    plan("again")
    plan("dp8", dp_size=8)
    plan("short", steps=40)
    weight = sample_toml()
    weight["source"][1]["weight"] = [[0, 0.05], [63, 0.6]]  # books: same at step 0 only
    plan("weight", weight)
    seed = sample_toml()
    seed["train"]["seed"] = 99
    plan("seed", seed)
    no_math = sample_toml()
    no_math["source"] = [s for s in no_math["source"] if s["name"] != "math"]
    plan("no_math", no_math)
    plan("first32", steps=32)
    plan("elsewhere", where=out / "moved")  # records the index's path from another directory
    config = plan_config_from_dict(sample_toml(), base=SAMPLE_CONFIG.parent)
    build_plan(
        with_overrides(config, index=index), out / "replan.mds", parent=out / "base.mds", at_step=32
    )
    return {p.stem: p for p in out.rglob("*.mds")}


def steps_by_rank(plan: Path) -> dict[int, dict[int, list[int]]]:
    """step -> rank -> ids in plan order, read independently of diff."""
    out: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for step, rank, _micro, gid in plan_slots(plan):
        out[step][rank].append(gid)
    return out


def first_differing_step(a: Path, b: Path) -> tuple[int, int, bool]:
    sa, sb = steps_by_rank(a), steps_by_rank(b)
    for step in sorted(sa):
        for rank in sorted(sa[step]):
            if sa[step][rank] != sb[step][rank]:
                same = Counter(sum(sa[step].values(), [])) == Counter(sum(sb[step].values(), []))
                return step, rank, same
    raise AssertionError("the plans have the same samples everywhere")


def test_a_replan_is_identical(plans):
    d = diff_plans(plans["base"], plans["again"])
    assert d.identical and d.plan_id_a == d.plan_id_b
    assert d.header == [] and d.first_step is None and d.first_sample_step is None
    assert all(s.delta_pp == 0 for s in d.sources)
    assert d.only_in_a == [] and d.only_in_b == []
    assert diff_plans(plans["base"], plans["base"]).identical


def test_dp_size_changes_only_the_assignment(plans):
    d = diff_plans(plans["base"], plans["dp8"])
    assert not d.identical
    assert d.header == [HeaderDiff("train.dp_size", 4, 8)]
    assert str(d.header[0]) == "train.dp_size: 4 -> 8"
    first = d.first_step
    assert (first.step, first.rank, first.same_samples) == (0, None, True)
    assert first.detail == "dp_size differs (4 -> 8); step 0: same samples, different assignment"
    assert d.first_sample_step is None
    assert all(s.samples_a == s.samples_b and s.delta_pp == 0 for s in d.sources)


def test_changed_weight(plans):
    d = diff_plans(plans["base"], plans["weight"])
    assert [str(h) for h in d.header] == [
        "sources.books.weight.points: [[0,0.05],[63,0.25]] -> [[0,0.05],[63,0.6]]"
    ]
    step, rank, same = first_differing_step(plans["base"], plans["weight"])
    assert step > 0  # the schedules agree at step 0
    assert (d.first_step.step, d.first_step.rank, d.first_step.same_samples) == (step, rank, same)
    assert d.first_step.detail.startswith(f"step {step} rank {rank}: ")
    assert d.first_sample_step is not None and d.first_sample_step >= step
    shares = {s.name: s for s in d.sources}
    assert shares["books"].samples_b > shares["books"].samples_a
    assert shares["books"].delta_pp > 5
    assert all(s.delta_pp <= 0 for s in d.sources if s.name != "books")
    assert abs(sum(s.delta_pp for s in d.sources)) < 1e-3
    assert sum(s.samples_a for s in d.sources) == sum(s.samples_b for s in d.sources) == 64 * 32
    for s in d.sources:
        assert s.share_a == round(100 * s.samples_a / (64 * 32), 4)


def test_changed_seed(plans):
    d = diff_plans(plans["base"], plans["seed"])
    assert [str(h) for h in d.header] == ["train.seed: 1234 -> 99"]
    step, rank, same = first_differing_step(plans["base"], plans["seed"])
    assert (d.first_step.step, d.first_step.rank, d.first_step.same_samples) == (step, rank, same)
    assert not same and d.first_sample_step == step
    assert d.first_step.detail == f"step {step} rank {rank}: different samples"
    # the mix does not depend on the seed: the same counts per source
    assert all(s.samples_a == s.samples_b for s in d.sources)


def test_fewer_steps(plans):
    d = diff_plans(plans["base"], plans["short"])
    assert [str(h) for h in d.header] == ["train.steps: 64 -> 40"]
    assert (d.steps_a, d.steps_b) == (64, 40)
    # planning is a pure function of the step range: the first 40 steps are the same
    assert d.first_step.step == 40 and d.first_step.rank is None
    assert d.first_step.detail == "plan A has 64 steps, plan B 40"
    assert d.first_sample_step == 40


def test_source_only_in_one_plan(plans):
    d = diff_plans(plans["base"], plans["no_math"])
    assert d.only_in_a == ["math"] and d.only_in_b == []
    (math,) = [s for s in d.sources if s.name == "math"]
    assert math.samples_b is None and math.share_b is None and math.delta_pp is None
    assert [str(h) for h in d.header][0] == (
        'sources.math: {"filter":null,"max_epochs":null,"name":"math","weight":0.1} -> (absent)'
    )
    # what the executor would have read it with is gone from the footer too
    assert [h.key for h in d.header][1:] == ["fetch.sources.math"]
    back = diff_plans(plans["no_math"], plans["base"])
    assert back.only_in_b == ["math"] and back.only_in_a == []


def test_json_fields(plans):
    data = diff_plans(plans["base"], plans["dp8"]).to_json()
    assert set(data) == {
        "identical",
        "a",
        "b",
        "header",
        "first_difference",
        "first_sample_difference",
        "shared_steps",
        "shared_text",
        "sources",
        "only_in_a",
        "only_in_b",
    }
    assert data["header"] == [
        {"key": "train.dp_size", "a": 4, "b": 8, "text": "train.dp_size: 4 -> 8"}
    ]
    assert data["first_difference"]["same_samples"] is True
    assert set(data["sources"][0]) == {
        "name",
        "samples_a",
        "samples_b",
        "share_a",
        "share_b",
        "delta_pp",
    }


def test_an_unreadable_plan_is_an_error(plans, tmp_path):
    bad = tmp_path / "bad.mds"
    bad.write_bytes(plans["base"].read_bytes()[:-3])
    with pytest.raises(PlanError, match="truncated"):
        diff_plans(plans["base"], bad)
    with pytest.raises(PlanError, match="cannot open plan"):
        diff_plans(tmp_path / "nope.mds", plans["base"])


def test_a_re_plan_is_compared_over_the_steps_both_hold(plans):
    d = diff_plans(plans["base"], plans["replan"])
    assert (d.first_step_a, d.first_step_b, d.steps_a, d.steps_b) == (0, 32, 64, 64)
    assert d.shared == (32, 64)
    assert d.shared_text == "over the 32 steps both plans hold: steps 32-63"
    # same config from the same cursors: the same samples on steps 32-63
    assert all(s.samples_a == s.samples_b and s.delta_pp == 0 for s in d.sources)
    assert sum(s.samples_a for s in d.sources) == 32 * 32
    keys = [h.key for h in d.header]
    assert keys == ["first_step", "lineage"]  # named, not just "the plans differ"
    data = d.to_json()
    assert data["shared_steps"] == {"first": 32, "last": 63, "count": 32}
    assert (data["b"]["first_step"], data["b"]["last_step"]) == (32, 63)


def test_plans_that_share_no_steps_say_so(plans):
    d = diff_plans(plans["first32"], plans["replan"])
    assert d.shared is None and d.sources == []
    assert d.shared_text == "the plans share no steps (A holds steps 0-31, B steps 32-63)"
    assert d.first_step.detail == "no step in common: plan A holds steps 0-31, plan B steps 32-63"
    assert d.to_json()["shared_steps"] is None
    assert d.only_in_a == d.only_in_b == []


def test_footer_fields_are_named(plans):
    d = diff_plans(plans["base"], plans["elsewhere"])
    keys = [h.key for h in d.header]
    assert "index.path" in keys and all(not k.startswith(("train", "sources")) for k in keys)
    (path,) = [h for h in d.header if h.key == "index.path"]
    assert path.a != path.b


# --- header_diff on its own -------------------------------------------------------------------


def footer(config: dict, fingerprint: str = "blake2b:1") -> dict:
    return {"config": config, "index": {"fingerprint": fingerprint}}


def test_header_diff_walks_dicts_and_lists_of_objects():
    a = footer({"train": {"dp_size": 4, "seed": 1}, "sources": [{"w": 1}, {"w": 2}]})
    b = footer({"train": {"dp_size": 4, "seed": 2}, "sources": [{"w": 1}, {"w": 3}, {"w": 4}]})
    assert [str(h) for h in header_diff(a, b)] == [
        "train.seed: 1 -> 2",
        "sources[1].w: 2 -> 3",
        'sources[2]: (absent) -> {"w":4}',
    ]


def test_header_diff_names_sources_by_name():
    a = footer({"sources": [{"name": "web", "w": 1}, {"name": "code", "w": 2}]})
    b = footer({"sources": [{"name": "code", "w": 3}, {"name": "web", "w": 1}]})
    assert [str(h) for h in header_diff(a, b)] == ["sources.code.w: 2 -> 3"]
    a["index"]["path"], b["index"]["path"] = "../index", "../../index"
    assert [str(h) for h in header_diff(a, b)][-1] == 'index.path: "../index" -> "../../index"'


def test_header_diff_type_changes_and_lists_of_values():
    a = footer({"w": 0.5, "points": [[0, 1]], "gone": None}, "blake2b:1")
    b = footer({"w": {"points": [[0, 1]]}, "points": [[0, 2]], "new": "x"}, "blake2b:2")
    assert [str(h) for h in header_diff(a, b)] == [
        'w: 0.5 -> {"points":[[0,1]]}',
        "points: [[0,1]] -> [[0,2]]",
        "gone: null -> (absent)",
        'new: (absent) -> "x"',
        'index.fingerprint: "blake2b:1" -> "blake2b:2"',
    ]
    assert header_diff(a, a) == []
