"""Shared scaffolding of the fuzz tests: fixed-size hypothesis settings, a watchdog that
turns a hang into a failure, and a tally of the cases run and refused.

A plain module (tests/conftest.py puts tests/ on sys.path): `from fuzzing import ...`.
"""

from __future__ import annotations

import contextlib
import signal
from datetime import timedelta

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
