"""Shared test set-up: make the helper modules in tests/ (`builders`, `plan_builders`, ...)
importable by their names; the fault matrix's built data root (`root`).

pyproject sets importlib import mode, so test files with the same base name in different
folders can coexist without `__init__.py` files.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
import pytest  # noqa: E402  (after tests/ is on sys.path)
from fault_builders import built_world  # noqa: E402


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The fault matrix's data root (tests/fault_builders.py), index at root/index, plan at
    root/plan.mds; tests/faults/ and tests/test_faults.py damage it row by row."""
    return built_world(tmp_path)
