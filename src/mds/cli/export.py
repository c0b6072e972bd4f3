"""`mds export`: one row per planned sample, as Parquet."""

from __future__ import annotations

import typer

from mds.cli.output import PLAN_DATA_ROOT, console, data_root_option, json_option, print_json
from mds.errors import ConfigError

__all__ = ["export_command", "step_range"]


def export_command(
    plan: str = typer.Argument(
        ..., metavar="PLAN", help="Plan file written by `mds plan` (or its s3:// or gs:// URL)."
    ),
    output: str = typer.Option(
        ..., "--output", "-o", metavar="FILE", help="Parquet file to write."
    ),
    index: str | None = typer.Option(
        None, "--index", metavar="DIR", help="Index directory (default: the one the plan names)."
    ),
    steps: str | None = typer.Option(
        None, "--steps", metavar="A:B", help="Only steps A to B-1 (A: or :B leave an end open)."
    ),
    rank: list[int] = typer.Option(
        [], "--rank", metavar="R", help="Only DP rank R (repeatable; default: every rank)."
    ),
    content: bool = typer.Option(
        False,
        "--hash",
        help="Add a content_hash column: reads the exported samples from the data (without "
        "it nothing but the plan and the index is read).",
    ),
    data_root: str | None = data_root_option(f"With --hash: {PLAN_DATA_ROOT[0].lower()}{PLAN_DATA_ROOT[1:]}"),
    json_out: bool = json_option("Print a JSON summary."),
) -> None:
    """Export a plan as a flat Parquet table, one row per planned sample: step, rank,
    micro_batch, sample_id, source, row, epoch, file and location in it, n_tokens,
    planned_tokens (after truncation), cost, cost_units and kept metadata; with --hash
    also each sample's content_hash.

    Example:

    \b
        mds export build/plan.mds -o build/plan.parquet
        mds export build/plan.mds -o build/steps.parquet --steps 10:20 --rank 3
        mds export build/plan.mds -o build/lineage.parquet --hash
        duckdb -c "SELECT rank, sum(cost) FROM 'build/plan.parquet' GROUP BY 1"
    """
    from mds.planner.report.export import export_plan

    extra = None
    if content:
        from functools import partial

        from mds.cli.contents import with_hashes

        extra = partial(with_hashes, plan, data_root=data_root)
    elif data_root is not None:
        raise ConfigError("--data-root is read only with --hash (export reads no data without it)")
    # URLs stay strings (a Path would fold s3:// into s3:/); export_plan tells them apart
    rows = export_plan(plan, output, index, step_range(steps), rank or None, extra)
    if json_out:
        print_json({"output": str(output), "rows": rows})
    else:
        console.print(f"wrote {rows:,} rows to {output}")


def step_range(text: str | None) -> tuple[int | None, int | None] | None:
    """`A:B` (either end may be left out) as (A, B); a ConfigError names the option."""
    if text is None:
        return None
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        return tuple(int(p) if p.strip() else None for p in parts)  # type: ignore[return-value]
    except ValueError:
        raise ConfigError(f"--steps {text!r}: expected A:B, e.g. 10:20, 10: or :20") from None
