"""The one error tree of mds: everything a user can cause raises an ``MdsError``.

It lives in the executor because the executor is the dependency-free base that both the
planner and the CLI import; the CLI prints these as one line, anything else is a bug.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DataChangedError",
    "IndexFormatError",
    "Interrupted",
    "MdsError",
    "PlanError",
    "OutputError",
    "SourceDataError",
]


class MdsError(Exception):
    """Base class for errors caused by user input or user data (never by a bug)."""


class ConfigError(MdsError):
    """A config file or command-line option is invalid; the message names the key."""


class SourceDataError(MdsError):
    """A source file is missing, unreadable or malformed; the message names file and row."""


class IndexFormatError(MdsError):
    """An index directory is missing, corrupt, or from an unsupported format version."""


class PlanError(MdsError):
    """A plan cannot be built, or a plan file is corrupt or from an unsupported version."""


class OutputError(MdsError):
    """An output file could not be written (disk full, read-only, permissions)."""


class DataChangedError(MdsError):
    """Source files differ from the ones fingerprinted when the index or plan was made."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM after an output was already changed: the message says exactly what
    was left (the CLI prints it instead of "nothing was written")."""
