"""Rich progress bars behind the library's Progress callbacks (stderr, hidden off a TTY)."""

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

__all__ = ["ByteProgress", "MicroBatchProgress", "RowProgress", "StepProgress"]


class _Bar:
    """One task with a known total; subclasses choose the columns and the unit."""

    def __init__(self, label: str, enabled: bool = True):
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            *self.columns(),
            TimeRemainingColumn(),
            console=err_console,
            transient=True,
            disable=not enabled or not err_console.is_terminal,
        )
        self._label = label
        self._task = None

    def columns(self) -> tuple:
        return ()

    def __enter__(self):
        self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)

    def _start(self, description: str, total: int) -> None:
        self._task = self._bar.add_task(description, total=total)

    def advance(self, amount: int) -> None:
        if self._task is not None:
            self._bar.advance(self._task, amount)


class ByteProgress(_Bar):
    """Progress over a known number of bytes, e.g. the files `mds index` scans."""

    def columns(self) -> tuple:
        return (DownloadColumn(), TransferSpeedColumn())

    def start(self, total_bytes: int, total_files: int) -> None:
        self._start(f"{self._label} {total_files} files", total_bytes)


class StepProgress(_Bar):
    """Progress over planned steps."""

    def columns(self) -> tuple:
        return (MofNCompleteColumn(),)

    def start(self, total_steps: int) -> None:
        self._start(f"{self._label} steps", total_steps)


class MicroBatchProgress(_Bar):
    """Progress over timed micro-batches (`mds calibrate`'s grid)."""

    def columns(self) -> tuple:
        return (MofNCompleteColumn(),)

    def start(self, total: int) -> None:
        self._start(f"{self._label} micro-batches", total)


class RowProgress(_Bar):
    """Progress over samples read (`content_hashes`)."""

    def columns(self) -> tuple:
        return (MofNCompleteColumn(),)

    def start(self, total: int) -> None:
        self._start(f"{self._label} rows", total)
