"""The index manifest, as the planner reads it: the executor's parser plus Polars scans."""

from __future__ import annotations

import hashlib
import io
import json
import secrets
from collections.abc import Callable, Iterable, Iterator
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

import polars as pl

from mds.core.index_manifest import (
    FORMAT,
    MANIFEST,
    VERSION,
    IndexManifest,
    history_name,
    index_fingerprint,
    read_manifest,
    read_manifest_of,
    read_table_bytes,
    table_checksum,
    table_damage,
)
from mds.errors import IndexFormatError
from mds.planner.runtime.atomic import atomic_path

__all__ = [
    "FORMAT",
    "TABLES",
    "download_index",
    "entry_template",
    "MANIFEST",
    "VERSION",
    "IndexManifest",
    "index_fingerprint",
    "manifest_chunks",
    "read_manifest",
    "read_table",
    "source_frame",
    "source_table",
    "table_checksum",
    "table_damage",
    "table_intact",
    "write_manifest",
]

TABLES = "sources"  # the folder of an index's tables


def source_frame(manifest: IndexManifest, name: str) -> pl.LazyFrame:
    """One source's index table, checked against the manifest's checksum and parsed from the
    same bytes (a damaged table is refused before any of its values is used)."""
    return source_table(manifest, name).lazy()


def source_table(
    manifest: IndexManifest,
    name: str,
    columns: Callable[[pl.Schema], list[str] | None] | None = None,
) -> pl.DataFrame:
    """As `source_frame`, eager; `columns` picks from the table's schema the columns to
    decode (None: all), so a caller that needs two columns does not pay for the rest."""
    entry = manifest.source(name)
    table = manifest.path / entry["table"]
    # read_manifest refused `..` and absolute names; a symlink may still lead out.
    try:
        inside = table.resolve().is_relative_to(manifest.path.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        inside = False
    if not inside:
        raise IndexFormatError(
            f"{manifest.path}: the table of source {name!r} ({entry['table']!r}) leaves the "
            "index directory; refused, not read"
        )
    if not table.is_file():
        raise IndexFormatError(f"{table}: index table of source {name!r} is missing")
    return read_table(table, entry["table_checksum"], columns)


def read_table(
    table: Path,
    checksum: str,
    columns: Callable[[pl.Schema], list[str] | None] | None = None,
) -> pl.DataFrame:
    """An index table verified against `checksum`, parsed from the bytes that were checked;
    `columns` as in `source_table`."""
    data = read_table_bytes(table, checksum)
    try:
        names = None if columns is None else columns(pl.read_parquet_schema(io.BytesIO(data)))
        return pl.read_parquet(io.BytesIO(data), columns=names)
    except (OSError, pl.exceptions.PolarsError) as exc:  # intact bytes, yet not a table
        raise IndexFormatError(f"{table}: cannot read index table ({exc})") from None


# The manifest's layout: json.dumps(indent=2, sort_keys=True). Python's JSON encoder is pure
# Python once it indents, ~100 us per file entry; file entries (flat objects of strings and
# integers) are therefore written here with the same layout, one string at a time.
_FILE_PAD = " " * 8  # manifest -> "sources" -> source -> "files" -> entry


def _scalar(value: Any) -> str:
    if type(value) is int:  # most values of a file entry
        return int.__repr__(value)
    if type(value) is str:
        return encode_basestring_ascii(value)
    return json.dumps(value)


# Per order of keys an entry was made with (a handful per manifest): its keys sorted, and
# a %-template of the entry's indented text with one %s per value.
_TEMPLATES: dict[tuple[str, ...], tuple[tuple[str, ...], str]] = {}


def entry_template(order: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """(the keys sorted, the %-template of a file entry's text with one %s per value, in
    that order) for an entry of these keys: formatted with each value's JSON text, it is
    what manifest_chunks writes for the entry (an int's text is its repr, a string's
    encode_basestring_ascii)."""
    found = _TEMPLATES.get(order)
    if found is not None:
        return found
    keys = tuple(sorted(order))
    inner = _FILE_PAD + "  "
    fields = [f"{inner}{encode_basestring_ascii(k).replace('%', '%%')}: %s" for k in keys]
    found = _TEMPLATES[order] = keys, f"{_FILE_PAD}{{\n" + ",\n".join(fields) + f"\n{_FILE_PAD}}}"
    return found


def _file_entry(entry: dict[str, Any]) -> str:
    found = _TEMPLATES.get(tuple(entry))
    keys, text = found if found is not None else entry_template(tuple(entry))
    return text % tuple(
        [
            int.__repr__(v)
            if type(v) is int
            else encode_basestring_ascii(v)
            if type(v) is str
            else json.dumps(v)
            for v in map(entry.__getitem__, keys)
        ]
    )


def manifest_chunks(
    manifest: dict[str, Any], files: list[Iterable[dict[str, Any]]]
) -> Iterator[str]:
    """The text of json.dumps(manifest, indent=2, sort_keys=True) + "\n", in pieces, where
    source i's "files" list is `files[i]` (flat entries, produced lazily, none kept; an
    entry may come as its text already, made with entry_template)."""
    marks = [f"\x00files-{secrets.token_hex(8)}-{i}" for i in range(len(files))]
    skeleton = {
        **manifest,
        "sources": [{**s, "files": m} for s, m in zip(manifest["sources"], marks, strict=True)],
    }
    text = json.dumps(skeleton, indent=2, sort_keys=True)
    for mark, entries in zip(marks, files, strict=True):
        head, text = text.split(encode_basestring_ascii(mark), 1)
        yield head
        first = True
        for entry in entries:
            yield ("[\n" if first else ",\n") + (
                entry if type(entry) is str else _file_entry(entry)
            )
            first = False
        yield "[]" if first else "\n" + _FILE_PAD[:-2] + "]"
    yield text + "\n"


def write_manifest(path: Path, manifest: dict[str, Any], files: list[Iterable[dict]]) -> None:
    """Write the manifest (see manifest_chunks) to a temporary file, then replace `path`."""
    with atomic_path(path) as tmp, open(tmp, "wb") as out:
        buffer: list[str] = []
        size = 0
        for chunk in manifest_chunks(manifest, files):
            buffer.append(chunk)
            size += len(chunk)
            if size >= 1 << 20:
                out.write("".join(buffer).encode("ascii"))
                buffer, size = [], 0
        out.write("".join(buffer).encode("ascii"))


def download_index(url: str, local: Path, fingerprint: str | None = None) -> Path:
    """Copy the index under the prefix `url` to the directory `local`: the manifest first
    (the commit point: it names the tables of one complete index), then the tables it
    names, each checked against its checksum as it arrives, so a damaged one is named by
    its URL rather than by the temporary copy. `fingerprint`: the index a plan was made
    from; when a re-index replaced it, its manifest kept under history/ and its tables
    are copied instead (read_manifest_of then finds it)."""
    from mds.core import storage

    local.mkdir(parents=True)
    url = url.rstrip("/")
    manifest_url = f"{url}/{MANIFEST}"
    if not storage.exists(manifest_url):
        raise IndexFormatError(f"{url}: no index there ({MANIFEST} missing); run `mds index`")
    (local / MANIFEST).write_bytes(storage.get_bytes(manifest_url))
    try:
        manifest = read_manifest(local)
    except IndexFormatError as exc:
        raise IndexFormatError(str(exc).replace(str(local / MANIFEST), manifest_url)) from None
    kept = history_name(fingerprint) if fingerprint else ""
    if kept and manifest.fingerprint != fingerprint and storage.exists(f"{url}/{kept}"):
        (local / kept).parent.mkdir()
        (local / kept).write_bytes(storage.get_bytes(f"{url}/{kept}"))
        manifest = read_manifest_of(local, fingerprint)
    for entry in manifest.sources:
        rel = str(entry["table"])
        data = storage.get_bytes(f"{url}/{rel}")
        got = "blake2b:" + hashlib.blake2b(data, digest_size=16).hexdigest()
        if got != entry["table_checksum"]:
            raise table_damage(f"{url}/{rel}", got, entry["table_checksum"])
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(data)
    return local


def table_intact(table: Path, checksum: str) -> bool:
    """Whether an index table still has the bytes its manifest records."""
    try:
        return table_checksum(table) == checksum
    except OSError:
        return False
