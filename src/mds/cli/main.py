"""The `mds` command: a thin layer over the library; user errors print as one line.

Heavy imports (polars, the planner) happen inside commands so `mds --help` stays fast.
"""

from __future__ import annotations

import signal
import sys

import typer
from rich.markup import escape
from typer.core import TyperGroup

from mds import __version__
from mds.cli.output import ERROR_EXIT, err_console, json_requested, print_json
from mds.errors import Interrupted, MdsError, missing_extra

__all__ = ["app", "run"]

EXIT_USER_ERROR = 1
EXIT_INTERRUPTED = 130

class MdsGroup(TyperGroup):
    """The one place where MdsError becomes a one-line message (or, with --json, a JSON
    object on stdout) and a non-zero exit."""

    def invoke(self, ctx: typer.Context):
        from mds.core import commit

        before = len(commit.written())
        try:
            return super().invoke(ctx)
        except MdsError as exc:
            _report(ctx, exc, ctx.meta.get(ERROR_EXIT, EXIT_USER_ERROR))
        except ModuleNotFoundError as exc:
            error = missing_extra(exc)
            if error is None:
                raise
            _report(ctx, error, EXIT_USER_ERROR)
        except KeyboardInterrupt as exc:
            _report(ctx, None, EXIT_INTERRUPTED, interrupted(exc, before))


def interrupted(exc: KeyboardInterrupt, before: int = 0) -> str:
    """What an interrupted command left: what the writer said (Interrupted), else the
    outputs put in place since commit.written() held `before` of them (files that are
    still there: a temporary directory's are not), else nothing."""
    if isinstance(exc, Interrupted) and str(exc):
        return str(exc)
    import os

    from mds.core import commit, storage

    done = [
        w
        for w in dict.fromkeys(commit.written()[before:])
        if storage.is_url(w) or os.path.lexists(w)
    ]
    if len(done) == 1:
        return f"the interrupt came after {done[0]} was written whole"
    if done:
        return f"the interrupt came after {len(done)} objects were written whole: " + ", ".join(
            done
        )
    return "nothing was written"


def _report(ctx: typer.Context, exc: MdsError | None, code: int, state: str = ""):
    """Print the error (or, for an interrupt, what it left: `state`) once, on stderr or as
    JSON on stdout, and exit with `code`."""
    if json_requested(ctx):
        kind, message = (
            ("Interrupted", state)
            if exc is None
            else (
                type(exc).__name__,
                str(exc),
            )
        )
        print_json({"error": {"type": kind, "message": message}})
    elif exc is None:
        err_console.print(
            f"[bold red]interrupted[/]: {escape(state)}", highlight=False, soft_wrap=True
        )
    else:
        err_console.print(
            f"[bold red]error:[/] {escape(str(exc))}",
            highlight=False,
            markup=True,
            soft_wrap=True,
        )
    raise typer.Exit(code) from None


HELP = """Plan multi-source training data offline: index sources, plan steps, inspect, replay.

Example:

\b
    mds index sample_data/mds.toml -o build/index
    mds plan sample_data/mds.toml --index build/index -o build/plan.mds
    mds export build/plan.mds -o build/plan.parquet
    mds plan --help
"""

app = typer.Typer(
    cls=MdsGroup,
    name="mds",
    help=HELP,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mds {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", "-V", callback=_version, is_eager=True, help="Show the version."
    ),
) -> None:
    """Plan multi-source training data offline: index sources, plan steps, inspect, replay."""


def _register() -> None:
    from mds.cli import export, index, plan

    app.command("index")(index.index_command)
    app.command("plan")(plan.plan_command)
    app.command("export")(export.export_command)
    from mds.cli import inspect

    app.command("inspect")(inspect.inspect_command)
    from mds.cli import diff, trace, verify

    app.command("verify")(verify.verify_command)
    app.command("trace")(trace.trace_command)
    app.command("diff")(diff.diff_command)
    from mds.cli import calibrate

    app.command("calibrate")(calibrate.calibrate_command)


_register()


def _terminate(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt


def run() -> None:
    """Console-script entry point: SIGTERM unwinds like Ctrl-C, so cleanup always runs."""
    signal.signal(signal.SIGTERM, _terminate)
    app(prog_name="mds")


if __name__ == "__main__":
    sys.exit(run())
