"""Shared test set-up: make the helper modules in tests/ (`builders`, `plan_builders`, ...)
importable by their names.

pyproject sets importlib import mode, so test files with the same base name in different
folders can coexist without `__init__.py` files.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
