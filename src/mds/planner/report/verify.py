"""Verify a plan end to end: every checksum in the plan file, then the index and source files
it was made from, so a run can prove before it starts that its data is what was planned.

`verify_plan` never raises for a mismatch: it returns every check with ok/failed and a detail
naming the first problem it found; the CLI turns the first failure into the exit code.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mds.core.datacheck import entry_paths, file_problem, holds_none
from mds.core.index_manifest import MANIFEST, facts_problem, payload_problem
from mds.core.planfile_reader import PlanReader
from mds.core.storage import (
    MOVED_HINT,
    given_root,
    is_url,
    plan_data_root,
    relocated,
)
from mds.core.tokenizer import index_tokenizer_path
from mds.errors import ConfigError, MdsError, PlanError
from mds.planner.index.tables import (
    IndexManifest,
    index_fingerprint,
    read_manifest,
)
from mds.planner.report.verify_fetch import IndexTables, fetch_problem

__all__ = ["Check", "VerifyResult", "verify_plan"]

_READ = 8 << 20  # bytes hashed per read: sections and tables are streamed, never loaded whole
_DIR_ENTRY = 24  # bytes per rank in a chunk directory (docs/plan-format.md)


@dataclass(frozen=True)
class Check:
    """One verified property. `kind` says what a failure means: a corrupt "plan", a
    malformed "index", or "data" that changed since it was indexed."""

    name: str
    ok: bool
    detail: str
    kind: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass
class VerifyResult:
    plan: Path
    full: bool
    plan_id: str | None = None
    index: Path | None = None
    data_root: Path | str | None = None
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def first_failure(self) -> Check | None:
        return next((c for c in self.checks if not c.ok), None)

    def add(self, name: str, kind: str, problem: str | None, detail: str) -> None:
        """Record a check: failed with `problem`, or passed with `detail`."""
        self.checks.append(Check(name, problem is None, problem or detail, kind))

    def to_json(self) -> dict[str, Any]:
        first = self.first_failure
        return {
            "ok": self.ok,
            "plan": str(self.plan),
            "plan_id": self.plan_id,
            "index": str(self.index) if self.index is not None else None,
            "mode": "full" if self.full else "stat",
            "checks": [c.to_json() for c in self.checks],
            "first_failure": first.to_json() if first else None,
        }


def verify_plan(
    plan: str | os.PathLike,
    *,
    index: str | os.PathLike | None = None,
    full: bool = False,
    data_root: str | os.PathLike | None = None,
) -> VerifyResult:
    """Check the plan's checksums, its index and the index's source files (see module doc).

    Source files get a stat check (size, mtime, and the content fingerprint of a file whose
    mtime alone differs) unless `full`, which recomputes every content fingerprint. The
    files are looked for under `data_root`, else $MDS_DATA_ROOT, else the index's root.
    """
    if is_url(plan) or (index is not None and is_url(index)) or _index_url(plan, index):
        return _verify_copies(plan, index=index, full=full, data_root=data_root)
    result = VerifyResult(Path(plan), full)
    given, _ = given_root(data_root)
    result.data_root = _root(given) if given is not None else None
    footer = _verify_plan_file(result)
    if index is not None:
        result.index = Path(index)
    elif footer is not None:
        recorded = str(_plan_index(footer).get("path", ""))
        result.index = result.plan.parent / recorded
        if not (result.index / MANIFEST).is_file():  # the plan moved without its index
            problem = (
                f"{result.plan}: its index was expected at {result.index} (recorded relative to "
                f"the plan's directory as {recorded!r}); if the plan or the index moved, pass "
                "--index with the index directory (and --data-root or MDS_DATA_ROOT for the data)"
            )
            result.add("index manifest", "index", problem, "")
            return result
    if result.index is not None:
        tables = _verify_index(result, footer, full)
        if footer is not None and tables is not None and _passed(result, "index fingerprint"):
            _verify_fetch(result, tables)
    return result


def _index_url(plan: str | os.PathLike, index: str | os.PathLike | None) -> bool:
    """Whether a local plan, verified against the index it names, names one in a store."""
    if index is not None or is_url(plan):
        return False
    try:
        with PlanReader(plan) as reader:
            return is_url(str(_plan_index(reader.footer).get("path", "")))
    except MdsError:
        return False  # reported by the plan file check


def _verify_copies(plan, *, index, full, data_root) -> VerifyResult:
    """Verify a plan, or against an index, in object storage: copied to a temporary
    directory first (every byte of a plan and of an index's tables is checked anyway);
    the result names them by their URLs."""
    import tempfile

    from mds.core.storage import get_bytes
    from mds.planner.index.tables import download_index

    with tempfile.TemporaryDirectory(prefix="mds-verify-") as tmp:
        local = Path(plan)
        if is_url(plan):
            local = Path(tmp) / "plan.mds"
            try:
                local.write_bytes(get_bytes(str(plan)))
            except MdsError as exc:
                result = VerifyResult(plan, full)  # type: ignore[arg-type]
                result.add("plan file", "plan", str(exc), "")
                return result
        where = index
        if where is None:
            try:
                with PlanReader(local) as reader:
                    where = str(_plan_index(reader.footer).get("path", "")) or None
            except PlanError:
                where = None
        if where is not None and index is None and is_url(plan) and not os.path.isabs(where):
            from mds.core.storage import parent_url, resolve_under

            where = resolve_under(parent_url(str(plan)), str(where))  # beside the plan object
        copy = where
        if where is not None and is_url(where):
            copy = download_index(str(where), Path(tmp) / "index")
        result = verify_plan(local, index=copy, full=full, data_root=data_root)
        result.plan = plan  # type: ignore[assignment]
        if where is not None:
            result.index = where  # type: ignore[assignment]
        return result


def _root(root: str) -> Path | str:
    """A data root: a local directory, or an object store URL kept as it is."""
    return root.rstrip("/") if is_url(root) else Path(root).absolute()


def _passed(result: VerifyResult, name: str) -> bool:
    return any(c.name == name and c.ok for c in result.checks)


def _verify_fetch(result: VerifyResult, tables: IndexTables) -> None:
    """The fetch records every rank replays from agree with the index, sample by sample."""
    try:
        with PlanReader(result.plan) as reader:
            problem, samples = fetch_problem(reader, tables)
    except MdsError as exc:
        problem, samples = str(exc), 0
    detail = f"{samples:,} samples: files, rows, token counts and byte ranges match the index"
    result.add("fetch records", "plan", problem, detail)


def _plan_index(footer: dict[str, Any]) -> dict[str, Any]:
    """The footer's record of its index (an empty dict if the footer lacks one)."""
    index = footer.get("index")
    return index if isinstance(index, dict) else {}


# --- the plan file -------------------------------------------------------------------------


def _verify_plan_file(result: VerifyResult) -> dict[str, Any] | None:
    """Footer, layout, directories, blocks, sections; returns the footer if it is readable."""
    try:
        reader = PlanReader(result.plan)
    except PlanError as exc:
        result.add("plan file", "plan", str(exc).removeprefix(f"{result.plan}: "), "")
        return None
    with reader, open(result.plan, "rb") as f:
        result.plan_id = reader.plan_id
        result.add(
            "plan file",
            "plan",
            None,
            f"plan id {reader.plan_id}, {reader.steps} steps, {len(reader.chunks)} chunks "
            f"x {reader.dp} ranks",
        )
        result.add("plan layout", "plan", _layout_problem(reader), "chunks cover every step")
        bad_dirs = _verify_directories(result, reader, f)
        _verify_blocks(result, reader, bad_dirs)
        _verify_sections(result, reader, f)
        return reader.footer


def _layout_problem(reader: PlanReader) -> str | None:
    expected = reader.first_step  # a re-planned plan starts at its hand-over step
    for i, (a, b, *_rest) in enumerate(reader.chunks):
        if a != expected:
            return f"chunk {i} starts at step {a}, expected {expected}"
        expected = b
    steps = reader.footer.get("steps")
    if steps != expected:
        return f"the footer says {steps} steps, the chunks cover {expected}"
    return None


def _hash_range(f: BinaryIO, offset: int, size: int, file_size: int) -> bytes | None:
    """The plan checksum of bytes [offset, offset + size), read piecewise; None if outside."""
    if offset < 0 or size < 0 or offset + size > file_size:
        return None
    h = hashlib.blake2b(digest_size=8)
    f.seek(offset)
    left = size
    while left:
        piece = f.read(min(left, _READ))
        if not piece:
            return None
        h.update(piece)
        left -= len(piece)
    return h.digest()


def _verify_directories(result: VerifyResult, reader: PlanReader, f: BinaryIO) -> set[int]:
    """Check every chunk directory against the footer; returns the chunks that failed."""
    bad: list[int] = []
    first = None
    for c, (_a, _b, offset, digest, _w) in enumerate(reader.chunks):
        got = _hash_range(f, offset, reader.dp * _DIR_ENTRY, reader.size)
        if got != digest:
            bad.append(c)
            first = first or (
                f"chunk {c}: directory outside the file (truncated?)"
                if got is None
                else f"chunk {c}: directory checksum mismatch"
            )
    result.add(
        "chunk directories",
        "plan",
        _first_of(first, len(bad), "directories"),
        f"{len(reader.chunks)} directories",
    )
    return set(bad)


def _verify_blocks(result: VerifyResult, reader: PlanReader, bad_dirs: set[int]) -> None:
    """Read and check every (chunk, rank) block, one at a time."""
    failed, samples, first = 0, 0, None
    prefix = f"{reader.path}: "
    for c in range(len(reader.chunks)):
        if c in bad_dirs:
            continue  # counted as a directory failure: its blocks cannot be located
        for r in range(reader.dp):
            try:
                samples += len(reader.rank_chunk(c, r).ids)
            except PlanError as exc:
                failed += 1
                first = first or str(exc).removeprefix(prefix)
    checked = (len(reader.chunks) - len(bad_dirs)) * reader.dp
    result.add(
        "rank blocks",
        "plan",
        _first_of(first, failed, "blocks"),
        f"{checked} blocks, {samples:,} samples",
    )


def _verify_sections(result: VerifyResult, reader: PlanReader, f: BinaryIO) -> None:
    failed, first = 0, None
    for name, meta in sorted(reader.sections.items()):
        problem = _section_problem(reader, f, name, meta)
        if problem is not None:
            failed += 1
            first = first or problem
    result.add(
        "sections",
        "plan",
        _first_of(first, failed, "sections"),
        f"{len(reader.sections)} sections: {', '.join(sorted(reader.sections))}",
    )


def _section_problem(reader: PlanReader, f: BinaryIO, name: str, meta: Any) -> str | None:
    try:
        offset, size = int(meta["offset"]), int(meta["size"])
        dtype = np.dtype(str(meta["dtype"]))
        shape = [int(x) for x in meta["shape"]]
        digest = bytes.fromhex(meta["checksum"])
    except (KeyError, ValueError, TypeError) as exc:
        return f"section {name!r}: corrupt footer entry ({exc})"
    if dtype.hasobject or int(np.prod(shape)) * dtype.itemsize != size:
        return f"section {name!r}: size does not match its shape {shape} and dtype"
    got = _hash_range(f, offset, size, reader.size)
    if got is None:
        return f"section {name!r}: outside the file (truncated?)"
    if got != digest:
        return f"section {name!r}: checksum mismatch"
    return None


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _first_of(first: str | None, failed: int, what: str) -> str | None:
    """The first problem, with how many more of the same kind there were."""
    if first is None:
        return None
    return first if failed <= 1 else f"{first} (and {failed - 1} more {what})"


# --- the index and its sources -----------------------------------------------------------


def _verify_index(
    result: VerifyResult, footer: dict[str, Any] | None, full: bool
) -> IndexTables | None:
    """Check the index and its source files; returns the index's tables (each read at most
    once, for this check and the fetch records') when the manifest could be read."""
    assert result.index is not None
    try:
        manifest = read_manifest(result.index)
    except MdsError as exc:
        result.add("index manifest", "index", str(exc), "")
        return None
    indexed = root = manifest.data.get("root")
    if result.data_root is not None:
        root = str(result.data_root)
    elif footer is not None:
        root = _plan_root(result.plan, footer) or root
    problem = _manifest_problem(manifest, root)
    files = sum(len(s["files"]) for s in manifest.sources)
    detail = f"{_count(len(manifest.sources), 'source')}, {_count(files, 'file')}, root {root}"
    result.add("index manifest", "index", problem, detail)
    _verify_fingerprint(result, manifest, footer)
    tables = IndexTables(manifest)
    if not (isinstance(root, str) and (Path(root).is_absolute() or is_url(root))):
        return tables
    # data elsewhere than where it was indexed: a copy keeps names, sizes and mtimes
    # whatever its bytes are, so every file's content fingerprint is checked
    moved = not isinstance(indexed, str) or relocated(_root(root), _root(indexed))
    named = (
        item
        for entry in manifest.sources
        for item in entry["files"]
        if isinstance(item, dict) and isinstance(item.get("path"), str)
    )
    first = list(itertools.islice(named, 16))
    empty = None
    if holds_none(_root(root), first):
        empty = (
            f"the data root {root} holds none of the indexed files (such as "
            f"{first[0]['path']}); {MOVED_HINT}"
        )
    if empty is not None:
        result.add("data root", "data", empty, "")
    for sid, entry in enumerate(manifest.sources):
        name = entry["name"]
        result.add(
            f"source {name}: table", "data", tables.problem(sid), f"{entry['table']}, checksum ok"
        )
        if empty is None:
            problem, detail = _files_problem(_root(root), entry, full, moved)
            result.add(f"source {name}: files", "data", problem, detail)
    if footer is not None:
        _verify_replay(result, footer, _root(root))
    return tables


def _verify_replay(result: VerifyResult, footer: dict[str, Any], root: Path | str) -> None:
    """Each planned source passes the executor's own start-up checks (the same functions):
    readable fetch facts, a payload column, and for text counted with a tokenizer.json that
    file as indexed; so verify refuses what the job would refuse whatever it is given."""
    fetch = footer.get("fetch")
    facts = fetch.get("sources") if isinstance(fetch, dict) else None
    if not isinstance(facts, dict):
        return  # a corrupt footer: the plan checks report it
    for source in footer.get("sources") or []:
        if not isinstance(source, dict) or not int(source.get("samples", 0) or 0) > 0:
            continue  # the executor reads nothing of it
        name = source.get("name")
        entry = facts.get(name)
        detail = "payload column"
        problem = facts_problem(entry)
        if problem is not None:
            problem = f"{result.plan}: corrupt plan footer (source {name!r}: {problem})"
        else:
            problem = payload_problem(name, entry)
        if problem is None and _counted_with_tokenizer(entry):
            try:
                path = index_tokenizer_path(name, entry, root)
                detail += f", tokenizer {path} as indexed"
            except MdsError as exc:
                problem = str(exc)
        result.add(f"source {name}: replay", "data", problem, detail)


def _counted_with_tokenizer(facts: dict[str, Any]) -> bool:
    """A text source whose lengths a tokenizer.json counted: the executor tokenizes with it."""
    return (facts.get("payload") or {}).get("kind") == "text" and (
        facts.get("length") or {}
    ).get("kind") == "tokenizer"


def _manifest_problem(manifest: IndexManifest, root: Any) -> str | None:
    """An unusable root, or file paths that are not relative paths inside it."""
    if not (isinstance(root, str) and (Path(root).is_absolute() or is_url(root))):
        return f"{manifest.path}: manifest `root` is not an absolute path ({root!r})"
    bad, first = 0, None
    for entry in manifest.sources:
        for i, item in enumerate(entry["files"]):
            where = f"{entry['name']} files[{i}]"
            try:
                entry_paths(_root(root), item, where)
            except ValueError as exc:
                bad += 1
                first = first or f"{manifest.path}: {exc}"
    return _first_of(first, bad, "unsafe paths")


def _verify_fingerprint(
    result: VerifyResult, manifest: IndexManifest, footer: dict[str, Any] | None
) -> None:
    """The manifest's fingerprint matches its entries and the one the plan was made from."""
    stored = manifest.fingerprint
    problem = None
    if index_fingerprint(manifest.sources) != stored:
        problem = (
            f"{manifest.path}: manifest fingerprint {stored} does not match its own entries "
            "(manifest edited?)"
        )
    elif footer is not None:
        planned = str(_plan_index(footer).get("fingerprint"))
        if planned != stored:
            changed = _changed_sources(manifest, footer)
            problem = (
                f"{manifest.path}: index fingerprint {stored} differs from the plan's {planned}"
                + (f" (changed: {', '.join(changed)})" if changed else "")
                + "; pass the right --index or re-plan"
            )
    detail = stored if footer is not None else f"{stored} (not compared: plan unreadable)"
    result.add("index fingerprint", "data", problem, detail)


def _changed_sources(manifest: IndexManifest, footer: dict[str, Any]) -> list[str]:
    """Sources whose table differs between the plan's record and the manifest."""
    planned = {
        s.get("name"): s.get("table_checksum")
        for s in _plan_index(footer).get("sources", [])
        if isinstance(s, dict)
    }
    now = {s["name"]: s["table_checksum"] for s in manifest.sources}
    return [n for n in dict.fromkeys([*planned, *now]) if planned.get(n) != now.get(n)]


def _plan_root(plan: Path, footer: dict[str, Any]) -> str | None:
    """The data root as the executor finds it from the plan (relative to the plan's
    directory), or None when the plan records none that is there."""
    fetch = footer.get("fetch")
    recorded = fetch.get("root") if isinstance(fetch, dict) else None
    if not isinstance(recorded, str) or not recorded:
        return None
    try:
        return str(plan_data_root(plan, recorded, None)[0])
    except ConfigError:
        return None


def _files_problem(
    root: Path, entry: dict[str, Any], full: bool, moved: bool = False
) -> tuple[str | None, str]:
    """Check every file of one source (`moved`: by content too, see `file_problem`);
    returns (first problem or None, passing detail)."""
    files = entry["files"]
    failed, first = 0, None
    for i, item in enumerate(files):
        problem = file_problem(root, item, full, f"{entry['name']} files[{i}]", content=moved)
        if problem is not None:
            failed += 1
            first = first or problem
    modes = sorted(
        {str(f.get("fingerprint", "")).partition(":")[0] for f in files if isinstance(f, dict)}
    )
    what = f"content fingerprints ({', '.join(modes)})" if full else "size and mtime"
    if moved and not full:
        what = f"size, mtime and content fingerprints ({', '.join(modes)}: the root moved)"
    detail = f"{_count(len(files), 'file')}, {what} match"
    if first is not None and failed > 1:
        first = f"{first} ({failed} of {len(files)} files differ)"
    return first, detail
