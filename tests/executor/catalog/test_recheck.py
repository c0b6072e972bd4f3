"""The checks that the data is what was planned: a file's version is pinned at its check, a
later version is refused (and stays refused) naming the step, and MDS_RECHECK=0 pins
nothing."""

from __future__ import annotations

import os

import pytest
from catalog_helpers import plan_of, two_columns

from mds.core.planfile_reader import PlanReader
from mds.errors import DataChangedError
from mds.executor.catalog.plan_sources import PlanSources
from mds.executor.catalog.recheck import RECHECK_ENV, DataChecks


@pytest.fixture
def planned(tmp_path):
    """(plan sources, rank 0's first block) of a one-file plan."""
    two_columns(tmp_path)
    _, plan = plan_of(
        tmp_path,
        [{"name": "A", "path": "d/data.parquet", "tokens": "a", "weight": 1}],
        dp_size=1,
    )
    with PlanReader(plan) as reader:
        return PlanSources(reader.footer, plan, None), reader.rank_chunk(0, 0)


def test_a_file_rewritten_after_its_check_is_refused_naming_the_step(planned):
    plan, block = planned
    checks = DataChecks(plan)
    checks.check_files(block, full=False)
    sid, fid, entry = block.fetch.files[0]
    assert checks.checked == {(sid, fid)} and checks.pins[(sid, fid)][0] is not None
    s = plan.sources[sid]
    path = plan.root / entry["path"]
    checks.recheck(s, fid, entry, [(0, path)])  # the pinned version: fine
    data = path.read_bytes()
    path.write_bytes(data + b"x")
    checks.step = 7
    with pytest.raises(DataChangedError, match=r"d/data\.parquet changed after it was checked"):
        checks.recheck(s, fid, entry, [(0, path)])
    path.write_bytes(data)  # restored: the file stays refused, the run cannot trust it
    with pytest.raises(DataChangedError, match="found reading at step 7"):
        checks.raise_if_changed((sid, fid))


def test_rechecks_off_pin_nothing(planned, monkeypatch):
    plan, block = planned
    monkeypatch.setenv(RECHECK_ENV, "0")
    checks = DataChecks(plan)
    checks.check_files(block, full=False)
    assert checks.checked and not checks.pins
    sid, fid, entry = block.fetch.files[0]
    path = plan.root / entry["path"]
    os.utime(path, ns=(1, 1))
    checks.recheck(plan.sources[sid], fid, entry, [(0, path)])  # not compared
