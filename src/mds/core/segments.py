"""Where an online run's files lie and what a segment's footer says it was made from
(docs/online-mixing.md): segment 0 is the plan itself, segment k a plan file beside it,
the signal log a JSON file beside it. Shared by the planner, which writes them, and the
executor, which reads them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mds.core import storage
from mds.core.planfile_reader import PlanReader
from mds.errors import PlanError

__all__ = [
    "OnlineFacts",
    "first_segment",
    "online_facts",
    "run_facts",
    "segment_path",
    "signals_path",
    "window_of",
]


def _split(plan: str | os.PathLike) -> tuple[str, str]:
    """The plan's place without its suffix, and the suffix (".mds", or "")."""
    text = str(plan)
    head, _, name = text.rpartition("/") if storage.is_url(text) else (
        str(Path(text).parent), "/", Path(text).name
    )
    stem, dot, suffix = name.rpartition(".")
    if not dot or not stem:
        stem, suffix = name, ""
    else:
        suffix = "." + suffix
    return f"{head}/{stem}", suffix


def segment_path(plan: str | os.PathLike, k: int) -> Any:
    """Segment k of the online run whose first segment is `plan`: the plan itself for
    k = 0, else `STEM.wKKKKK.SUFFIX` beside it (a Path, or a URL string)."""
    assert k >= 0, k
    if k == 0:
        return str(plan) if storage.is_url(plan) else Path(plan)
    stem, suffix = _split(plan)
    out = f"{stem}.w{k:05d}{suffix}"
    return out if storage.is_url(plan) else Path(out)


def first_segment(plan: str | os.PathLike, k: int) -> Any:
    """Segment 0 of the run whose segment k is `plan` (the inverse of `segment_path`)."""
    if k == 0:
        return str(plan) if storage.is_url(plan) else Path(plan)
    text, mark = str(plan), f".w{k:05d}"
    head, found, tail = text.rpartition(mark)
    first = head + tail
    if not found or str(segment_path(first, k)) != text:
        _, suffix = _split(plan)
        raise PlanError(f"{plan}: window {k} of an online run is named STEM{mark}{suffix}")
    return first if storage.is_url(plan) else Path(first)


def signals_path(plan: str | os.PathLike) -> Any:
    """The run's signal log, `STEM.signals.json` beside the plan."""
    stem, _ = _split(plan)
    out = f"{stem}.signals.json"
    return out if storage.is_url(plan) else Path(out)


@dataclass(frozen=True)
class OnlineFacts:
    """A segment footer's `online` object: which window it plans, the run's geometry, the
    weights it was planned with and the signals they came from."""

    window: int
    windows: int
    window_steps: int
    steps: int
    weights: dict[str, float]
    signal_windows: int
    signal_digest: str
    config_digest: str

    def bounds(self, k: int) -> tuple[int, int]:
        """Steps [start, end) of window k."""
        return k * self.window_steps, min((k + 1) * self.window_steps, self.steps)


def online_facts(footer: Mapping[str, Any], where: Any) -> OnlineFacts | None:
    """The footer's online facts, None for a plan that is not a segment of an online run."""
    raw = footer.get("online")
    if raw is None:
        return None
    try:
        return OnlineFacts(
            window=int(raw["window"]),
            windows=int(raw["windows"]),
            window_steps=int(raw["window_steps"]),
            steps=int(raw["steps"]),
            weights={str(k): float(v) for k, v in raw["weights"].items()},
            signal_windows=int(raw["signal_windows"]),
            signal_digest=str(raw["signal_digest"]),
            config_digest=str(raw["config_digest"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        raise PlanError(f"{where}: corrupt plan (its `online` facts are damaged)") from None


def window_of(step: int, window_steps: int) -> int:
    """The window holding `step`."""
    return step // window_steps


def run_facts(plan: str | os.PathLike) -> list[OnlineFacts]:
    """The facts of every segment of the run whose first segment is `plan`, in window
    order, up to the first one not written yet: the weights over time, from the footers
    alone (no torch, no polars)."""
    out: list[OnlineFacts] = []
    while True:
        path = segment_path(plan, len(out))
        if not storage.exists(path):
            return out
        with PlanReader(path) as reader:
            facts = online_facts(reader.footer, path)
        if facts is None or facts.window != len(out):
            raise PlanError(f"{path}: not window {len(out)} of an online run")
        out.append(facts)
        if len(out) == facts.windows:
            return out
