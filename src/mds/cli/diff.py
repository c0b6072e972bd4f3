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
    """Compare two plans: whether they are identical, every config key and footer field that
    differs (sources by name: `sources.web.weight`; `index.path`, `lineage.at_step`), the
    first step and DP rank whose samples differ (and whether that step has the same samples,
    only assigned differently), and each source's share of the samples in both over the
    steps both plans hold (a plan re-planned from step K holds steps K.. only).

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
    for label, path, plan_id, first, end in (
        ("A", d.a, d.plan_id_a, d.first_step_a, d.steps_a),
        ("B", d.b, d.plan_id_b, d.first_step_b, d.steps_b),
    ):
        held = f"{end - first} steps: {_steps(first, end)}"
        console.print(f"{label}: {escape(str(path))} (plan id {plan_id}, {held})", **line)
    if d.identical:
        console.print("identical")
        return
    what = sorted({h.key.split(".")[0].split("[")[0] for h in d.header})
    console.print(
        f"the plans differ: {escape(', '.join(h.key for h in d.header))}"
        if 0 < len(d.header) <= 3
        else f"the plans differ in {len(d.header)} fields (of {', '.join(what)})"
        if d.header
        else "the plans differ in their steps only"
    )
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


def _steps(first: int, end: int) -> str:
    return f"step {first}" if end - first == 1 else f"steps {first}-{end - 1}"


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

    if d.shared is None:
        console.print(f"samples per source: not compared, {d.shared_text}")
        return
    console.print(f"samples per source, {d.shared_text}:")
    table = Table()
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
