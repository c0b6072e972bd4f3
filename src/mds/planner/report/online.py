"""An online-mixed run's weights over time (docs/online-mixing.md): per window the weights it
was planned with (its segment's footer), what it realised (its segment's per-source
amounts) and the signal that moved the weights after it (the mean loss per source in the
signal log beside the plan). Windows whose segment is not written yet are listed as such:
a run still in progress is not an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mds.core import storage
from mds.core.planfile_reader import PlanReader
from mds.core.segments import first_segment, online_facts, run_facts, segment_path, signals_path
from mds.core.signal_log import SignalLog
from mds.planner.report.plan import realized_amounts

__all__ = ["online_report"]


def online_report(reader: PlanReader, index: str | Path | None = None) -> dict[str, Any] | None:
    """The `online` part of a plan report (docs/inspect.md), None for a plan that is not a
    segment of an online run. `reader` may be any segment of the run."""
    facts = online_facts(reader.footer, reader.path)
    if facts is None:
        return None
    first = first_segment(reader.path, facts.window)
    written = run_facts(first)
    names = [s["name"] for s in reader.footer["sources"]]
    log, log_path = _signals(first)
    means = [w.mean_loss() for w in log.windows] if log is not None else []
    unit = "samples"
    windows = []
    for k in range(facts.windows):
        start, end = facts.bounds(k)
        row: dict[str, Any] = {"window": k, "start": start, "end": end, "written": k < len(written)}
        row["planned"] = [written[k].weights.get(n) for n in names] if row["written"] else None
        row["realized"] = row["amounts"] = None
        if row["written"]:
            with PlanReader(segment_path(first, k)) as seg:
                unit, amounts = realized_amounts(seg, index)
            totals = np.asarray(amounts, dtype=np.float64).sum(axis=0)
            whole = float(totals.sum())
            row["amounts"] = [int(x) for x in totals]
            row["realized"] = [float(x / whole) if whole > 0 else 0.0 for x in totals]
        row["mean_loss"] = _by_name(means[k], log, names) if k < len(means) else None
        windows.append(row)
    return {
        "window_steps": facts.window_steps,
        "windows": facts.windows,
        "steps": facts.steps,
        "written": len(written),
        "sources": names,
        "share_unit": unit,
        "signals": None if log_path is None else str(log_path),
        "signal_windows": 0 if log is None else len(log.windows),
        "per_window": windows,
    }


def _signals(first: Any) -> tuple[SignalLog | None, Any]:
    """The signal log beside segment 0 and its path, (None, None) when there is none."""
    path = signals_path(first)
    if not storage.exists(path):
        return None, None
    return SignalLog.read(path), path


def _by_name(mean: tuple[float | None, ...], log: SignalLog | None, names: list[str]) -> list:
    """A log window's mean losses in the plan's source order (None where not counted)."""
    assert log is not None
    at = dict(zip(log.sources, mean, strict=True))
    return [at.get(n) for n in names]
