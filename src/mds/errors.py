"""The one error tree of mds: everything a user can cause raises an ``MdsError``.

It lives in the executor because the executor is the dependency-free base that both the
planner and the CLI import; the CLI prints these as one line, anything else is a bug.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "EXTRAS",
    "ConfigError",
    "DataChangedError",
    "IndexFormatError",
    "Interrupted",
    "MdsError",
    "MissingExtraError",
    "PlanError",
    "OutputError",
    "SourceDataError",
    "install_hint",
    "missing_extra",
    "needs_extra",
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


class MissingExtraError(MdsError, ImportError):
    """A package of an optional extra is not installed; the message names the extra and how
    to install it. An ImportError too, so `except ImportError` around an import catches it."""


# Optional dependencies (top-level import names) by the extra of pyproject.toml that
# installs them.
EXTRAS = {
    "polars": "plan",
    "torch": "train",
    "tokenizers": "tokenizers",
    "PIL": "vision",
    "simplejpeg": "vision",
    "lightning": "lightning",
    "transformers": "hf",
    "accelerate": "hf",
    "megatron": "megatron",
    "boto3": "s3",
    "ray": "ray",
}


@functools.cache
def _version() -> str:
    """The installed distribution's version (read from its metadata once: a scan of the
    path), without importing the package."""
    from importlib import metadata

    try:
        return metadata.version("mds-planner")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "<version>"


def install_hint(extra: str) -> str:
    """How to install an extra (or several, "plan,ray"), in the words every hint uses. The
    distribution is not on a package index: it installs from a source checkout, or from the
    wheel that `make dist` builds there."""
    wheel = f"dist/mds_planner-{_version()}-py3-none-any.whl"
    return (
        f"pip install '.[{extra}]' in the mds checkout "
        f"(or pip install '{wheel}[{extra}]' after make dist)"
    )


def missing_extra(
    exc: ModuleNotFoundError, needed_by: str = "this command", extra: str | None = None
) -> MissingExtraError | None:
    """The one-line error for a missing optional dependency, or None when the missing
    module belongs to no extra (a bug, not a missing install). `extra`: the extra to name
    for torch or that extra's own packages (`lightning` installs lightning and torch); any
    other package is named with its own extra."""
    package = (exc.name or "").split(".")[0]
    if package not in EXTRAS:
        return None
    own = EXTRAS[package]
    named = extra if extra is not None and own in (extra, "train") else own
    return MissingExtraError(
        f"{needed_by} needs {package}, which is not installed: {install_hint(named)}"
    )


@contextmanager
def needs_extra(needed_by: str, extra: str | None = None) -> Iterator[None]:
    """Imports inside this block that fail for a missing optional dependency raise
    MissingExtraError naming `needed_by` and the extra; other import errors pass unchanged."""
    try:
        yield
    except ModuleNotFoundError as exc:
        error = missing_extra(exc, needed_by, extra)
        if error is None:
            raise
        raise error from None
