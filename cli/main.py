"""The `mds` command: a thin layer over the library; user errors print as one line.

Heavy imports (polars, the planner) happen inside commands so `mds --help` stays fast.
"""

from __future__ import annotations

import signal
import sys

import typer
from rich.markup import escape
from typer.core import TyperGroup

from mds.cli.output import err_console
from mds.executor.errors import MdsError

__all__ = ["app", "run"]

EXIT_USER_ERROR = 1
EXIT_INTERRUPTED = 130


class MdsGroup(TyperGroup):
    """The one place where MdsError becomes a one-line message and a non-zero exit."""

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except MdsError as exc:
            err_console.print(
                f"[bold red]error:[/] {escape(str(exc))}",
                highlight=False,
                markup=True,
                soft_wrap=True,
            )
            raise typer.Exit(EXIT_USER_ERROR) from None
        except KeyboardInterrupt:
            err_console.print("[bold red]interrupted[/]: nothing was written", highlight=False)
            raise typer.Exit(EXIT_INTERRUPTED) from None


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
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"mds {version('mds')}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version."
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
    from mds.cli import diff, verify

    app.command("verify")(verify.verify_command)
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
