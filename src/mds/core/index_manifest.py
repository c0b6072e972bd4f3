"""The index manifest (`manifest.json`): format version, sources, files and fingerprints.

JSON and stdlib only, so the executor can check an index without the planner.

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
    "IndexManifest",
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
VERSION = 1
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
    got = "blake2b:" + hashlib.blake2b(data, digest_size=16).hexdigest()
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
    for i, entry in enumerate(sources):
        for key, kind in (
            ("name", str),
            ("table", str),
            ("table_checksum", str),
            ("files", list),
            ("rows", int),
        ):
            if not isinstance(entry.get(key), kind):
                raise IndexFormatError(
                    f"{where}: sources[{i}].{key} is missing or not a {kind.__name__}"
                )
        table = Path(entry["table"])
        if table.is_absolute() or ".." in table.parts:
            raise IndexFormatError(
                f"{where}: sources[{i}].table {entry['table']!r} leaves the index directory"
            )
        problem = _source_problem(entry)
        if problem is not None:
            raise IndexFormatError(f"{where}: sources[{i}].{problem}")
        for j, item in enumerate(entry["files"]):
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
