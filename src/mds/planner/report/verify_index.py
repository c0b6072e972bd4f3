"""`mds verify`'s checks of the index a plan was made from and of its source files: the
manifest and its fingerprint, each table's checksum, each file by stat or by content, and
each planned source against the executor's own start-up checks."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from mds.core.datacheck import entry_paths, file_problem, holds_none
from mds.core.index_manifest import facts_problem, payload_problem, read_manifest_of
from mds.core.storage import MOVED_HINT, given_root, is_url, plan_data_root, relocated
from mds.core.tokenizer import index_tokenizer_path
from mds.errors import ConfigError, MdsError
from mds.planner.index.tables import IndexManifest, index_fingerprint
from mds.planner.report.verify_fetch import IndexTables
from mds.planner.report.verify_result import VerifyResult, count, first_of

__all__ = ["as_root", "plan_index", "verify_index"]


def as_root(root: str) -> Path | str:
    """A data root: a local directory, or an object store URL kept as it is."""
    return root.rstrip("/") if is_url(root) else Path(root).absolute()


def plan_index(footer: dict[str, Any]) -> dict[str, Any]:
    """The footer's record of its index (an empty dict if the footer lacks one)."""
    index = footer.get("index")
    return index if isinstance(index, dict) else {}


def verify_index(
    result: VerifyResult, footer: dict[str, Any] | None, full: bool
) -> IndexTables | None:
    """Check the index and its source files; returns the index's tables (each read at most
    once, for this check and the fetch records') when the manifest could be read."""
    assert result.index is not None
    try:
        # the plan's own index, kept under history/ if a re-index has replaced it since
        manifest = read_manifest_of(result.index, plan_index(footer or {}).get("fingerprint"))
    except MdsError as exc:
        result.add("index manifest", "index", str(exc), "")
        return None
    indexed = manifest.data.get("root")
    root, unusable = _data_root(result, footer, indexed)
    if root is not None:
        result.data_root = as_root(root)
    problem = _manifest_problem(manifest, indexed if root is None else root)
    files = sum(len(s["files"]) for s in manifest.sources)
    detail = f"{count(len(manifest.sources), 'source')}, {count(files, 'file')}"
    result.add("index manifest", "index", problem, detail)
    _verify_fingerprint(result, manifest, footer)
    vision = ((footer or {}).get("config") or {}).get("vision")
    tables = IndexTables(manifest, vision)
    if unusable is not None:  # the executor refuses this root: so does verify
        result.add("data root", "data", unusable, "")
        return tables
    if not (isinstance(root, str) and (Path(root).is_absolute() or is_url(root))):
        return tables
    # data elsewhere than where it was indexed: a copy keeps names, sizes and mtimes
    # whatever its bytes are, so every file's content fingerprint is checked
    moved = not isinstance(indexed, str) or relocated(as_root(root), as_root(indexed))
    named = (
        item
        for entry in manifest.sources
        for item in entry["files"]
        if isinstance(item, dict) and isinstance(item.get("path"), str)
    )
    first = list(itertools.islice(named, 16))
    empty = None
    if holds_none(as_root(root), first):  # the job would stop with the same hint
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
            problem, detail = _files_problem(as_root(root), entry, full, moved)
            result.add(f"source {name}: files", "data", problem, detail)
    if footer is not None:
        _verify_replay(result, footer, as_root(root))
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
    return (facts.get("payload") or {}).get("kind") == "text" and (facts.get("length") or {}).get(
        "kind"
    ) == "tokenizer"


def _manifest_problem(manifest: IndexManifest, root: Any) -> str | None:
    """An unusable root, or file paths that are not relative paths inside it."""
    if not (isinstance(root, str) and (Path(root).is_absolute() or is_url(root))):
        return f"{manifest.path}: manifest `root` is not an absolute path ({root!r})"
    bad, first = 0, None
    for entry in manifest.sources:
        for i, item in enumerate(entry["files"]):
            where = f"{entry['name']} files[{i}]"
            try:
                entry_paths(as_root(root), item, where)
            except ValueError as exc:
                bad += 1
                first = first or f"{manifest.path}: {exc}"
    return first_of(first, bad, "unsafe paths")


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
        planned = str(plan_index(footer).get("fingerprint"))
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
        for s in plan_index(footer).get("sources", [])
        if isinstance(s, dict)
    }
    now = {s["name"]: s["table_checksum"] for s in manifest.sources}
    return [n for n in dict.fromkeys([*planned, *now]) if planned.get(n) != now.get(n)]


def _data_root(
    result: VerifyResult, footer: dict[str, Any] | None, indexed: Any
) -> tuple[Any, str | None]:
    """The data root the executor would read, found by its own function
    (`storage.plan_data_root`: --data-root, else $MDS_DATA_ROOT, else the root the plan
    records relative to its own directory), and the executor's refusal of it (or None).
    Without a readable plan, the given root or else the index's recorded one."""
    fetch = (footer or {}).get("fetch")
    recorded = fetch.get("root") if isinstance(fetch, dict) else None
    if not isinstance(recorded, str) or not recorded:
        given, _ = given_root(result.given_root)
        return (given if given is not None else indexed), None
    try:
        return str(plan_data_root(result.place, recorded, result.given_root)[0]), None
    except ConfigError as exc:
        return None, str(exc)


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
    detail = f"{count(len(files), 'file')}, {what} match"
    if first is not None and failed > 1:
        first = f"{first} ({failed} of {len(files)} files differ)"
    return first, detail
