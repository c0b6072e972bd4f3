"""Put this folder on sys.path, so the readers' tests share `reader_helpers` as the tests at
the top share `builders` (tests/conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
