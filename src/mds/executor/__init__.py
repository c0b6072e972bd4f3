"""mds.executor: replay one rank's slice of a plan inside training.

Import-light on purpose: no polars, no planner. `PlanExecutor` and `PlanLoader` (which
need torch) and `OnlineExecutor` load on first access, so importing the errors stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mds.errors import (
    ConfigError,
    DataChangedError,
    IndexFormatError,
    MdsError,
    PlanError,
    SourceDataError,
    needs_extra,
)
from mds.executor.mesh import MeshPosition, mesh_position
from mds.executor.moved import MOVED
from mds.executor.moved import install as _install_moved_paths

if TYPE_CHECKING:
    from mds.executor.executor import PlanExecutor
    from mds.executor.loader import PlanLoader
    from mds.executor.online import OnlineExecutor

__all__ = [
    "ConfigError",
    "DataChangedError",
    "IndexFormatError",
    "MdsError",
    "MeshPosition",
    "OnlineExecutor",
    "PlanError",
    "PlanExecutor",
    "PlanLoader",
    "SourceDataError",
    "mesh_position",
]

_install_moved_paths()

_LAZY = {
    "OnlineExecutor": "mds.executor.online",
    "PlanExecutor": "mds.executor.executor",
    "PlanLoader": "mds.executor.loader",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        with needs_extra(f"mds.executor.{name}", "train"):
            return getattr(importlib.import_module(_LAZY[name]), name)
    if f"{__name__}.{name}" in MOVED:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'mds.executor' has no attribute {name!r}")
