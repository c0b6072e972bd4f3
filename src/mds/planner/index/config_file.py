"""Reading a TOML config, for the index's keys (index/config.py) and the planner's
(plan/config.py) alike: the file read once (a named pipe too), unknown keys refused with
the closest known one, and paths placed against the config's directory."""

from __future__ import annotations

import difflib
import os
import select
import stat
import tomllib
from pathlib import Path
from typing import Any

from mds.core.storage import is_url
from mds.errors import ConfigError

__all__ = ["check_keys", "load_toml", "place", "read_whole"]


def check_keys(table: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    """Refuse a key of `table` that is not `allowed`: the error (prefixed with `where`) names
    the closest allowed key, else all of them."""
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = (
                f"; did you mean `{close[0]}`?"
                if close
                else f"; expected one of {', '.join(allowed)}"
            )
            raise ConfigError(f"{where}unknown key `{key}`{hint}")


def place(base: Path, text: str | None) -> Path | str | None:
    """A config path resolved against the config's directory; a URL stays as it is."""
    if not text:
        return None
    return text.rstrip("/") if is_url(text) else (base / text).resolve()


def read_whole(path: str | Path) -> bytes:
    """Every byte of `path`, read once. A FIFO (a named pipe, `<(...)`) is waited on with
    poll() on a non-blocking descriptor: Polars installs its SIGINT handler with SA_RESTART,
    so a blocking open() or read() of a pipe nobody writes would never see Ctrl-C, while
    poll() always returns on a signal and lets Python's handler raise KeyboardInterrupt."""
    path = Path(path)
    if not stat.S_ISFIFO(os.stat(path).st_mode):
        return path.read_bytes()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # never blocks, even with no writer
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        chunks: list[bytes] = []
        ended = False  # poll saw the writer hang up
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:  # a writer is connected and has not written yet
                data = None
            if data:
                chunks.append(data)
                continue
            # b"": end of the data once some came or a writer hung up; before that it only
            # means that no writer has opened the pipe yet
            if data == b"" and (chunks or ended):
                return b"".join(chunks)
            events = poller.poll(100)
            ended = any(event & select.POLLHUP for _, event in events)
    finally:
        os.close(fd)


def load_toml(path: str | Path) -> dict[str, Any]:
    """The TOML config at `path`, read once (see read_whole)."""
    path = Path(path)
    try:
        text = read_whole(path).decode("utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: cannot read config ({exc})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from None
