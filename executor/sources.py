"""The sources a plan draws from, as the executor sees them: where each sample lives, how to
turn its payload into token ids, and the checks that the data is still what was planned.

A sample is (source, row). Rows of one file are contiguous in the index table, so a
Parquet, Arrow or Megatron row's place in its file is `row - first_row`; JSONL rows carry
a byte offset and length. Only the columns needed are loaded, once per source and process,
and only for sources the plan uses.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mds.executor.datacheck import entry_paths, file_problem, safe_path
from mds.executor.errors import ConfigError, DataChangedError, IndexFormatError, SourceDataError
from mds.executor.fingerprint import fingerprint
from mds.executor.lru import LRU
from mds.executor.manifest import IndexManifest, read_table_bytes
from mds.executor.readers import FileReader, open_reader
from mds.executor.tokenizer import load_tokenizer

__all__ = ["ESTIMATED", "SourceCatalog", "Tokenize"]

Tokenize = Callable[[str], Sequence[int]]
ESTIMATED = ("error", "fit")
_JSONL = ("jsonl", "jsonl.zst")
_WIDTHS = {"n_tokens": np.uint32, "file_row": np.int64, "offset": np.int64, "length": np.uint32}


@dataclass
class _Source:
    """One index source: manifest facts plus the location columns, loaded on first use."""

    sid: int
    name: str
    entry: dict[str, Any]
    base: int
    rows: int
    paths: list[tuple[Path, Path | None]]
    first_rows: np.ndarray
    tokenize: Tokenize | None = None
    columns: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def fmt(self) -> str:
        return str(self.entry["format"])

    @property
    def payload(self) -> dict[str, Any]:
        return self.entry.get("payload") or {}

    @property
    def exact(self) -> bool:
        return bool((self.entry.get("length") or {}).get("exact", False))


class SourceCatalog:
    """Fetches samples as token-id arrays, checked against the lengths the plan used."""

    def __init__(
        self,
        manifest: IndexManifest,
        footer: dict[str, Any],
        *,
        tokenize: Tokenize | Mapping[str, Tokenize] | None = None,
        estimated: str = "error",
        cache_bytes: int = 256 << 20,
        max_open_files: int = 64,
    ):
        if not isinstance(max_open_files, int) or max_open_files < 1:
            raise ConfigError(f"max_open_files={max_open_files!r} must be an integer >= 1")
        if not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise ConfigError(f"cache_bytes={cache_bytes!r} must be an integer >= 0")
        if estimated not in ESTIMATED:
            raise ConfigError(f"estimated={estimated!r} must be one of {', '.join(ESTIMATED)}")
        self.manifest, self.estimated = manifest, estimated
        self.cache_bytes, self.max_open_files = cache_bytes, max_open_files
        root = manifest.data.get("root")
        if not (isinstance(root, str) and Path(root).is_absolute()):
            raise IndexFormatError(f"{manifest.path}: manifest `root` is not an absolute path")
        self.root = Path(root)
        train = footer["config"]["train"]
        self.truncate_to = (
            int(train["max_tokens_per_micro_batch"])
            if train.get("overlong") == "truncate"
            else None
        )
        planned = {s["name"]: int(s.get("samples", 0)) for s in footer.get("sources", [])}
        self.sources = [self._source(i, s) for i, s in enumerate(footer["index"]["sources"])]
        self.bases = np.array([s.base for s in self.sources], dtype=np.int64)
        self._rows = np.array([s.rows for s in self.sources], dtype=np.int64)
        self.used = [s for s in self.sources if planned.get(s.name, 0) > 0]
        self._bind_tokenizers(tokenize)
        self.checked: set[tuple[int, int]] = set()  # (source id, file) already checked
        self.reset()

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]

    def reset(self) -> None:
        """Forget open files and cached blocks (a new process must not share descriptors)."""
        self._blocks = LRU(max_bytes=self.cache_bytes)
        self._files = LRU(max_items=self.max_open_files, on_evict=lambda _k, r: r.close())

    def close(self) -> None:
        self._files.clear()
        self._blocks.clear()

    # --- set-up ---------------------------------------------------------------------------

    def _source(self, sid: int, planned: dict[str, Any]) -> _Source:
        name = planned["name"]
        entry = self.manifest.source(name)  # same tables: the caller compared fingerprints
        paths = []
        for i, item in enumerate(entry["files"]):
            try:
                paths.append(entry_paths(self.root, item, f"{name} files[{i}]"))
            except ValueError as exc:
                raise IndexFormatError(f"{self.manifest.path}: {exc}") from None
        first = np.array([int(f["first_row"]) for f in entry["files"]], dtype=np.int64)
        return _Source(sid, name, entry, int(planned["base"]), int(planned["rows"]), paths, first)

    def _bind_tokenizers(self, tokenize: Tokenize | Mapping[str, Tokenize] | None) -> None:
        """Give every used text source a tokenize function, or say which one lacks it."""
        text = [s for s in self.used if s.payload.get("kind") == "text"]
        if isinstance(tokenize, Mapping):
            unknown = sorted(set(tokenize) - {s.name for s in text})
            if unknown:
                raise ConfigError(
                    f"tokenize has functions for {', '.join(unknown)}, which the plan does not "
                    f"draw text from; text sources: {', '.join(s.name for s in text) or 'none'}"
                )
        for s in self.used:
            kind = s.payload.get("kind")
            if kind not in ("text", "token_ids"):
                raise ConfigError(
                    f"source {s.name!r} has no payload column in the index (it was indexed "
                    "for lengths only); re-index it with `tokens` or `text`"
                )
            if not s.exact and self.estimated == "error":
                rule = (s.entry.get("length") or {}).get("rule", "an estimate")
                raise ConfigError(
                    f"source {s.name!r}: the plan used estimated lengths ({rule}), so its packing "
                    "cannot be replayed exactly; re-index it with a tokenizer or a count column, "
                    'or pass estimated="fit" to cut each sample to its planned length'
                )
            if kind == "text":
                recorded = (s.entry.get("length") or {}).get("kind") == "tokenizer"
                if isinstance(tokenize, Mapping):
                    fn = tokenize.get(s.name)
                else:  # one function: for the sources the index did not count with a tokenizer
                    fn = None if recorded else tokenize
                s.tokenize = fn or self._index_tokenizer(s)

    def _index_tokenizer(self, s: _Source) -> Tokenize:
        """The tokenizer.json the index counted with, checked to be the same file."""
        length = s.entry.get("length") or {}
        if length.get("kind") != "tokenizer":
            raise ConfigError(
                f"source {s.name!r} stores text ({s.payload.get('column')!r}); pass tokenize= "
                f"(a function str -> token ids, or a dict {{{s.name!r}: fn}})"
            )
        path = Path(length["tokenizer"])
        path = path if path.is_absolute() else self.root / path
        try:
            spec = json.loads(s.entry.get("spec_key", "{}"))
        except ValueError:
            spec = None
        recorded = spec.get("tokenizer_fingerprint") if isinstance(spec, dict) else None
        if recorded and fingerprint(path, "full") != recorded:
            raise DataChangedError(
                f"{path}: tokenizer of source {s.name!r} changed since indexing; re-index, or "
                "pass tokenize= explicitly"
            )
        tok = load_tokenizer(str(path))
        return lambda text: tok.encode(text, add_special_tokens=False).ids

    def check_samples(self, gids: np.ndarray, full: bool) -> None:
        """Stat (or, with `full`, fingerprint) the files holding `gids` that this process has
        not checked yet: start-up I/O follows the slice read, not the corpus's files."""
        sid, rows = self.locate(gids)
        for s_id in np.unique(sid):
            s = self.sources[int(s_id)]
            files = np.unique(np.searchsorted(s.first_rows, rows[sid == s_id], side="right") - 1)
            for i in files.tolist():
                if (s.sid, i) in self.checked:
                    continue
                item = s.entry["files"][i]
                problem = file_problem(self.root, item, full, f"{s.name} files[{i}]")
                if problem is not None:
                    raise DataChangedError(
                        f"source {s.name!r}: {problem}; the data changed since it was indexed "
                        "(re-index and re-plan, or restore the file)"
                    )
                self.checked.add((s.sid, i))

    def _table(self, s: _Source) -> Path:
        """The source's index table, which must lie inside the index directory (after links)."""
        try:
            return safe_path(self.manifest.path, s.entry["table"], f"source {s.name!r}")
        except ValueError:
            raise IndexFormatError(
                f"{self.manifest.path}: the table of source {s.name!r} "
                f"({s.entry['table']!r}) leaves the index directory; refused, not read"
            ) from None

    # --- fetching -------------------------------------------------------------------------

    def locate(self, gids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source id, row) of global sample ids."""
        sid = np.searchsorted(self.bases, gids, side="right") - 1
        rows = gids.astype(np.int64) - self.bases[sid]
        if len(gids) and (sid.min() < 0 or np.any(rows >= self._rows[sid])):
            raise DataChangedError("the plan names a sample beyond its index's rows")
        return sid, rows

    def preload(self) -> None:
        """Load every used source's location columns now, e.g. before forking workers so
        they share the pages instead of each reading the tables."""
        for s in self.used:
            self._columns(s)

    def fetch(self, sid: int, rows: np.ndarray) -> list[np.ndarray]:
        """Token ids (int64) of `rows` of source `sid`, in order, checked and truncated."""
        s = self.sources[sid]
        cols = self._columns(s)
        file_ids = np.searchsorted(s.first_rows, rows, side="right") - 1
        out: list[np.ndarray | None] = [None] * len(rows)
        for f in np.unique(file_ids):
            pick = np.flatnonzero(file_ids == f)
            picked = rows[pick]
            if s.fmt in _JSONL:
                file_rows = cols["file_row"][picked]
                offsets, lengths = cols["offset"][picked], cols["length"][picked]
            else:
                file_rows, offsets, lengths = picked - s.first_rows[f], None, None
            payloads = self._reader(s, int(f)).fetch(file_rows, offsets, lengths)
            for k, (j, payload) in enumerate(zip(pick, payloads, strict=True)):
                out[j] = self._tokens(s, int(f), int(rows[j]), int(file_rows[k]), payload)
        return out  # type: ignore[return-value]

    def _columns(self, s: _Source) -> dict[str, np.ndarray]:
        """The source's location columns, read once from its index table."""
        if not s.columns:
            import pyarrow as pa
            import pyarrow.parquet as pq

            names = ["n_tokens", *(("file_row", "offset", "length") if s.fmt in _JSONL else ())]
            table_path = self._table(s)
            try:
                data = read_table_bytes(table_path, s.entry["table_checksum"])
                table = pq.read_table(pa.BufferReader(data), columns=names)
            except (OSError, ValueError) as exc:
                raise IndexFormatError(f"{table_path}: cannot read index table ({exc})") from None
            if table.num_rows != s.rows:
                raise DataChangedError(
                    f"{table_path}: {table.num_rows} rows, the plan was made from {s.rows}"
                )
            # The narrowest types that hold them: this is the executor's per-row memory.
            s.columns = {n: table[n].to_numpy().astype(_WIDTHS[n], copy=False) for n in names}
        return s.columns

    def _reader(self, s: _Source, file_id: int) -> FileReader:
        key = (s.sid, file_id)
        reader = self._files.get(key)
        if reader is None:
            path, companion = s.paths[file_id]
            reader = open_reader(
                s.fmt,
                path,
                payload_kind=s.payload["kind"],
                column=str(s.payload.get("column") or ""),
                companion=companion,
                blocks=self._blocks,
                display=s.entry["files"][file_id]["path"],
            )
            self._files.put(key, reader)
        return reader

    def _tokens(self, s: _Source, file_id: int, row: int, file_row: int, payload) -> np.ndarray:
        """Token ids of one sample; its length must be the one the plan was made with."""
        if isinstance(payload, str):
            assert s.tokenize is not None
            ids = np.asarray(s.tokenize(payload), dtype=np.int64)
        else:
            ids = np.asarray(payload).astype(np.int64, copy=False)
        planned = int(s.columns["n_tokens"][row])
        if len(ids) != planned:
            if s.exact:
                what = "tokenize returned" if isinstance(payload, str) else "the file holds"
                # JSONL lines are 1-based in messages, as the indexer reports them
                where = f"line {file_row + 1}" if s.fmt in _JSONL else f"row {file_row}"
                raise SourceDataError(
                    f"source {s.name!r} row {row} ({s.entry['files'][file_id]['path']} {where}): "
                    f"{what} {len(ids)} tokens, the index says {planned}; the plan "
                    "was made with other lengths (different tokenizer, or changed data)"
                )
            ids = ids[:planned]  # estimated="fit": never longer than planned
        if self.truncate_to is not None and len(ids) > self.truncate_to:
            ids = ids[: self.truncate_to]
        return ids
