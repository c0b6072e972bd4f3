"""The fault matrix's starting point: a data root with its index and plan already built,
which every fault row then damages in its own way."""

from __future__ import annotations

from pathlib import Path

import pytest
from fault_builders import built_world


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The world's data root (tests/fault_builders.py), index at root/index, plan at
    root/plan.mds."""
    return built_world(tmp_path)
