"""Planned samples' contents for the tools (`mds trace`, `mds export --hash`): each sample's
payload read as the executor reads it (its file checked against the plan's record first),
and its content hash (core/content_hash.py). Nothing is tokenized, so a text source needs
no tokenizer here; no torch is imported.

Only the files of the samples asked for are opened: a block (or the part of it picked by
`subset`) names them.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mds.core.content_hash import content_hash
from mds.core.planfile import Fetch, RankChunk
from mds.executor.catalog.budget import budget
from mds.executor.catalog.open_files import OpenFiles
from mds.executor.catalog.plan_sources import PlanSources
from mds.executor.catalog.reads import SampleReads
from mds.executor.catalog.recheck import DataChecks

__all__ = ["SampleContents", "subset"]


def subset(block: RankChunk, positions: np.ndarray) -> RankChunk:
    """The samples of `block` at `positions` (in that order) as a block of their own: the
    same file records, so reads and checks see the plan's records. Its counts are not
    meaningful (one row of all the samples)."""
    positions = np.asarray(positions, dtype=np.int64)
    rec = block.fetch
    fetch = replace(rec, **{name: getattr(rec, name)[positions] for name in _COLUMNS})
    counts = np.array([[len(positions)]], dtype=np.int64)
    return RankChunk(block.step_start, counts, block.ids[positions], fetch)


_COLUMNS = ("file", "row", "tokens", "offset", "length")
assert _COLUMNS == tuple(f for f in Fetch.__dataclass_fields__ if f != "files")


class SampleContents:
    """Reads planned samples' payloads from a plan's data root (`data_root` overrides the
    one the plan records, as for the executor)."""

    def __init__(
        self,
        footer: dict[str, Any],
        plan_path: str | Path,
        data_root: str | os.PathLike | None = None,
        max_open_files: int = 64,
        memory_bytes: int = 64 << 20,
    ):
        self.plan = PlanSources(footer, plan_path, data_root)  # type: ignore[arg-type]
        self.checks = DataChecks(self.plan)
        self.files = OpenFiles(self.plan, self.checks, max_open_files, budget(memory_bytes, None, 1))
        self.reads = SampleReads(self.plan, self.checks, self.files, None, 1)

    def payloads(self, block: RankChunk) -> list[Any]:
        """Every sample of `block`'s payload, in order: token ids, text, or `ImageText`."""
        n = len(block.ids)
        self.checks.check_files(block, False, 0, n)
        return self.reads.payloads(block, 0, n)

    def hashes(self, block: RankChunk) -> list[str]:
        """Every sample of `block`'s content hash, in order."""
        return [content_hash(p) for p in self.payloads(block)]

    def close(self) -> None:
        self.reads.close()
        self.files.close()

    def __enter__(self) -> SampleContents:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
