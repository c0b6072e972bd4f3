"""The `page_reads` switch: whether Parquet pages are read by this package's own decoders
(`pages`: the executor's rows; `levels`: the indexer's list lengths) or by pyarrow.

Set by the environment variable MDS_PAGE_READS, read at each use:
- `on` (the default): our decoders, where they take the file (else pyarrow, as always);
- `off`: pyarrow only (the executor decodes whole row groups; the indexer's list lengths
  come from pyarrow's decode of the column);
- `check`: both, compared exactly; a difference raises SourceDataError (`mismatch`).
"""

from __future__ import annotations

import os

from mds.errors import ConfigError, SourceDataError

__all__ = ["ENV", "MODES", "mismatch", "mode", "unreadable"]

ENV = "MDS_PAGE_READS"
MODES = ("on", "off", "check")


def mode() -> str:
    """The switch's setting: "on", "off" or "check"; ConfigError for any other value."""
    value = os.environ.get(ENV, "on")
    if value not in MODES:
        raise ConfigError(
            f"{ENV}={value!r} is not a page reads setting (allowed: {', '.join(MODES)})"
        )
    return value


def mismatch(file: str, group: int, column: str, row: int, what: str) -> SourceDataError:
    """The error of `check`: our decoder and pyarrow differ at `row` (of the file) of row
    group `group`."""
    return SourceDataError(
        f"{file}: row group {group}, column '{column}', row {row}: the page reader's {what} "
        f"differ from pyarrow's; set {ENV}=off to read this file with pyarrow only"
    )


def unreadable(file: str, group: int, column: str, exc: BaseException) -> SourceDataError:
    """The error of `check` where pyarrow cannot decode what our decoder read."""
    text = str(exc).strip()
    reason = text.splitlines()[0] if text else type(exc).__name__
    return SourceDataError(
        f"{file}: row group {group}, column '{column}': pyarrow cannot read it ({reason}), "
        f"so the page reader's token ids cannot be checked; set {ENV}=off to read this file "
        "with pyarrow only"
    )
