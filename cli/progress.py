"""A rich progress bar behind the library's Progress callbacks (stderr, hidden off a TTY)."""

from __future__ import annotations

from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from mds.cli.output import err_console

__all__ = ["ByteProgress", "StepProgress"]


class ByteProgress:
    """Progress over a known number of bytes, e.g. the files `mds index` scans."""

    def __init__(self, label: str, enabled: bool = True):
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=err_console,
            transient=True,
            disable=not enabled or not err_console.is_terminal,
        )
        self._label = label
        self._task = None

    def __enter__(self) -> ByteProgress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)

    def start(self, total_bytes: int, total_files: int) -> None:
        self._task = self._bar.add_task(f"{self._label} {total_files} files", total=total_bytes)

    def advance(self, nbytes: int) -> None:
        if self._task is not None:
            self._bar.advance(self._task, nbytes)


class StepProgress:
    """Progress over planned steps."""

    def __init__(self, label: str, enabled: bool = True):
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=err_console,
            transient=True,
            disable=not enabled or not err_console.is_terminal,
        )
        self._label = label
        self._task = None

    def __enter__(self) -> StepProgress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)

    def start(self, total_steps: int) -> None:
        self._task = self._bar.add_task(f"{self._label} steps", total=total_steps)

    def advance(self, steps: int) -> None:
        if self._task is not None:
            self._bar.advance(self._task, steps)
