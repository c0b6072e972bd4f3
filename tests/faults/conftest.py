"""Fixtures of the fault matrix's class files: a built data root, as in tests/test_faults.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from fault_builders import index_world, plan_world, write_world


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A data root with its index (root/index) and plan (root/plan.mds) already built."""
    root = tmp_path / "data"
    write_world(root)
    index_world(root)
    plan_world(root)
    return root
