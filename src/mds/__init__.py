"""mds: plan the data of a multi-source, data-parallel training run offline, replay it in training.

The package is assembled from four folders (this one, `package/`, and `cli/`, `planner/`,
`executor/`; see pyproject.toml). The folder is not named `mds` so that a source checkout
never shadows an installed package when run from its root. This module stays import-light: `import mds.executor` must not pull in
polars or the command line, and nothing here imports torch.
"""

__version__ = "0.1.0"

# The distribution on the package index; the import package and the command are `mds`.
DISTRIBUTION = "mds-planner"

__all__ = ["DISTRIBUTION", "__version__"]
