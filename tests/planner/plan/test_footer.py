"""src/mds/planner/plan/footer.py: what a plan's footer records, and its paths relative to
the plan's directory (for a plan in object storage, relative to the directory of the local
index it was made from, so it records what a plan beside that index records)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from plan_builders import plan_config, synthetic

from mds.planner.plan.chunk import STAT_COLUMNS, Planner
from mds.planner.plan.footer import PLAN_FORMAT, plan_footer, recorded_path

SOURCES = {"a": {"lengths": [5, 9, 13, 2], "weight": 1.0}, "b": {"lengths": [4, 3], "weight": 1.0}}
TRAIN = {"steps": 4, "dp_size": 1, "micro_batches": 1, "samples_per_step": 2,
         "max_tokens_per_micro_batch": 100}  # fmt: skip


def test_paths_are_relative_to_a_plan_file_or_to_the_anchor_of_an_object(tmp_path: Path):
    index = str(tmp_path / "index")
    assert recorded_path(index, tmp_path / "plans" / "p.mds") == os.path.join("..", "index")
    assert recorded_path(index, "s3://b/plans/p.mds", tmp_path) == "index"
    assert recorded_path(index, tmp_path / "p.mds") == "index"  # the same, beside the index
    assert recorded_path(index, "s3://b/plans/p.mds") == index  # no local anchor: absolute
    assert recorded_path("s3://b/index", tmp_path / "p.mds") == "s3://b/index"
    assert recorded_path("s3://b/index", "gs://c/p.mds", tmp_path) == "s3://b/index"


def test_a_plan_for_the_store_records_what_a_plan_beside_its_index_records(planner, tmp_path):
    final = planner.states()[-1]
    stats = np.zeros((4, len(STAT_COLUMNS)))
    local = plan_footer(planner, tmp_path / "p.mds", final, stats)
    assert plan_footer(planner, "s3://b/plans/p.mds", final, stats) == local
    planner.index_place = "s3://b/index"  # an index in the store: its URL, whatever the place
    url = plan_footer(planner, "s3://b/plans/p.mds", final, stats)
    assert url["index"]["path"] == "s3://b/index"
    assert plan_footer(planner, tmp_path / "p.mds", final, stats)["index"]["path"] == "s3://b/index"
    assert os.path.isabs(url["fetch"]["root"])  # a local root, with no local index to anchor it


@pytest.fixture
def planner(tmp_path: Path) -> Planner:
    return Planner(plan_config(tmp_path, synthetic(tmp_path, SOURCES, TRAIN)))


def test_the_footer_records_the_index_and_what_each_source_gave(planner, tmp_path: Path):
    final = planner.states()[-1]
    footer = plan_footer(planner, tmp_path / "p.mds", final, np.zeros((4, len(STAT_COLUMNS))))
    assert footer["format"] == PLAN_FORMAT and footer["steps"] == 4
    assert footer["index"]["path"] == "index"
    assert footer["index"]["fingerprint"] == planner.manifest.fingerprint
    assert [(s["name"], s["base"], s["rows"]) for s in footer["index"]["sources"]] == [
        ("a", 0, 4),
        ("b", 4, 2),
    ]
    given = {s["name"]: s["samples"] for s in footer["sources"]}
    assert sum(given.values()) == 8 and given == dict(
        zip(["a", "b"], final.consumed.tolist(), strict=True)
    )
    assert footer["stats_columns"] == list(STAT_COLUMNS)
    assert footer["fetch"]["root"] == "." and set(footer["fetch"]["sources"]) == {"a", "b"}
    assert "lineage" not in footer
