"""Shared test set-up: make `tests/builders.py` importable as `builders`; the fault
matrix's built data root.

pyproject sets importlib import mode, so test files with the same base name in different
folders can coexist without `__init__.py` files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The fault matrix's data root, with its index (root/index) and plan (root/plan.mds)
    already built (tests/fault_builders.py)."""
    from fault_builders import index_world, plan_world, write_world

    root = tmp_path / "data"
    write_world(root)
    index_world(root)
    plan_world(root)
    return root
