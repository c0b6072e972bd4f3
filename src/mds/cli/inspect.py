"""`mds inspect`: what an index or a plan holds, as tables and sparklines, JSON or HTML.

The figures come from `mds.planner.report` (plain dicts); this module picks the report and
where it goes: the terminal (cli/inspect_console.py), JSON, or HTML (cli/inspect_html.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from mds.cli.inspect_console import print_index, print_plan, print_step
from mds.cli.inspect_text import cost_unit
from mds.cli.output import console, json_option, print_json
from mds.core.storage import as_place
from mds.errors import ConfigError

__all__ = ["inspect_command"]


def inspect_command(
    path_text: str = typer.Argument(
        ...,
        metavar="INDEX|PLAN",
        help="An index directory or a plan file (or an s3:// or gs:// URL of either).",
    ),
    step: int | None = typer.Option(
        None, "--step", metavar="STEP", help="Plan: show this step sample by sample (0-based)."
    ),
    rank: list[int] = typer.Option(
        [],
        "--rank",
        metavar="RANK",
        help="With --step: only this DP rank (repeatable; default: all).",
    ),
    index_text: str | None = typer.Option(
        None,
        "--index",
        metavar="DIR",
        help="Plan: index directory (default: the one the plan names).",
    ),
    files: bool = typer.Option(
        False, "--files", help="Index: list every file with size and fingerprint."
    ),
    html: Path | None = typer.Option(
        None,
        "--html",
        metavar="FILE",
        help="Write a self-contained HTML report to this file instead.",
    ),
    json_out: bool = json_option("Print the report as JSON."),
) -> None:
    """Show what an index or a plan holds: sizes, lengths, mix, balance, or one step.

    PATH is an index directory (per source: rows, tokens, length percentiles and histogram,
    metadata values, files) or a plan file (header, target vs realized mix overall and per
    schedule phase, epochs, rank imbalance, capacity fill, charts over steps). With --step,
    a plan step's samples with their file locations, tokens and costs.

    Example:

    \b
        mds inspect build/index
        mds inspect build/index --files --json
        mds inspect build/plan.mds
        mds inspect build/plan.mds --step 10 --rank 3
        mds inspect build/plan.mds --html build/plan-report.html
    """
    # a URL stays a string: through Path its "//" would become "/" in every message
    path = as_place(path_text)
    index = None if index_text is None else as_place(index_text)
    if html is not None:
        from mds.planner.runtime.outputs import check_output, index_inputs

        local = [p for p in (path, index) if isinstance(p, Path)]
        inputs = index_inputs(path if path in local and path.is_dir() else _local(index), html)
        check_output("--html", html, [("inspected file", _local(path)), *inputs])
    report = _report(path, step, rank, index, files)
    if html is not None:
        from mds.cli.inspect_html import write_html

        unit = cost_unit(_plan_cost(path)) if report["kind"] == "step" else None
        write_html(report, html, unit)
        if not json_out:
            console.print(f"wrote {html}")
    if json_out:
        print_json(report)
    elif html is None and report["kind"] == "index":
        print_index(report, files)
    elif html is None and report["kind"] == "plan":
        print_plan(report)
    elif html is None:
        print_step(report, cost_unit(_plan_cost(path)))


def _local(path: Path | str | None) -> Path | None:
    return path if isinstance(path, Path) else None


def _plan_cost(path: Path | str) -> dict[str, Any]:
    from mds.core.planfile_reader import PlanReader

    with PlanReader(path) as reader:
        return reader.footer["config"]["cost"]


def _report(
    path: Path | str,
    step: int | None,
    ranks: list[int],
    index: Path | str | None,
    files: bool,
) -> dict[str, Any]:
    from mds.planner.report.common import detect

    kind = detect(path)
    if kind == "index":
        for given, option in ((step is not None, "--step"), (ranks, "--rank"), (index, "--index")):
            if given:
                raise ConfigError(f"{option} needs a plan file; {path} is an index directory")
        return _index_report(path)
    if files:
        raise ConfigError(f"--files needs an index directory; {path} is a plan file")
    if ranks and step is None:
        raise ConfigError("--rank needs --step")
    from mds.core.planfile_reader import PlanReader

    with PlanReader(path) as reader:
        if step is not None:
            from mds.planner.report.step import step_report

            return step_report(reader, step, ranks, index)
        from mds.planner.report.online import online_report
        from mds.planner.report.plan import plan_report

        report = plan_report(reader, index)
        online = online_report(reader, index)
        if online is not None:  # a segment of an online-mixed run
            report["online"] = online
        return report


def _index_report(path: Path | str) -> dict[str, Any]:
    """The report of an index directory, or of one under a prefix (copied to a temporary
    directory first, and named by its URL)."""
    from mds.planner.index.tables import download_index, read_manifest
    from mds.planner.report.index import index_report

    if isinstance(path, Path):
        return index_report(read_manifest(path))
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mds-inspect-") as tmp:
        report = index_report(read_manifest(download_index(path, Path(tmp) / "index")))
    report["path"] = path
    return report
