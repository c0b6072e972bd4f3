"""What the executor needs to fetch each planned sample, written into every rank's plan block:
the file (a record copied from the index manifest), the row or byte range inside it, and the
index's token count. With these a rank replays its slice without reading the index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from mds.core.planfile import Fetch
from mds.planner.index.tables import IndexManifest
from mds.planner.plan.pool import JSONL_FORMATS, RANGE_FORMATS, SourcePool

__all__ = ["FILE_KEYS", "JSONL_FORMATS", "FetchTable", "source_facts"]

# The manifest keys of a file entry the executor uses: where the file is, how to check it.
FILE_KEYS = ("path", "index_path", "size", "mtime_ns", "fingerprint")
# The manifest keys of a source the executor uses to read and tokenize its samples.
SOURCE_KEYS = ("format", "payload", "length")


def source_facts(entry: dict[str, Any]) -> dict[str, Any]:
    """A source's reading facts for the plan footer: format, payload, length rule, and the
    fingerprint of the tokenizer.json the index counted with, if any."""
    facts = {key: entry.get(key) for key in SOURCE_KEYS}
    try:
        spec = json.loads(entry.get("spec_key") or "{}")
    except ValueError:
        spec = None
    if isinstance(spec, dict) and spec.get("tokenizer_fingerprint"):
        facts["tokenizer_fingerprint"] = spec["tokenizer_fingerprint"]
    return facts


@dataclass
class _Files:
    """One planned source's file list, as the manifest gives it."""

    sid: int  # the source's position in the index
    pool: SourcePool
    first_rows: np.ndarray  # int64, per file
    files: list[dict[str, Any]]  # the manifest's file entries
    jsonl: bool

    def entry(self, fid: int) -> dict[str, Any]:
        """What a file record copies of the manifest's entry (made when a block names it, so
        a source of a million files costs no copy of its list)."""
        item = self.files[fid]
        return {k: item[k] for k in FILE_KEYS if k in item}


class FetchTable:
    """Maps global sample ids of planned sources to fetch records."""

    def __init__(self, manifest: IndexManifest, pools: list[SourcePool]):
        position = {s["name"]: i for i, s in enumerate(manifest.sources)}
        found = []
        for pool in pools:
            entry = manifest.source(pool.name)
            files = entry["files"]
            first = np.array([int(f["first_row"]) for f in files], dtype=np.int64)
            jsonl = entry["format"] in RANGE_FORMATS
            found.append(_Files(position[pool.name], pool, first, files, jsonl))
        found.sort(key=lambda f: f.pool.base)
        self._sources = found
        self._bases = np.array([f.pool.base for f in found], dtype=np.int64)
        # Every planned file numbered in (source, file) order: file_base[k] + file index.
        by_sid = sorted(range(len(found)), key=lambda k: found[k].sid)
        sizes = np.array([len(found[k].files) for k in by_sid], dtype=np.int64)
        starts = np.cumsum(sizes) - sizes
        self._file_base = np.zeros(len(found), dtype=np.int64)
        self._file_base[by_sid] = starts
        self._file_starts, self._file_owner = starts, np.array(by_sid, dtype=np.int64)
        self._files = int(sizes.sum())

    def records(self, ids: np.ndarray) -> Fetch:
        """Fetch records of `ids` (global ids of planned samples), in their order; the file
        list holds each file once, sorted by (source, file)."""
        columns, files = self.chunk_records(ids, np.array([0, len(ids)]))
        return Fetch(*columns, files=files[0])

    def chunk_records(
        self, ids: np.ndarray, bounds: np.ndarray
    ) -> tuple[list[np.ndarray], list[list[tuple[int, int, dict[str, Any]]]]]:
        """records(ids[bounds[k]:bounds[k + 1]]) for every block k, computed for all of `ids`
        at once (a chunk's blocks: one set of numpy passes, not one per DP rank): the
        columns of Fetch for all of `ids`, and each block's file list."""
        n = len(ids)
        ids = ids.astype(np.int64, copy=False)
        gfile = np.zeros(n, dtype=np.int64)  # the planned-file number of each sample
        row_in = np.zeros(n, dtype=np.int64)
        tokens = np.zeros(n, dtype=np.int64)
        offset = np.zeros(n, dtype=np.int64)
        length = np.zeros(n, dtype=np.int64)
        which = np.searchsorted(self._bases, ids, side="right") - 1
        present = np.bincount(which, minlength=len(self._sources)) if n else []
        for k in np.flatnonzero(present).tolist():
            src = self._sources[k]
            pick = np.flatnonzero(which == k) if len(self._sources) > 1 else slice(None)
            rows = ids[pick] - src.pool.base
            by_row = src.pool.by_row
            fid = np.searchsorted(src.first_rows, rows, side="right") - 1
            gfile[pick] = self._file_base[k] + fid
            tokens[pick] = by_row["n_tokens"][rows]
            if src.jsonl:
                row_in[pick] = by_row["file_row"][rows]
                offset[pick] = by_row["offset"][rows]
                length[pick] = by_row["length"][rows]
            else:
                row_in[pick] = rows - src.first_rows[fid]
                if "offset" in by_row:  # a Parquet token list: the row's first value in its group
                    offset[pick] = by_row["offset"][rows]
        # The files named, in (source, file) order, and each sample's place among them.
        if self._files <= 4 * n + 1024:  # a table of every planned file: no sort
            seen = np.bincount(gfile, minlength=self._files) > 0
            files = np.flatnonzero(seen)
            key_of = (np.cumsum(seen) - 1)[gfile]
        else:
            files, key_of = np.unique(gfile, return_inverse=True)
            key_of = key_of.reshape(-1)
        # Each block's files: the distinct (block, file) pairs, by block and then by file.
        blocks, F = len(bounds) - 1, max(len(files), 1)
        block = np.repeat(np.arange(blocks, dtype=np.int64), np.diff(bounds))
        pair = block * F + key_of
        if blocks * F <= 4 * n + 1024:  # a table of every (block, file): no sort
            seen = np.bincount(pair, minlength=blocks * F) > 0
            pairs = np.flatnonzero(seen)
            local = (np.cumsum(seen) - 1)[pair]
        else:
            pairs, local = np.unique(pair, return_inverse=True)
            local = local.reshape(-1)
        local = local.astype(np.int64)
        first = np.searchsorted(pairs, np.arange(blocks + 1, dtype=np.int64) * F)
        local -= first[block]
        owner = self._file_owner[np.searchsorted(self._file_starts, files, side="right") - 1]
        entries = []
        for k, g in zip(owner.tolist(), files.tolist(), strict=True):
            src = self._sources[k]
            fid = g - int(self._file_base[k])
            entries.append((src.sid, fid, src.entry(fid)))
        which_file = (pairs % F).tolist()
        files_of = [
            [entries[f] for f in which_file[first[b] : first[b + 1]]] for b in range(blocks)
        ]
        return [local, row_in, tokens, offset, length], files_of
