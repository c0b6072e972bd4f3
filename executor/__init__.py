"""mds.executor: replay one rank's slice of a plan inside training.

Import-light on purpose: no polars, no planner. Heavy pieces (torch) load on first use.
"""

from mds.executor.errors import (
    ConfigError,
    DataChangedError,
    IndexFormatError,
    MdsError,
    PlanError,
    SourceDataError,
)

__all__ = [
    "ConfigError",
    "DataChangedError",
    "IndexFormatError",
    "MdsError",
    "PlanError",
    "SourceDataError",
]
assert sorted(__all__) == __all__
