"""`mds export` from the command line: the Parquet table, --steps and --rank, errors."""

from __future__ import annotations

import json

import polars as pl
import pytest
from cli_helpers import json_error, mds, one_error_line
from plan_builders import SAMPLE_CONFIG, sample_index


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    index = sample_index(tmp_path_factory)
    path = tmp_path_factory.mktemp("export-cli") / "plan.mds"
    result = mds("plan", SAMPLE_CONFIG, "--index", index, "-o", path, "--json")
    assert result.exit_code == 0, result.output
    return path


def test_export_all(plan, tmp_path):
    out = tmp_path / "plan.parquet"
    result = mds("export", plan, "-o", out)
    assert result.exit_code == 0, result.output
    frame = pl.read_parquet(out)
    assert result.stdout == f"wrote {frame.height:,} rows to {out}\n"
    assert {"sample_id", "epoch", "planned_tokens", "byte_offset"} <= set(frame.columns)
    assert frame["step"].max() == 63


def test_steps_and_ranks(plan, tmp_path):
    out = tmp_path / "part.parquet"
    result = mds("export", plan, "-o", out, "--steps", "10:12", "--rank", "1", "--rank", "3")
    assert result.exit_code == 0, result.output
    frame = pl.read_parquet(out)
    assert sorted(frame["step"].unique()) == [10, 11]
    assert sorted(frame["rank"].unique()) == [1, 3]
    data = json.loads(mds("export", plan, "-o", out, "--steps", "60:", "--json").stdout)
    assert data["rows"] == pl.read_parquet(out).height
    assert sorted(pl.read_parquet(out)["step"].unique()) == [60, 61, 62, 63]


def test_bad_selections(plan, tmp_path):
    out = tmp_path / "x.parquet"
    one_error_line(mds("export", plan, "-o", out, "--steps", "3"), "--steps '3': expected A:B")
    one_error_line(
        mds("export", plan, "-o", out, "--steps", "5:99"),
        "--steps 5:99 is not inside the plan's steps 0:64",
    )
    json_error(mds("export", plan, "-o", out, "--rank", "4", "--json"), "--rank 4 is not a DP rank")
    assert not out.exists()
