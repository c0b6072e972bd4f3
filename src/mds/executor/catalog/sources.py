"""The sources a plan draws from, as the executor sees them: how to read each sample the plan
names, how to turn its payload into token ids, and the checks that the data is still what
was planned.

Everything comes from the plan: the footer says how each planned source is read and
tokenized (`fetch`), and each rank's block names, per sample, its file (a record copied from
the index), the row or byte range in it and the planned token count. No index table or
manifest is read, so a rank's memory and start-up follow its slice, not the corpus.

`SourceCatalog` puts together the parts, one module each: the plan's sources and data root
(`plan_sources`), token ids (`tokens`), the checks of the files (`recheck`), the open files
and decoded blocks (`open_files`), the reads (`reads`) and the rows read early for later
steps (`early_rows`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mds.core import freed_memory, storage
from mds.core.object_ranges import drop_kept
from mds.core.planfile import RankChunk
from mds.errors import ConfigError
from mds.executor.catalog import tokens
from mds.executor.catalog.budget import budget
from mds.executor.catalog.early_rows import Lookahead
from mds.executor.catalog.first_reads import DEFAULT_STEPS, FirstReads
from mds.executor.catalog.open_files import OpenFiles
from mds.executor.catalog.plan_sources import PlanSources
from mds.executor.catalog.reads import SampleReads
from mds.executor.catalog.recheck import DataChecks, Pins
from mds.executor.catalog.tokens import ESTIMATED, TokenIds, Tokenize

__all__ = ["SourceCatalog"]

# Freed memory is handed back to the system (`freed_memory`, about a millisecond) every this
# many fetches, or once the rows read ahead grew by this many bytes: against the holes that
# decodes freed between rows kept leave.
GIVE_BACK_EVERY = 128
GIVE_BACK_BYTES = 8 << 20
_FIRST_WINDOW = 64 << 20  # most bytes asked ahead of the first steps' reads (`first_reads`)


class SourceCatalog:
    """Fetches samples as token-id arrays, checked against the lengths the plan used.

    `next_block(block)`: the rank's block of the chunk after `block`'s, or None (the rows
    read early for later steps may reach into it; without it they stay within a chunk).
    """

    def __init__(
        self,
        footer: dict[str, Any],
        plan_path: Path,
        *,
        data_root: str | os.PathLike | None = None,
        tokenize: Tokenize | Mapping[str, Tokenize] | None = None,
        estimated: str = "error",
        cache_bytes: int | None = None,
        memory_bytes: int | None = None,
        max_open_files: int = 64,
        read_threads: int = 2,
        next_block: Callable[[RankChunk], RankChunk | None] | None = None,
        first_reads: int | None = None,
    ):
        if not isinstance(max_open_files, int) or max_open_files < 1:
            raise ConfigError(f"max_open_files={max_open_files!r} must be an integer >= 1")
        if isinstance(read_threads, bool) or not isinstance(read_threads, int) or read_threads < 1:
            raise ConfigError(f"read_threads={read_threads!r} must be an integer >= 1")
        self.budget = budget(memory_bytes, cache_bytes, read_threads)
        if estimated not in ESTIMATED:
            raise ConfigError(f"estimated={estimated!r} must be one of {', '.join(ESTIMATED)}")
        self.plan = PlanSources(footer, plan_path, data_root)
        tokens.bind(self.plan, tokenize, estimated)
        self.tokens = TokenIds(self.plan)
        # object handles opened by the first reads or a check are kept, with this tag, for
        # the check and the open that come next (`object_ranges.keep_open`)
        self._kept = object()
        self.checks = DataChecks(self.plan, owner=self._kept)
        # the cache's share bounds both kinds of decoded data kept between steps: a quarter
        # for rows read ahead (`Lookahead`), the rest for whole blocks (row groups, frames)
        ahead = self.budget.ahead
        self.ahead = Lookahead(ahead, next_block=next_block) if ahead else None
        self.files = OpenFiles(self.plan, self.checks, max_open_files, self.budget)
        if first_reads is None:  # round trips dominate objects' first reads; local ones are CPU
            first_reads = DEFAULT_STEPS if storage.is_url(self.plan.root) else 0
        if isinstance(first_reads, bool) or not isinstance(first_reads, int) or first_reads < 0:
            raise ConfigError(f"first_reads={first_reads!r} must be an integer >= 0 (steps)")
        # bytes asked ahead of the first steps' reads: a quarter of the block cache's share,
        # 64 MiB at most
        window = min(_FIRST_WINDOW, self.files.block_bytes // 4)
        self.first = FirstReads(self.plan, first_reads, window, owner=self._kept)
        self.reads = SampleReads(
            self.plan, self.checks, self.files, self.ahead, read_threads, self.first
        )
        self._fetches = 0  # since the start
        self._kept_low = 0  # the fewest bytes of rows read ahead since the last hand-back

    @property
    def names(self) -> list[str]:
        return self.plan.names

    def build_every(self, stride: int) -> None:
        """This process builds every `stride`-th micro-batch: rows are read ahead only for
        those (`Lookahead`)."""
        if self.ahead is not None:
            self.ahead.stride = stride
        self.first.stride = stride

    def checked_files(self) -> tuple[set[tuple[int, int]], Pins]:
        """The files this process checked and the versions pinned at their checks, for a
        process that goes on from here (a spawned DataLoader worker): `restore_checks`."""
        return self.checks.checked, self.checks.pins

    def restore_checks(self, checked: set[tuple[int, int]], pins: Pins) -> None:
        """Take over another process's `checked_files()`: those files are not checked again,
        and what is read of them must be the versions pinned there."""
        self.checks.restore(checked, pins)

    def reset(self) -> None:
        """Forget open files, cached blocks and rows read ahead (a new process must not share
        descriptors)."""
        if self.ahead is not None:
            self.ahead.clear()
        self.first.forget()
        self.files.reset()
        self.reads.reset()
        self._fetches = self._kept_low = 0  # a new process: its first fetch hands back too

    def close(self) -> None:
        self.first.close()
        drop_kept(self._kept)
        self.reads.close()
        if self.ahead is not None:
            self.ahead.clear()
        self.files.close()

    def _give_back(self) -> None:
        """Hand freed memory back to the system (`freed_memory`) after the first fetch (which
        opens the files), every GIVE_BACK_EVERY fetches, and once the rows read ahead grew
        by GIVE_BACK_BYTES since the last time: the decodes that take them leave holes."""
        self._fetches += 1
        kept = self.ahead.nbytes if self.ahead is not None else 0
        self._kept_low = min(self._kept_low, kept)
        if (
            self._fetches == 1
            or self._fetches % GIVE_BACK_EVERY == 0
            or kept - self._kept_low >= GIVE_BACK_BYTES
        ):
            freed_memory.give_back()
            self._kept_low = kept

    def check_files(self, block: RankChunk, full: bool, lo: int = 0, hi: int | None = None) -> None:
        """Check (and pin) the files samples [lo, hi) of `block` read that this process has
        not checked yet (`DataChecks.check_files`)."""
        self.checks.check_files(block, full, lo, hi)

    def locate(self, gids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source id, row) of global sample ids."""
        return self.plan.locate(gids)

    def fetch(
        self, block: RankChunk, lo: int, hi: int, step: int | None = None
    ) -> list[np.ndarray]:
        """Token ids (integer arrays) of samples [lo, hi) of `block`, in order, checked and
        truncated. One reader call per file: its rows are read together, with the rows this
        rank's later samples need from a block-coded file (see `Lookahead`). `step`: the
        step they are of, named by the error if a file changed."""
        self.first.follow(block, lo, hi)
        payloads = self.reads.payloads(block, lo, hi, step)
        self._give_back()
        return self.tokens.of_samples(block, lo, hi, payloads)
