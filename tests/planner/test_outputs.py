from __future__ import annotations

import os
from pathlib import Path

import pytest

from mds.executor.errors import ConfigError
from mds.planner.outputs import check_output


def test_same_file_through_a_hard_link(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text("x")
    os.link(tmp_path / "a.toml", tmp_path / "b")
    with pytest.raises(ConfigError, match="is the config file .*a.toml; choose another output"):
        check_output("-o", tmp_path / "b", [("config file", tmp_path / "a.toml")])


def test_directory_output_holding_an_input(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d/x.jsonl").write_text("{}")
    with pytest.raises(ConfigError, match="holds the source file"):
        check_output("-o", tmp_path, [("source file", tmp_path / "d/x.jsonl")], directory=True)


def test_unrelated_output_passes(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text("x")
    check_output("-o", tmp_path / "plan.mds", [("config file", tmp_path / "a.toml"), ("x", None)])
