"""An online run's segments as its executor sees them: whether the one on disk is the window
the run's log makes it, and planning a missing one in a `python -m mds plan` subprocess.

Kept apart from the executor's walk (online.py) so that module holds iteration, signals and
state, and this one the segments' files and the process that writes them.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from mds.core import storage
from mds.core.planfile_reader import PlanReader
from mds.core.segments import OnlineFacts, online_facts, segment_path
from mds.core.signal_log import SignalLog
from mds.errors import MdsError

__all__ = ["SegmentPlanning", "planning_failure", "segment_problem"]


def planning_failure(output: str, code: int) -> str:
    """The one-line reason of a failed `mds plan --json`: its error's message, else the
    last line it printed (a traceback's), else its exit status."""
    start = output.find('{\n')
    start = start if start >= 0 else output.find("{")
    if start >= 0:
        try:
            return str(json.JSONDecoder().raw_decode(output[start:])[0]["error"]["message"])
        except (ValueError, KeyError, TypeError):
            pass
    lines = [x.strip() for x in output.splitlines() if x.strip()]
    return lines[-1] if lines else f"exit status {code}"


def segment_problem(
    plan: Any, t: int, first: OnlineFacts, log: SignalLog, dp: int
) -> tuple[str | None, OnlineFacts | None]:
    """Why segment t of the run of `plan` on disk is not window t as `log` makes it
    (missing, another window, config, signals or number of ranks `dp`, or the child of
    another plan than segment t-1), None when it is; and its footer's online facts where
    they were read. `first`: segment 0's facts."""
    facts = None
    path = segment_path(plan, t)
    if not storage.exists(path):
        return "missing", facts
    if t > 0 and not storage.exists(segment_path(plan, t - 1)):
        return f"segment {t - 1} is missing", facts
    try:
        with PlanReader(path) as reader:
            facts = online_facts(reader.footer, path)
            planned_dp, lineage = reader.dp, reader.footer.get("lineage") or {}
        if t > 0:
            with PlanReader(segment_path(plan, t - 1)) as reader:
                parent = reader.plan_id
    except MdsError as exc:
        return str(exc), facts
    if facts is None or facts.window != t:
        return f"not window {t} of an online run", facts
    if facts.config_digest != first.config_digest:
        return "planned from another config", facts
    used = facts.signal_windows
    if used > len(log.windows) or facts.signal_digest != log.digest(used):
        return "planned from other signals than this run's log", facts
    if planned_dp != dp:
        return f"planned for dp_size {planned_dp}, the run has {dp} there", facts
    if t > 0 and lineage.get("parent") != parent:
        return f"continues another plan than segment {t - 1}", facts
    return None, facts


class SegmentPlanning:
    """At most one `mds plan CONFIG --segment K` subprocess at a time, its output kept for
    the one-line reason of a failure (`failed[K]`)."""

    def __init__(
        self, command: Sequence[str], config: Path, plan: Any, geometry: Sequence[str],
        args: Sequence[str],
    ):
        self.command, self.config, self.plan = list(command), config, plan
        self.geometry, self.args = list(geometry), list(args)  # args: the user's
        self.failed: dict[int, str] = {}
        self._running: tuple[int, subprocess.Popen, IO[bytes]] | None = None

    @property
    def window(self) -> int | None:
        """The window being planned, if any (not checked for having finished)."""
        return self._running[0] if self._running is not None else None

    def start(self, t: int, signals: Any, dp: int) -> None:
        """Plan window t from the log at `signals` for `dp` ranks (none may be running)."""
        assert self._running is None, self._running[0]
        cmd = [*self.command, "plan", str(self.config), "-o", str(self.plan),
               "--segment", str(t), "--signals", str(signals), *self.geometry,
               "--dp-size", str(dp), *self.args, "--json"]
        out = tempfile.TemporaryFile()  # --json: a summary, or {"error": {...}}
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._running = (t, proc, out)

    def reap(self, block: bool) -> None:
        """Collect the subprocess if it is done (or wait for it, with `block`)."""
        if self._running is None:
            return
        t, proc, out = self._running
        if block:
            proc.wait()
        elif proc.poll() is None:
            return
        self._running = None
        if proc.returncode != 0:
            out.seek(0)
            self.failed[t] = planning_failure(out.read().decode(errors="replace"), proc.returncode)
        out.close()
