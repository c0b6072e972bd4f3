"""The index manifest (`manifest.json`): format version, sources, files and fingerprints.

JSON and stdlib, and PyArrow for a source's file list (a Parquet table beside its source
table since VERSION 2), so the executor can check an index without the planner.

The manifest is the index's commit point: tables it does not name are not part of the index.
The layout is specified in docs/index-format.md.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mds.core.datacheck import escapes
from mds.errors import DataChangedError, IndexFormatError, PlanError

__all__ = [
    "FORMAT",
    "HISTORY",
    "MANIFEST",
    "VERSION",
    "FILE_COLUMNS",
    "IndexManifest",
    "SourceEntry",
    "bytes_checksum",
    "file_dicts",
    "file_list_bytes",
    "file_list_table",
    "identity_fingerprint",
    "index_fingerprint",
    "history_name",
    "index_sources",
    "missing_index",
    "plan_manifest",
    "read_manifest",
    "read_manifest_of",
    "read_table_bytes",
    "table_checksum",
    "table_damage",
]

FORMAT = "mds-index"
VERSION = 2
MANIFEST = "manifest.json"
# Manifests of earlier builds of the index, kept so plans made from them still verify:
# history/<32 hex of the index fingerprint>.json (docs/index-format.md).
HISTORY = "history"
# The source formats and payload kinds an index may name (the executor's readers read all).
FORMATS = ("parquet", "jsonl", "jsonl.zst", "arrow", "megatron", "webdataset")
PAYLOAD_KINDS = ("token_ids", "text", "image_text")
IMAGE_LAYOUTS = {
    "webdataset": "webdataset",
    "parquet": "parquet",
    "jsonl": "jsonl",
    "jsonl.zst": "jsonl",
}


# A source's file list (VERSION 2: a Parquet table named by the entry's `files_table`, with
# its checksum in `files_checksum`; VERSION 1: the entry's `files`, one JSON object per
# file). Columns in this order; the optional ones only in a source whose files have them
# (`index_path`: Megatron's .idx, `dropped_bad_images`: image-text sources).
FILE_COLUMNS = ("id", "path", "size", "mtime_ns", "fingerprint", "first_row", "rows", "tokens")
OPTIONAL_FILE_COLUMNS = ("index_path", "dropped_bad_images")
_STRINGS = ("path", "fingerprint", "index_path")
# The keys of a file's dict, in the order the files of a VERSION 1 manifest had them.
_DICT_ORDER = ("id", "path", "index_path", "size", "mtime_ns", "fingerprint", "first_row",
               "rows", "tokens", "dropped_bad_images")  # fmt: skip


def file_list_table(columns: dict[str, Any]) -> Any:
    """The file-list table (a pyarrow.Table) of `columns` (name -> values: lists or arrays),
    its columns in the order and types of the format; an optional column is left out when
    it is missing or None."""
    import pyarrow as pa

    arrays, names = [], []
    for name in (*FILE_COLUMNS, *OPTIONAL_FILE_COLUMNS):
        values = columns.get(name)
        if values is None:
            if name in OPTIONAL_FILE_COLUMNS:
                continue
            raise ValueError(f"file list without column {name!r}")
        kind = pa.string() if name in _STRINGS else pa.int64()
        arrays.append(values.cast(kind) if isinstance(values, pa.Array) else pa.array(values, kind))
        names.append(name)
    return pa.table(arrays, names=names)


def file_list_bytes(table: Any) -> bytes:
    """The Parquet bytes of a file-list table: fixed writer options and no timestamps, so the
    same files give the same bytes (and so the same content-addressed name)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(
        table,
        sink,
        compression="zstd",
        compression_level=3,
        use_dictionary=False,
        write_statistics=False,
        row_group_size=1 << 20,
        data_page_version="1.0",
        store_schema=True,
    )
    return sink.getvalue().to_pybytes()


def file_dicts(table: Any) -> list[dict[str, Any]]:
    """One dict per file of a file-list table (as a VERSION 1 manifest held them): only for
    a consumer that wants them; a re-index works on the columns."""
    names = [n for n in _DICT_ORDER if n in table.column_names]
    cols = [table.column(n).to_pylist() for n in names]
    optional = [i for i, n in enumerate(names) if n in OPTIONAL_FILE_COLUMNS]
    out = []
    for values in zip(*cols, strict=True):
        item = dict(zip(names, values, strict=True))
        for i in optional:
            if values[i] is None:
                del item[names[i]]
        out.append(item)
    return out


class SourceEntry(dict):
    """A manifest's source entry. A VERSION 2 entry's `files` (one dict per file) are read
    from its file-list table when first asked for; `file_table()` gives the columns."""

    def __init__(self, data: dict[str, Any], index: Path, where: Path):
        super().__init__(data)
        self.index, self.where, self._table = index, where, None

    def __missing__(self, key: str) -> Any:
        if key != "files" or "files_table" not in self:
            raise KeyError(key)
        files = self["files"] = file_dicts(self.file_table())
        return files

    def file_table(self) -> Any:
        """The source's file list as a pyarrow.Table (checked against `files_checksum`, its
        rows against the source's; a VERSION 1 entry's made from its `files`)."""
        if self._table is None:
            if "files_table" in self:
                self._table = read_file_list(self, self.index, self.where)
            else:
                self._table = _v1_table(self["files"])
        return self._table


def _v1_table(files: list[dict[str, Any]]) -> Any:
    columns: dict[str, Any] = {
        n: [f[n] for f in files] for n in FILE_COLUMNS if n not in ("size", "mtime_ns")
    }
    # entries this mds would not have written may lack a stat: they are never reused
    columns["size"] = [f.get("size", -1) for f in files]
    columns["mtime_ns"] = [f.get("mtime_ns", -1) for f in files]
    for name in OPTIONAL_FILE_COLUMNS:
        if any(name in f for f in files):
            columns[name] = [f.get(name) for f in files]
    return file_list_table(columns)


def read_file_list(entry: dict[str, Any], index: Path, where: Path) -> Any:
    """A VERSION 2 source's file-list table, its bytes checked against `files_checksum` and
    its rows against what the executor relies on (as _source_problem checks a VERSION 1
    entry's `files`); IndexFormatError naming the file or the manifest otherwise."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = index / entry["files_table"]
    if not path.is_file():
        raise IndexFormatError(f"{path}: the file list of source {entry['name']!r} is missing")
    data = read_table_bytes(path, entry["files_checksum"])
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (OSError, pa.ArrowException) as exc:  # intact bytes, yet not a table
        raise IndexFormatError(f"{path}: cannot read the file list ({exc})") from None
    name = entry["name"]
    try:
        table = file_list_table({n: table.column(n).combine_chunks() if n in table.column_names
                                 else None for n in (*FILE_COLUMNS, *OPTIONAL_FILE_COLUMNS)})  # fmt: skip
    except (ValueError, pa.ArrowException) as exc:
        raise IndexFormatError(f"{path}: not a file list ({exc})") from None
    for column in FILE_COLUMNS:
        nulls = table.column(column).null_count
        if nulls:
            raise IndexFormatError(f"{path}: {nulls} file(s) without a {column}")
    rows = table.column("rows").to_numpy()
    first = table.column("first_row").to_numpy()
    starts = np.zeros(len(rows), dtype=np.int64)
    np.cumsum(rows[:-1], out=starts[1:])
    bad = np.flatnonzero((rows < 0) | (first != starts))
    if len(bad):
        j = int(bad[0])
        raise IndexFormatError(
            f"{where}: {name} files[{j}] rows {int(rows[j])} from first_row {int(first[j])} "
            f"do not follow the previous file (first_row {int(starts[j])})"
        )
    if int(rows.sum()) != entry["rows"]:
        raise IndexFormatError(
            f"{where}: {name} files hold {int(rows.sum())} rows, the source {entry['rows']}"
        )
    if entry.get("format") == "megatron":
        index_paths = table.column("index_path") if "index_path" in table.column_names else None
        if index_paths is None or index_paths.null_count:
            raise IndexFormatError(f"{where}: {name} files: index_path is missing")
    for key in ("path", "index_path"):
        if key not in table.column_names:
            continue
        values = table.column(key)
        odd = pc.or_(
            pc.or_(pc.match_substring(values, ".."), pc.match_substring(values, ":")),
            pc.match_substring_regex(values, r"^[/\\]"),
        )
        for j in np.flatnonzero(odd.to_numpy(zero_copy_only=False) == True).tolist():  # noqa: E712
            value = values[j].as_py()
            if value is not None and escapes(value):
                raise IndexFormatError(
                    f"{where}: {name} files[{j}]: path {value!r} escapes the index root; "
                    "refused, not read"
                )
    return table


@dataclass(frozen=True)
class IndexManifest:
    """A parsed, version-checked manifest plus the directory it came from."""

    path: Path
    data: dict[str, Any]

    @property
    def sources(self) -> list[dict[str, Any]]:
        return self.data["sources"]

    @property
    def fingerprint(self) -> str:
        return self.data["fingerprint"]

    def source(self, name: str) -> dict[str, Any]:
        for entry in self.sources:
            if entry["name"] == name:
                return entry
        known = ", ".join(s["name"] for s in self.sources)
        raise IndexFormatError(f"{self.path}: no source named {name!r}; the index has {known}")


def bytes_checksum(data: bytes) -> str:
    """ "blake2b:<hex>" of a table's bytes held in memory: table_checksum's value for them."""
    return "blake2b:" + hashlib.blake2b(data, digest_size=16).hexdigest()


def table_checksum(path: Path) -> str:
    """ "blake2b:<hex>" of an index table file, read in pieces (the manifest's `table_checksum`)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while piece := f.read(8 << 20):
            h.update(piece)
    return "blake2b:" + h.hexdigest()


def table_damage(path: Path | str, got: str, expected: str) -> IndexFormatError:
    """The one-line error for an index table whose bytes differ from its manifest entry."""
    return IndexFormatError(
        f"{path}: checksum {got} differs from the manifest's {expected}; the index is damaged: "
        "re-run `mds index` to rebuild the table from its sources, or delete the index"
    )


def read_table_bytes(path: Path, expected: str) -> bytes:
    """An index table's bytes, checked against the manifest's `table_checksum` in the same read
    that loads them (so the check costs one hash pass, not a second read of the file)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise IndexFormatError(f"{path}: cannot read index table ({exc.strerror or exc})") from None
    got = bytes_checksum(data)
    if got != expected:
        raise table_damage(path, got, expected)
    return data


def index_fingerprint(sources: list[dict[str, Any]]) -> str:
    """Identity of an index's content: its tables' checksums and its files' fingerprints."""
    return identity_fingerprint(
        [
            (s["name"], s["table_checksum"], [(f["path"], f["fingerprint"]) for f in s["files"]])
            for s in sources
        ]
    )


def identity_fingerprint(ident: list[tuple[str, str, list[tuple[str, str]]]]) -> str:
    """index_fingerprint of (name, table checksum, [(path, fingerprint) of each file]) per
    source: what a build has at hand, without an entry per file."""
    blob = json.dumps(ident, separators=(",", ":"), sort_keys=True).encode()
    return "blake2b:" + hashlib.blake2b(blob, digest_size=16).hexdigest()


def index_sources(manifest: IndexManifest) -> list[dict[str, Any]]:
    """The footer's record of the index: each source's name, global id base, rows, table."""
    out, base = [], 0
    for s in manifest.sources:
        out.append(
            {
                "name": s["name"],
                "base": base,
                "rows": s["rows"],
                "table_checksum": s["table_checksum"],
            }
        )
        base += s["rows"]
    return out


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _source_problem(entry: dict[str, Any]) -> str | None:
    """What the executor relies on in a source entry, beyond the keys `_check` requires:
    a known format, a payload it can read, file entries whose rows tile the table."""
    if not _count(entry["rows"]):
        return f"rows {entry['rows']!r} is not an integer >= 0"
    fmt = entry.get("format")
    if fmt not in FORMATS:
        return f"format {fmt!r} is not one of {', '.join(FORMATS)}"
    payload = entry.get("payload")
    if isinstance(payload, dict) and payload.get("kind") == "image_text":
        if not (
            payload.get("layout") == IMAGE_LAYOUTS.get(fmt)
            and isinstance(payload.get("text"), str)
            and isinstance(payload.get("images"), str)
        ):
            return f"payload {payload!r} is not a {fmt} image_text payload (layout, text, images)"
    elif payload is not None:
        if not (
            isinstance(payload, dict)
            and payload.get("kind") in PAYLOAD_KINDS
            and isinstance(payload.get("column"), str)
            and (payload["column"] or fmt == "megatron")
            and (payload["kind"] == "token_ids" or fmt != "megatron")
        ):
            return f"payload {payload!r} is not a {fmt} payload (kind and column)"
    length = entry.get("length")
    if not (length is None or isinstance(length, dict)):
        return f"length {length!r} is not an object"
    if (
        length
        and length.get("kind") == "tokenizer"
        and not isinstance(length.get("tokenizer"), str)
    ):
        return "length.tokenizer is missing or not a string"
    if not isinstance(entry.get("spec_key", ""), str):
        return "spec_key is not a string"
    if "files_table" in entry:  # VERSION 2: its rows are checked when the table is read
        return None
    first = 0
    megatron = fmt == "megatron"
    for j, item in enumerate(entry["files"]):
        if type(item) is not dict:
            if not isinstance(item, dict):
                return f"files[{j}] is not an object"
        if type(item.get("path")) is not str:
            if not isinstance(item.get("path"), str):
                return f"files[{j}].path is missing or not a string"
        if (megatron or "index_path" in item) and not isinstance(item.get("index_path"), str):
            return f"files[{j}].index_path is missing or not a string"
        # Samples are located by these: a row's file is the last with first_row <= row.
        rows = item.get("rows")
        if not (type(rows) is int and rows >= 0 and item.get("first_row") == first):
            if not (_count(rows) and item.get("first_row") == first):
                return (
                    f"files[{j}] rows {rows!r} from first_row {item.get('first_row')!r} "
                    f"do not follow the previous file (first_row {first})"
                )
        first += rows
    if first != entry["rows"]:
        return f"files hold {first} rows, the source {entry['rows']}"
    return None


def _check(data: Any, where: Path) -> None:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise IndexFormatError(f"{where}: not an mds index manifest")
    version = data.get("version")
    if not isinstance(version, int):
        raise IndexFormatError(f"{where}: manifest has no integer `version`")
    if version > VERSION:
        raise IndexFormatError(
            f"{where}: index format version {version} is newer than this mds supports "
            f"({VERSION}); upgrade mds"
        )
    if version < 1:
        raise IndexFormatError(f"{where}: invalid index format version {version}")
    sources = data.get("sources")
    if not isinstance(sources, list) or not all(isinstance(s, dict) for s in sources):
        raise IndexFormatError(f"{where}: manifest `sources` must be a list of objects")
    # VERSION 1 holds each source's files in the manifest; VERSION 2 names a table of them.
    files = (("files", list),) if version == 1 else (("files_table", str), ("files_checksum", str))
    for i, entry in enumerate(sources):
        for key, kind in (
            ("name", str),
            ("table", str),
            ("table_checksum", str),
            *files,
            ("rows", int),
        ):
            if not isinstance(entry.get(key), kind):
                raise IndexFormatError(
                    f"{where}: sources[{i}].{key} is missing or not a {kind.__name__}"
                )
        if version > 1:
            entry.pop("files", None)  # never from the manifest: from the table
        for key in ("table", "files_table"):
            table = Path(entry.get(key, ""))
            if table.is_absolute() or ".." in table.parts:
                raise IndexFormatError(
                    f"{where}: sources[{i}].{key} {entry[key]!r} leaves the index directory"
                )
        problem = _source_problem(entry)
        if problem is not None:
            raise IndexFormatError(f"{where}: sources[{i}].{problem}")
        for j, item in enumerate(entry.get("files", ())):
            for key in ("path", "index_path"):
                value = item.get(key)
                # escapes needs a ".." or an absolute path (a separator or drive) to say yes
                if (
                    type(value) is str
                    and (".." in value or value[:1] in "/\\" or ":" in value)
                    and escapes(value)
                ):
                    # Every command refuses it, not only the ones that open files.
                    raise IndexFormatError(
                        f"{where}: {entry['name']} files[{j}]: path {item[key]!r} escapes the "
                        "index root; refused, not read"
                    )
    if not isinstance(data.get("fingerprint"), str):
        raise IndexFormatError(f"{where}: manifest has no `fingerprint`")


def history_name(fingerprint: str) -> str:
    """Where, relative to the index, the manifest of the index `fingerprint` is kept once a
    re-index replaced it (an unusable fingerprint names no file)."""
    digest = fingerprint.removeprefix("blake2b:")
    if len(digest) != 32 or not all(c in "0123456789abcdef" for c in digest):
        return ""
    return f"{HISTORY}/{digest}.json"


def read_manifest_of(directory: str | Path, fingerprint: Any) -> IndexManifest:
    """The manifest of the index `fingerprint` in `directory`: the one an earlier build's
    re-index kept under history/ (its tables are kept beside the current ones), else
    manifest.json, whatever it holds. One manifest is parsed either way."""
    name = history_name(fingerprint) if isinstance(fingerprint, str) else ""
    kept = Path(directory) / name
    if name and kept.is_file():
        older = _load(kept, Path(directory))
        if older.fingerprint == fingerprint:
            return older
    return read_manifest(directory)


def read_manifest(directory: str | Path) -> IndexManifest:
    """Load and validate `directory/manifest.json`."""
    directory = Path(directory)
    return _load(directory / MANIFEST, directory)


def _load(where: Path, directory: Path) -> IndexManifest:
    """Load and validate the manifest file `where` of the index in `directory`."""
    try:
        data = json.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise IndexFormatError(
            f"{directory}: not an mds index (no {MANIFEST}); run `mds index`"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # deep nesting
        raise IndexFormatError(f"{where}: unreadable manifest ({exc})") from None
    _check(data, where)
    data["sources"] = [SourceEntry(s, directory, where) for s in data["sources"]]
    return IndexManifest(directory, data)


def _recorded_index(plan: str | Path, recorded: str) -> Path | str:
    """Where the index a plan records lies: relative to the plan's directory (its prefix,
    for a plan in object storage), or the URL it records."""
    from mds.core import storage

    if storage.is_url(recorded):
        return recorded.rstrip("/")
    if storage.is_url(plan):
        return storage.resolve_under(storage.parent_url(str(plan)), recorded)
    return Path(plan).parent / recorded


def plan_manifest(
    plan: str | Path,
    footer: dict[str, Any],
    index: str | Path | None = None,
    option: str = "--index",
    copy: Callable[[str, Any], Path] | None = None,
) -> IndexManifest:
    """The index a plan was made from (`index`, else the path its footer names), checked
    against the fingerprint the plan recorded; `option` is how the caller names `index`.
    An index in object storage is read through `copy` ((URL, fingerprint) -> a local copy
    of it, with the manifest a re-index kept for that fingerprint; the planner's
    download_index), and refused without it."""
    from mds.core import storage

    try:
        recorded = footer["index"]
        index_dir = storage.as_place(index) if index else _recorded_index(plan, recorded["path"])
    except (KeyError, TypeError):
        raise PlanError(f"{plan}: the footer does not name its index") from None
    if storage.is_url(index_dir) and copy is not None:
        if not index and not storage.exists(f"{index_dir}/{MANIFEST}"):
            raise IndexFormatError(missing_index(plan, index_dir, recorded["path"], option))
        fingerprint = recorded.get("fingerprint")
        manifest = read_manifest_of(copy(index_dir, fingerprint), fingerprint)
        if manifest.fingerprint != recorded.get("fingerprint"):
            raise DataChangedError(
                f"{index_dir}: index fingerprint {manifest.fingerprint} differs from the one "
                f"the plan was made from ({recorded.get('fingerprint')}); pass the right "
                f"{option} or re-plan"
            )
        return manifest
    if storage.is_url(index_dir):
        raise IndexFormatError(
            f"{plan}: its index is in object storage ({index_dir}); this command reads a local "
            f"index: copy the prefix to a directory (aws s3 sync, gcloud storage rsync) and pass "
            f"{option} with it"
        )
    if not index and not (index_dir / MANIFEST).is_file():
        raise IndexFormatError(missing_index(plan, index_dir, recorded["path"], option))
    manifest = read_manifest_of(index_dir, recorded.get("fingerprint"))
    if manifest.fingerprint != recorded.get("fingerprint"):
        raise DataChangedError(
            f"{index_dir}: index fingerprint {manifest.fingerprint} differs from the one the plan "
            f"was made from ({recorded.get('fingerprint')}); pass the right {option} or re-plan"
        )
    return manifest


def missing_index(plan: Any, where: Any, recorded: str, option: str = "--index") -> str:
    """The line for a plan whose index is not where its footer says."""
    from mds.core import storage

    if storage.is_url(recorded) or os.path.isabs(recorded):
        how = f"recorded as {recorded!r}"
    else:
        where_from = "URL" if storage.is_url(plan) else "directory"
        how = f"recorded relative to the plan's {where_from} as {recorded!r}"
    return (
        f"{plan}: its index was expected at {where} ({how}); if the plan or the index moved, "
        f"pass {option} with the index directory or prefix"
    )


def facts_problem(facts: Any) -> str | None:
    """Why a footer `fetch.sources` entry cannot be read with, or None (the executor refuses
    the plan at start-up; `mds verify` runs the same check)."""
    if not isinstance(facts, dict):
        return "no reading facts"
    if facts.get("format") not in FORMATS:
        return f"unknown format {facts.get('format')!r}"
    payload, length = facts.get("payload"), facts.get("length")
    if payload is not None and not (
        isinstance(payload, dict) and isinstance(payload.get("column", ""), str)
    ):
        return "bad payload"
    if not isinstance(length, dict):
        return "bad length rule"
    return None


def payload_problem(name: str, facts: dict[str, Any]) -> str | None:
    """Why the executor cannot replay source `name` whatever it is given (no payload column
    in the index), or None; `mds verify` runs the same check."""
    payload = facts.get("payload") or {}
    if payload.get("kind") not in PAYLOAD_KINDS:
        return (
            f"source {name!r} has no payload column in the index (it was indexed "
            "for lengths only); re-index it with `tokens` or `text`"
        )
    return None
