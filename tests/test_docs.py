"""The docs stay true: every command has help with an example and appears in the README,
and the README's config example is a valid config."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_helpers import mds

from mds.cli.main import app
from mds.planner.plan_config import load_plan_config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
COMMANDS = sorted(c.name for c in app.registered_commands)


def test_there_are_commands():
    assert {"index", "plan", "export", "inspect", "verify", "diff"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(command):
    result = mds(command, "--help")
    assert result.exit_code == 0, result.output
    assert "Example:" in result.output
    assert f"mds {command}" in result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_is_in_the_readme(command):
    assert f"mds {command} " in README


def test_readme_config_example_is_valid(tmp_path):
    block = re.search(r"## Config by example\n\n```toml\n(.*?)```", README, re.S)
    assert block is not None
    config = tmp_path / "mds.toml"
    config.write_text(block.group(1), encoding="utf-8")
    plan = load_plan_config(config)
    assert [s.name for s in plan.sources] == ["web", "books", "math"]
    assert plan.train.dp_size == 64
