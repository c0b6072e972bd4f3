"""`mds export`: one row per planned sample, as Parquet."""

from __future__ import annotations

from pathlib import Path

import typer

from mds.cli.output import console, json_option, print_json

__all__ = ["export_command"]


def export_command(
    plan: Path = typer.Argument(..., metavar="PLAN", help="Plan file written by `mds plan`."),
    output: Path = typer.Option(
        ..., "--output", "-o", metavar="FILE", help="Parquet file to write."
    ),
    index: Path | None = typer.Option(
        None, "--index", metavar="DIR", help="Index directory (default: the one the plan names)."
    ),
    json_out: bool = json_option("Print a JSON summary."),
) -> None:
    """Export a plan as a flat Parquet table: step, rank, micro_batch, source, row, file
    and location in it, n_tokens, cost and kept metadata, one row per planned sample.

    Example:

    \b
        mds export build/plan.mds -o build/plan.parquet
        duckdb -c "SELECT rank, sum(cost) FROM 'build/plan.parquet' GROUP BY 1"
    """
    from mds.planner.export import export_plan

    rows = export_plan(plan, output, index)
    if json_out:
        print_json({"output": str(output), "rows": rows})
    else:
        console.print(f"wrote {rows:,} rows to {output}")
