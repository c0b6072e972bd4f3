"""mds: plan the data of a multi-source, data-parallel training run offline, replay it in training.

The package is assembled from three folders (`cli/`, `planner/`, `executor/`; see
pyproject.toml). This module stays import-light: `import mds.executor` must not pull in
polars or the command line, and nothing here imports torch.
"""

__version__ = "0.1.0"

# The distribution on the package index; the import package and the command are `mds`.
DISTRIBUTION = "mds-planner"

__all__ = ["DISTRIBUTION", "__version__"]
