"""Check a plan's fetch records against its index: the executor trusts them instead of
reading the index, so `mds verify` proves they say what the index says, sample by sample.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mds.core.planfile import RankChunk
from mds.core.planfile_reader import PlanReader
from mds.core.vision import VisionGeometry
from mds.errors import MdsError
from mds.planner.index.tables import IndexManifest, read_table
from mds.planner.plan.fetch import FILE_KEYS, source_facts
from mds.planner.plan.pool import location_columns
from mds.planner.plan.vision import image_parts, is_image_text

__all__ = ["IndexTables", "fetch_problem"]

_COLUMNS = ("file_id", "file_row", "n_tokens")


def _facts_problem(footer: dict[str, Any], manifest: IndexManifest) -> str | None:
    facts = (footer.get("fetch") or {}).get("sources")
    if not isinstance(facts, dict):
        return "the footer has no fetch facts"
    for name, got in facts.items():
        try:
            entry = manifest.source(name)
        except MdsError:
            return f"fetch facts name source {name!r}, which the index does not have"
        want = source_facts(entry)
        if got != want:
            return f"source {name!r}: fetch facts {got} differ from the index's {want}"
    return None


class IndexTables:
    """The index's location columns, read once per source (checksum-checked while read) for
    both the table check and the fetch records' check."""

    def __init__(self, manifest: IndexManifest, vision: dict[str, Any] | None = None):
        """`vision`: the plan's image geometry (its footer's `config.vision`), with which an
        image-text sample's recorded tokens are its backbone length."""
        self.manifest = manifest
        self.geometry = None if vision is None else VisionGeometry.from_json(vision, "plan footer: vision")
        self.bases = np.cumsum([0] + [int(s["rows"]) for s in manifest.sources])
        self._columns: dict[int, dict[str, np.ndarray]] = {}

    def columns(self, sid: int) -> dict[str, np.ndarray]:
        if sid not in self._columns:
            entry = self.manifest.sources[sid]
            frame = read_table(self.manifest.path / entry["table"], entry["table_checksum"])
            names = _COLUMNS + tuple(c for c in location_columns(entry) if c not in _COLUMNS)
            columns = {n: frame[n].to_numpy().astype(np.int64) for n in names}
            if self.geometry is not None and is_image_text(entry):
                columns["n_tokens"] += image_parts(frame, self.geometry, entry["name"]).image_tokens
            self._columns[sid] = columns
        return self._columns[sid]

    def problem(self, sid: int) -> str | None:
        """Why source `sid`'s table cannot be used (unreadable, damaged, not a table), or None."""
        try:
            self.columns(sid)
        except MdsError as exc:
            return str(exc)
        return None


def _block_problem(block: RankChunk, tables: IndexTables) -> str | None:
    """The first disagreement of one block's records with the index, or None."""
    rec, sources = block.fetch, tables.manifest.sources
    for sid, fid, entry in rec.files:
        if not (0 <= sid < len(sources) and 0 <= fid < len(sources[sid]["files"])):
            return f"file record [{sid}, {fid}] names no file of the index"
        item = sources[sid]["files"][fid]
        if entry != {k: item[k] for k in FILE_KEYS if k in item}:
            return f"file record of {sources[sid]['name']} files[{fid}] differs from the index"
    if not len(block.ids):
        return None
    gids = block.ids.astype(np.int64)
    sid_of = np.searchsorted(tables.bases, gids, side="right") - 1
    pairs = np.array([(s, f) for s, f, _ in rec.files], dtype=np.int64).reshape(-1, 2)
    named = pairs[rec.file.astype(np.int64)]
    if np.any(named[:, 0] != sid_of):
        return "a sample's file record is of another source"
    for sid in np.unique(sid_of).tolist():
        pick = np.flatnonzero(sid_of == sid)
        rows = gids[pick] - tables.bases[sid]
        cols = tables.columns(sid)
        # a column the source is not located by is 0 in the plan
        index = {c: cols[c][rows] if c in cols else 0 for c in ("offset", "length")}
        checks = {
            "file": (named[pick, 1], cols["file_id"][rows]),
            "row": (rec.row[pick].astype(np.int64), cols["file_row"][rows]),
            "tokens": (rec.tokens[pick].astype(np.int64), cols["n_tokens"][rows]),
            "offset": (rec.offset[pick].astype(np.int64), index["offset"]),
            "length": (rec.length[pick].astype(np.int64), index["length"]),
        }
        for what, (got, want) in checks.items():
            bad = np.flatnonzero(got != want)
            if bad.size:
                j = int(bad[0])
                return (
                    f"source {sources[sid]['name']!r} row {int(rows[j])}: the plan's {what} "
                    f"{int(got[j])} differs from the index's {int(np.broadcast_to(want, got.shape)[j])}"
                )
    return None


def fetch_problem(reader: PlanReader, tables: IndexTables) -> tuple[str | None, int]:
    """(the first disagreement of the plan's fetch records with the index, or None; the
    number of samples checked). Blocks that fail their checksum are left to the block check."""
    problem = _facts_problem(reader.footer, tables.manifest)
    if problem is not None:
        return problem, 0
    samples = 0
    for c in range(len(reader.chunks)):
        for r in range(reader.dp):
            try:
                block = reader.rank_chunk(c, r)
            except MdsError:
                continue
            problem = _block_problem(block, tables)
            if problem is not None:
                return f"chunk {c} rank {r}: {problem}", samples
            samples += len(block.ids)
    return None, samples
