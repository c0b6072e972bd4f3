"""Consoles and helpers shared by the commands: stdout for results, stderr for the rest."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console

__all__ = [
    "ERROR_EXIT",
    "address_option",
    "console",
    "engine_option",
    "err_console",
    "json_option",
    "json_requested",
    "print_json",
]

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

_JSON_KEY = "mds.json"
# A command may set ctx.meta[ERROR_EXIT] to exit with another code on a user error.
ERROR_EXIT = "mds.error_exit"


def print_json(data: Any) -> None:
    """Machine-readable output: plain JSON on stdout, nothing else."""
    print(json.dumps(data, indent=2, sort_keys=True))


def _remember_json(ctx: typer.Context, value: bool) -> bool:
    # ctx.meta is shared by the whole context tree, so the error path in src/mds/cli/main.py sees it.
    if value:
        ctx.meta[_JSON_KEY] = True
    return value


def json_option(help: str) -> Any:
    """The `--json` option of a command; with it, errors are printed as JSON on stdout too."""
    return typer.Option(False, "--json", help=help, callback=_remember_json, is_eager=True)


PLAN_DATA_ROOT = (
    "Where the indexed data lies now (default: $MDS_DATA_ROOT, else the root the plan "
    "records relative to its own directory, as the executor finds it)."
)


def data_root_option(help: str = PLAN_DATA_ROOT) -> Any:
    """`--data-root` of a command that reads a plan's data: where the data lies now."""
    return typer.Option(None, "--data-root", metavar="DIR|URL", help=help)


def engine_option() -> Any:
    """`--engine`: where a command's parallel work runs (mds index, mds plan)."""
    return typer.Option(
        None,
        "--engine",
        metavar="local|ray",
        help="Where the parallel work runs (default: the config's engine, else local).",
    )


def address_option() -> Any:
    """`--address`: the Ray cluster for `--engine ray`."""
    return typer.Option(
        None,
        "--address",
        metavar="auto|local|ray://HOST:PORT",
        help="Ray cluster to run on (implies --engine ray).",
    )


def json_requested(ctx: typer.Context) -> bool:
    """Whether the command being run was given --json."""
    return bool(ctx.meta.get(_JSON_KEY))
