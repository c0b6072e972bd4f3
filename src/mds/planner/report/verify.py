"""Verify a plan end to end: every checksum in the plan file, then the index and source files
it was made from, so a run can prove before it starts that its data is what was planned.

`verify_plan` never raises for a mismatch: it returns every check with ok/failed and a detail
naming the first problem it found; the CLI turns the first failure into the exit code.
The checks are in report/verify_plan_file.py (the plan file), report/verify_index.py (the
index and its sources) and report/verify_fetch.py (the fetch records against the index).
"""

from __future__ import annotations

import os
from pathlib import Path

from mds.core.index_manifest import MANIFEST
from mds.core.planfile_reader import PlanReader
from mds.core.storage import is_url
from mds.errors import IndexFormatError, MdsError, PlanError
from mds.planner.report.verify_fetch import IndexTables, fetch_problem
from mds.planner.report.verify_index import plan_index, verify_index
from mds.planner.report.verify_plan_file import verify_plan_file
from mds.planner.report.verify_result import VerifyResult

__all__ = ["verify_plan"]


def verify_plan(
    plan: str | os.PathLike,
    *,
    index: str | os.PathLike | None = None,
    full: bool = False,
    data_root: str | os.PathLike | None = None,
    _place: str | None = None,
) -> VerifyResult:
    """Check the plan's checksums, its index and the index's source files (see module doc).

    Source files get a stat check (size, mtime, and the content fingerprint of a file whose
    mtime alone differs) unless `full`, which recomputes every content fingerprint. The
    files are looked for under `data_root`, else $MDS_DATA_ROOT, else the index's root.
    """
    if is_url(plan) or (index is not None and is_url(index)) or _index_url(plan, index):
        return _verify_copies(plan, index=index, full=full, data_root=data_root)
    result = VerifyResult(Path(plan), full)
    result.given_root, result.place = data_root, _place or Path(plan)
    footer = verify_plan_file(result)
    if index is not None:
        result.index = Path(index)
    elif footer is not None:
        recorded = str(plan_index(footer).get("path", ""))
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
        tables = verify_index(result, footer, full)
        if footer is not None and tables is not None and _passed(result, "index fingerprint"):
            _verify_fetch(result, tables)
    return result


def _index_url(plan: str | os.PathLike, index: str | os.PathLike | None) -> bool:
    """Whether a local plan, verified against the index it names, names one in a store."""
    if index is not None or is_url(plan):
        return False
    try:
        with PlanReader(plan) as reader:
            return is_url(str(plan_index(reader.footer).get("path", "")))
    except MdsError:
        return False  # reported by the plan file check


def _verify_copies(plan, *, index, full, data_root) -> VerifyResult:
    """Verify a plan, or against an index, in object storage: copied to a temporary
    directory first (every byte of a plan and of an index's tables is checked anyway);
    the result names them by their URLs."""
    import tempfile

    from mds.core.index_manifest import missing_index
    from mds.core.storage import exists, get_bytes
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
        where, fingerprint, recorded_path = index, None, index
        try:
            with PlanReader(local) as reader:
                recorded = plan_index(reader.footer)
            fingerprint = recorded.get("fingerprint")
            if where is None:
                where = recorded_path = str(recorded.get("path", "")) or None
        except PlanError:
            pass
        if where is not None and index is None and is_url(plan) and not os.path.isabs(where):
            from mds.core.storage import parent_url, resolve_under

            where = resolve_under(parent_url(str(plan)), str(where))  # beside the plan object
        copy = where
        if where is not None and is_url(where):
            if index is None and not exists(f"{where}/{MANIFEST}"):
                raise IndexFormatError(missing_index(plan, where, recorded_path))
            copy = download_index(str(where), Path(tmp) / "index", fingerprint)
        result = verify_plan(
            local, index=copy, full=full, data_root=data_root, _place=plan if is_url(plan) else None
        )
        result.plan = plan  # type: ignore[assignment]
        if where is not None:
            result.index = where  # type: ignore[assignment]
        return result


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
