"""Putting outputs in place: the hidden temporary names writers use beside what they
become (files and objects alike), SIGINT and SIGTERM held across a commit, and the record
of the outputs this process committed, which an interrupt's message lists.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mds.errors import Interrupted

__all__ = [
    "TMP_MARK",
    "deliver_held",
    "host_tag",
    "is_temp_name",
    "machine_id",
    "note_written",
    "replace_local",
    "signals_held",
    "temp_name",
    "temp_url",
    "written",
]

# Temporaries are `.NAME.tmp-PID-HOST-RANDOM`, beside what they become (files and objects
# alike): hidden names are never data, and no index or plan names one. HOST is host_tag().
TMP_MARK = ".tmp-"
_written: list[str] = []  # outputs this process committed, for the interrupt message


@functools.cache
def machine_id() -> str:
    """What tells this machine and PID namespace apart from another with the same host name
    (containers sharing a node's name see other pids): the boot id and the PID namespace,
    or "" where the system does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def host_tag() -> str:
    """A short hash of the host name and machine_id: a temporary of another container with
    the same host name is another host's, never removed as a dead process's."""
    return hashlib.sha256(f"{socket.gethostname()}/{machine_id()}".encode()).hexdigest()[:6]


def temp_name(name: str) -> str:
    """A hidden, unique name for a temporary of `name`."""
    return f".{name}{TMP_MARK}{os.getpid()}-{host_tag()}-{secrets.token_hex(4)}"


def temp_url(url: str) -> str:
    """A temporary sibling of the object `url`, to upload to before the copy over `url`."""
    parent, _, name = url.rpartition("/")
    return f"{parent}/{temp_name(name)}"


def is_temp_name(name: str) -> bool:
    """Whether the last part of a path or key is a temporary (a writer's file or upload in
    flight, or one a killed writer left)."""
    base = name.rsplit("/", 1)[-1]
    return base.startswith(".") and TMP_MARK in base


def written() -> list[str]:
    """The outputs (objects, files) this process has put in place, oldest first: what an
    interrupt did not undo."""
    return list(_written)


def note_written(where: str | os.PathLike) -> None:
    """Record an output put in place whole (a rename or a copy over its name)."""
    _written.append(os.fspath(where))


@contextmanager
def signals_held() -> Iterator[list[int]]:
    """SIGINT and SIGTERM arriving inside the block are held (listed) instead of acting;
    the caller delivers them after (`deliver_held`). Only the main thread receives signals."""
    held: list[int] = []
    signals = (signal.SIGINT, signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or any(
        signal.getsignal(s) is None for s in signals
    ):
        yield held
        return

    def hold(signum: int, frame: Any) -> None:  # noqa: ARG001
        held.append(signum)

    previous = {s: signal.signal(s, hold) for s in signals}
    try:
        yield held
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def deliver_held(held: list[int], committed: str | None) -> None:
    """Act on the first held signal with its own handler; an interrupt that follows a
    commit says so (`committed`)."""
    if not held:
        return
    try:
        signal.raise_signal(held[0])
    except KeyboardInterrupt:
        if committed is None:
            raise
        raise Interrupted(committed) from None


def replace_local(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """os.replace(tmp, path), noted as written (note_written) with SIGINT/SIGTERM held
    until both are done: an interrupt never falls between a commit and its record."""
    with signals_held() as held:
        os.replace(tmp, path)
        note_written(path)
    deliver_held(held, None)
