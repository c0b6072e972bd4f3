from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mds.executor.errors import ConfigError
from mds.planner.lock import lock_path, output_lock


def test_lock_is_exclusive_and_removed(tmp_path: Path) -> None:
    out = tmp_path / "plan.mds"
    with output_lock(out) as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(ConfigError, match="is being written by pid"):
            with output_lock(out):
                pass
    assert not lock_path(out).exists()


def test_lock_removed_on_error(tmp_path: Path) -> None:
    out = tmp_path / "index"
    with pytest.raises(KeyboardInterrupt):
        with output_lock(out):
            raise KeyboardInterrupt
    assert not lock_path(out).exists()
