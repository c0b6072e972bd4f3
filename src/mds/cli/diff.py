"""`mds diff`: what differs between two plans: config, first differing step, source shares."""

from __future__ import annotations

import typer

from mds.cli.output import ERROR_EXIT, console, json_option, print_json

__all__ = ["diff_command"]


def diff_command(
    ctx: typer.Context,
    plan_a: str = typer.Argument(..., metavar="PLAN_A", help="First plan file (A), or a URL."),
    plan_b: str = typer.Argument(..., metavar="PLAN_B", help="Second plan file (B), or a URL."),
    exit_code: bool = typer.Option(
        False,
        "--exit-code",
        help="Exit 1 if the plans differ, 0 if identical (and 2 if a plan cannot be read).",
    ),
    json_out: bool = json_option("Print the differences as JSON."),
) -> None:
    """Compare two plans: whether they are identical, which config keys differ, the first
    step and DP rank whose samples differ (and whether that step has the same samples,
    only assigned differently), and each source's share of the samples in both.

    Exits 0 whether or not the plans differ and 1 if a plan cannot be read; with
    --exit-code, like diff(1): 0 identical, 1 different, 2 a plan cannot be read.

    Example:

    \b
        mds plan sample_data/mds.toml -o build/plan-8.mds --dp-size 8
        mds diff build/plan.mds build/plan-8.mds
        mds diff build/plan.mds build/plan-new.mds --json
        mds diff build/plan.mds build/plan-2.mds --exit-code || echo differ
    """
    from mds.planner.report.diff import diff_plans

    if exit_code:
        ctx.meta[ERROR_EXIT] = 2
    result = diff_plans(plan_a, plan_b)
    if json_out:
        print_json(result.to_json())
    else:
        _print_diff(result)
    if exit_code and not result.identical:
        raise typer.Exit(1)


def _print_diff(d) -> None:
    from rich.markup import escape
    from rich.table import Table

    line = {"soft_wrap": True}  # one line each, for grep
    console.print(f"A: {escape(str(d.a))} (plan id {d.plan_id_a}, {d.steps_a} steps)", **line)
    console.print(f"B: {escape(str(d.b))} (plan id {d.plan_id_b}, {d.steps_b} steps)", **line)
    if d.identical:
        console.print("identical")
        return
    console.print("the plans differ")
    if d.header:
        header = Table(title="header differences", title_justify="left")
        for col in ("key", "A", "B"):
            header.add_column(col, overflow="fold")
        for h in d.header:
            a, b = h.shown
            header.add_row(escape(h.key), escape(a), escape(b))
        console.print(header)
    else:
        console.print("header: same config and index")
    console.print(f"first difference: {escape(_first(d))}", **line)
    _print_shares(d)


def _first(d) -> str:
    if d.first_step is None:
        return "none: every step has the same samples on the same ranks"
    text = d.first_step.detail
    if d.first_sample_step is None:
        text += "; every common step has the same samples"
    elif d.first_sample_step != d.first_step.step:
        text += f"; first step with different samples: {d.first_sample_step}"
    return text


def _print_shares(d) -> None:
    from rich.table import Table

    table = Table(title="samples per source", title_justify="left")
    for col in ("source", "A", "B", "share A", "share B", "change"):
        table.add_column(col, justify="left" if col == "source" else "right")

    def num(x) -> str:
        return "-" if x is None else f"{x:,}"

    def pct(x) -> str:
        return "-" if x is None else f"{x:.2f}%"

    for s in d.sources:
        change = "only in A" if s.samples_b is None else "only in B" if s.samples_a is None else ""
        change = change or f"{s.delta_pp:+.2f} pp"
        table.add_row(
            s.name, num(s.samples_a), num(s.samples_b), pct(s.share_a), pct(s.share_b), change
        )
    console.print(table)
