"""The sources a plan draws from, as its footer describes them: each index source's place in
global sample ids and, for the sources the plan uses, how their samples are read (the
`fetch` facts the plan copied from the index), and the data root their files are under.

Nothing but the footer and the rank's blocks is read: no index table or manifest, so a
rank's memory and start-up follow its slice, not the corpus.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from mds.core import storage
from mds.core.datacheck import entry_paths
from mds.core.index_manifest import facts_problem
from mds.core.storage import given_root
from mds.core.vision import VisionGeometry
from mds.errors import MdsError, PlanError

__all__ = ["BYTE_RANGES", "JSONL", "PlanSources", "Source"]

JSONL = ("jsonl", "jsonl.zst")
BYTE_RANGES = (*JSONL, "webdataset")  # formats whose samples the plan locates by byte range


@dataclass
class Source:
    """One index source: its place in global ids and, if planned, how to read it. What its
    facts say is worked out once (they are read for every file a fetch reads)."""

    sid: int
    name: str
    base: int
    rows: int
    facts: dict[str, Any]
    tokenize: Callable[[str], Sequence[int]] | None = None  # text sources (`tokens.bind`)

    @cached_property
    def fmt(self) -> str:
        return str(self.facts.get("format"))

    @cached_property
    def payload(self) -> dict[str, Any]:
        return self.facts.get("payload") or {}

    @property
    def length(self) -> dict[str, Any]:
        return self.facts.get("length") or {}

    @cached_property
    def image_text(self) -> bool:
        """Whether samples are text with images (docs/vision.md)."""
        return self.payload.get("kind") == "image_text"

    @property
    def exact(self) -> bool:
        return bool(self.length.get("exact", False))

    @cached_property
    def located(self) -> str | None:
        """How the plan's offset and length locate a sample besides its row: "bytes" (a JSONL
        line's or a WebDataset sample's byte range), "values" (a Parquet token list row:
        where its values start in the row group, and the plan's token count), or None."""
        if self.fmt in BYTE_RANGES:
            return "bytes"
        if self.fmt == "parquet" and self.payload.get("offsets") == "row_group":
            return "values"
        return None


class PlanSources:
    """The plan's sources and data root, from its footer; what blocks say of them is checked
    here (`source_of`, `same_record`, `locate`) before anything is read."""

    def __init__(
        self, footer: dict[str, Any], plan_path: Path, data_root: str | os.PathLike | None
    ):
        self.plan_path = plan_path
        try:
            fetch = footer["fetch"]
            root, facts = fetch["root"], fetch["sources"]
            train = footer["config"]["train"]
            planned = {s["name"]: int(s.get("samples", 0)) for s in footer.get("sources", [])}
            self.sources = [
                Source(i, str(s["name"]), int(s["base"]), int(s["rows"]), facts.get(s["name"], {}))
                for i, s in enumerate(footer["index"]["sources"])
            ]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PlanError(f"{plan_path}: corrupt plan footer (fetch facts: {exc})") from None
        if not isinstance(root, str) or not root:
            raise PlanError(f"{plan_path}: corrupt plan footer (data root {root!r})")
        self.root, recorded = storage.plan_data_root(plan_path, root, data_root)
        given, self._origin = given_root(data_root)
        self._recorded_root = root if given is None else None
        # a root elsewhere than the plan's: a copy there keeps names, sizes and mtimes
        # whatever its bytes are, so each file's content is checked on first use
        self.relocated = given is not None and storage.relocated(self.root, recorded)
        self.vision = _vision(footer, plan_path)
        self.truncate_to = (
            int(train["max_tokens_per_micro_batch"])
            if train.get("overlong") == "truncate"
            else None
        )
        self.bases = np.array([s.base for s in self.sources], dtype=np.int64)
        self._rows = np.array([s.rows for s in self.sources], dtype=np.int64)
        self.used = [s for s in self.sources if planned.get(s.name, 0) > 0]
        self._used_ids = {s.sid for s in self.used}  # source_of runs per file and sample
        for s in self.used:
            problem = facts_problem(s.facts)
            if problem is not None:
                raise PlanError(f"{plan_path}: corrupt plan footer (source {s.name!r}: {problem})")
        self.records: dict[tuple[int, int], Any] = {}  # (source id, file) -> its record
        self._dirs: set[str] = set()  # directories under the root found to be no symlinks

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]

    def root_origin(self) -> str:
        """Where the data root came from, for messages about it."""
        if self._recorded_root is not None:
            return f"recorded relative to the plan's directory as {self._recorded_root!r}"
        return f"from {self._origin}"

    def paths(self, entry: Any, where: str) -> tuple[Any, Any]:
        """(path, companion or None) of a file's record under the root; ValueError for a
        path that leaves it (`datacheck.entry_paths`)."""
        return entry_paths(self.root, entry, where, self._dirs)

    def locate(self, gids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source id, row) of global sample ids."""
        sid = np.searchsorted(self.bases, gids, side="right") - 1
        rows = gids.astype(np.int64) - self.bases[sid]
        if len(gids) and (sid.min() < 0 or np.any(rows >= self._rows[sid])):
            raise PlanError(f"{self.plan_path}: corrupt plan (a sample beyond its index's rows)")
        return sid, rows

    def source_of(self, sid: int) -> Source:
        """The used source a block names; PlanError for any other."""
        if sid not in self._used_ids:
            raise PlanError(f"{self.plan_path}: corrupt plan (a block names source {sid})")
        return self.sources[sid]

    def same_record(self, s: Source, fid: int, entry: Any) -> None:
        """Every block must give a file the same record: checks and open files are keyed by
        (source, file), so a record that differs would be read unchecked, or not at all."""
        seen = self.records.setdefault((s.sid, fid), entry)
        if seen is not entry and seen != entry:
            raise PlanError(
                f"{self.plan_path}: corrupt plan (blocks disagree on {s.name} files[{fid}])"
            )


def _vision(footer: dict[str, Any], plan_path: Path) -> VisionGeometry | None:
    """The image geometry a plan was made with (its `[vision]` table), or None."""
    data = (footer.get("config") or {}).get("vision")
    if data is None:
        return None
    try:
        return VisionGeometry.from_json(data, where="plan config.vision")
    except (MdsError, TypeError, ValueError) as exc:
        raise PlanError(f"{plan_path}: corrupt plan footer ({exc})") from None
