"""Consoles and helpers shared by the commands: stdout for results, stderr for the rest."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

__all__ = ["console", "err_console", "print_json"]

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def print_json(data: Any) -> None:
    """Machine-readable output: plain JSON on stdout, nothing else."""
    print(json.dumps(data, indent=2, sort_keys=True))
