"""`mds verify`: prove a plan, its index and its source files are intact before a run."""

from __future__ import annotations

import typer

from mds.cli.output import console, data_root_option, json_option, print_json
from mds.errors import DataChangedError, IndexFormatError, MdsError, PlanError

__all__ = ["verify_command"]

# What a failed check means, as the error the one error path prints.
_ERRORS: dict[str, type[MdsError]] = {
    "plan": PlanError,
    "index": IndexFormatError,
    "data": DataChangedError,
}


def verify_command(
    plan: str = typer.Argument(
        ..., metavar="PLAN", help="Plan file written by `mds plan` (or an s3:// or gs:// URL)."
    ),
    full: bool = typer.Option(
        False, "--full", help="Recompute source files' content fingerprints (reads every file)."
    ),
    index: str | None = typer.Option(
        None,
        "--index",
        metavar="DIR|URL",
        help="Index directory or prefix (default: the one the plan names).",
    ),
    data_root: str | None = data_root_option(),
    json_out: bool = json_option("Print the checks as JSON."),
) -> None:
    """Verify a plan: every checksum in the plan file, the index it was made from, and the
    index's source files (size and mtime, and the content fingerprint of a file whose mtime
    alone differs; with --full, every content fingerprint).

    Exits 0 when every check passes; otherwise prints the checks and one error line
    naming the first mismatch (with --json: an "error" object in the JSON), and exits 1.

    Example:

    \b
        mds verify build/plan.mds
        mds verify build/plan.mds --full
        mds verify build/plan.mds --index build/other-index --json
        mds verify build/plan.mds --data-root /mnt/nvme/data
    """
    from mds.planner.report.verify import verify_plan

    result = verify_plan(plan, index=index, full=full, data_root=data_root)
    first = result.first_failure
    error = None if first is None else _ERRORS[first.kind](f"{plan}: {first.name}: {first.detail}")
    if json_out:
        # one JSON document: the checks, and the error a failed check means
        data = result.to_json()
        if error is not None:
            data["error"] = {"type": type(error).__name__, "message": str(error)}
        print_json(data)
        if error is not None:
            raise typer.Exit(1)
        return
    _print_checks(result)
    if error is not None:
        raise error


def _print_checks(result) -> None:
    from rich.markup import escape
    from rich.table import Table

    mode = "content fingerprints" if result.full else "stat check of source files"
    table = Table(title=f"verify {result.plan} ({mode})", title_justify="left")
    table.add_column("check")
    table.add_column("status")
    table.add_column("detail", overflow="fold")
    for check in result.checks:
        status = "[green]ok[/]" if check.ok else "[bold red]FAILED[/]"
        table.add_row(escape(check.name), status, escape(check.detail))
    console.print(table)
    if result.data_root is not None:
        console.print(f"data root checked: {escape(str(result.data_root))}")
    failed = sum(not c.ok for c in result.checks)
    if failed:
        console.print(f"{failed} of {len(result.checks)} checks FAILED")
    else:
        console.print(f"all {len(result.checks)} checks passed; plan id {result.plan_id}")
