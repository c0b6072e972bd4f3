"""Shared scaffolding of the fuzz and security tests: fixed-size hypothesis settings, a
watchdog that turns a hang into a failure, a tally of the cases run and refused, and a FIFO
tripwire that records any open of a file that must not be read.

A plain module (tests/conftest.py puts tests/ on sys.path): `from fuzzing import ...`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

WATCHDOG_SECONDS = 20  # per example; one case takes milliseconds


def fuzz(examples: int) -> settings:
    """Hypothesis settings of one fuzz test: a fixed example count and a deadline."""
    return settings(
        max_examples=examples,
        deadline=timedelta(seconds=5),
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


class Hang(AssertionError):
    pass


@contextlib.contextmanager
def watchdog(seconds: int = WATCHDOG_SECONDS):
    """Fail (instead of stalling) if the body runs longer than `seconds`."""

    def alarm(_signum, _frame):
        raise Hang(f"no answer after {seconds} s: the reader hangs")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


class Tally:
    """Cases run and refused with an MdsError, per test, printed at the end of a module."""

    def __init__(self, what: str):
        self.what = what
        self.counts: dict[str, list[int]] = {}

    def count(self, test: str, refused: bool) -> None:
        tally = self.counts.setdefault(test, [0, 0])
        tally[0] += 1
        tally[1] += refused

    def report(self) -> None:
        cases = ", ".join(f"{k} {n} ({e} refused)" for k, (n, e) in sorted(self.counts.items()))
        print(f"\n{self.what} fuzz cases run:", cases)

    def fixture(self):
        """A module-scoped autouse fixture that prints the tally when the module is done:
        `report_counts = TALLY.fixture()` in a fuzz module."""

        @pytest.fixture(scope="module", autouse=True)
        def report_counts():
            yield
            self.report()

        return report_counts


_OS_OPEN = os.open  # the tripwire's own opens, not the spied one


class Tripwire:
    """A FIFO: the first open of it for reading, by anyone (Python, pyarrow, polars), is
    recorded by a thread blocked opening its write end. It never blocks the reader."""

    def __init__(self, path: Path):
        self.path = path
        if not path.exists():
            os.mkfifo(path)
        self.opened = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._wait, daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        fd = _OS_OPEN(self.path, os.O_WRONLY)  # returns once a reader opened the FIFO
        if not self._closing:
            self.opened.set()
        os.close(fd)  # the reader sees end of file

    def close(self) -> bool:
        """Stop waiting; True if the FIFO was opened."""
        self._closing = True
        fd = _OS_OPEN(self.path, os.O_RDONLY | os.O_NONBLOCK)  # releases the writer
        self._thread.join(10)
        os.close(fd)
        return self.opened.is_set()


# --- structural edits of JSON documents (plan footers, index manifests) ------------------------

DEEP = "__deep_nesting__"  # a value that the test's encoder replaces with very deep nesting


def paths_of(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a JSON tree (dict keys and list indexes), the root excluded."""
    out = []
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for key, child in items:
        out.append((*prefix, key))
        out.extend(paths_of(child, (*prefix, key)))
    return out


def edit(document: dict[str, Any], change: tuple) -> dict[str, Any]:
    """Apply one structural edit (kind, path, *args) to a deep copy of `document`; an edit
    that does not fit the node leaves it unchanged."""
    document = json.loads(json.dumps(document))
    kind, path, *args = change
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    node = parent[key]
    number = isinstance(node, int) and not isinstance(node, bool)
    if kind == "replace":
        parent[key] = args[0]
    elif kind == "shift" and number:
        parent[key] = node + args[0]
    elif kind == "scale" and number:
        parent[key] = node * args[0]
    elif kind == "delete":
        del parent[key]
    elif kind == "duplicate" and isinstance(parent, list):
        parent.insert(key, node)
    elif kind == "duplicate" and isinstance(node, list) and node:
        node.append(node[0])
    elif kind == "swap" and isinstance(node, list) and len(node) > 1:
        j = args[0] % len(node)
        node[0], node[j] = node[j], node[0]
    elif kind == "reverse" and isinstance(node, list):
        node.reverse()
    elif kind == "rekey" and isinstance(parent, dict):
        parent[args[0]] = parent.pop(key)
    return document
