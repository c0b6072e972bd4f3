"""Online mixing policies: what the weights of window k are, from the signals of the
windows before it (docs/online-mixing.md). A pure function of the config, the initial
weights and the signal log, evaluated window after window from window 0, so a replay
computes the same weights bit for bit.

Window 0 and window 1 train with the config's weights: window k is planned while window
k-1 trains, from the signals of windows 0..k-2 (none is complete before window 1 ends).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mds.core.signal_log import SignalLog, WindowSignal
from mds.errors import PlanError
from mds.planner.plan.online_config import OnlineSpec

__all__ = ["History", "SignalView", "apply_floor", "check_weights", "on_grid", "weights_for"]


@dataclass(frozen=True)
class SignalView:
    """One window's signal by source name, as a callable policy sees it."""

    window: int
    steps: tuple[int, int]
    loss_sum: dict[str, float]
    count: dict[str, float]
    mean_loss: dict[str, float | None]


@dataclass(frozen=True)
class History:
    """What a policy deciding window `window` knows: the sources, the signals of windows
    0..window-2 and the weights of windows 0..window-1 (by source name)."""

    sources: tuple[str, ...]
    signals: tuple[SignalView, ...]
    weights: tuple[dict[str, float], ...]


def _view(signal: WindowSignal, names: tuple[str, ...]) -> SignalView:
    return SignalView(
        signal.window,
        (signal.start, signal.end),
        dict(zip(names, signal.loss_sum, strict=True)),
        dict(zip(names, signal.count, strict=True)),
        dict(zip(names, signal.mean_loss(), strict=True)),
    )


def check_weights(raw: Any, names: tuple[str, ...], what: str) -> np.ndarray:
    """A policy's (or the config's) weights as a normalized float64 array in source order:
    a mapping naming every source with a finite number >= 0, not all 0."""
    if not isinstance(raw, Mapping):
        raise PlanError(f"{what}: weights must be a mapping source -> weight, got {type(raw).__name__}")
    extra = sorted(set(map(str, raw)) - set(names))
    if extra:
        raise PlanError(f"{what}: weight for {extra[0]!r}, which is not a source of the plan")
    out = np.zeros(len(names))
    for i, name in enumerate(names):
        if name not in raw:
            raise PlanError(f"{what}: no weight for source {name!r}")
        value = raw[name]
        if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
            raise PlanError(f"{what}: weight of {name!r} must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise PlanError(f"{what}: weight of {name!r} must be finite and >= 0, got {value!r}")
        out[i] = float(value)
    total = out.sum()
    if not total > 0 or not math.isfinite(total):
        raise PlanError(f"{what}: the weights add up to {total!r}; at least one must be > 0")
    return out / total


def apply_floor(weights: np.ndarray, floor: float) -> np.ndarray:
    """Normalized weights with every share at least `floor` (floor x n <= 1): the shares
    under it are raised to it and the others scaled down to make room, so the ones above it
    keep their ratios."""
    w = weights / weights.sum()
    low = np.zeros(len(w), dtype=bool)
    while True:  # at most n rounds: each adds a source to `low`
        rest = 1.0 - floor * low.sum()
        free = w[~low].sum()
        out = np.where(low, floor, w * (rest / free) if free > 0 else rest / max((~low).sum(), 1))
        new_low = low | (out < floor)
        if (new_low == low).all():
            return out
        low = new_low


GRID = 2.0**-32  # built-in policies' weights are multiples of this (see on_grid)


def on_grid(weights: np.ndarray) -> np.ndarray:
    """`weights` rounded to multiples of 2^-32. exp and log may differ in their last bit
    between CPUs and numpy builds; rounded, the weights a replay computes are the run's
    unless a value lies within an ulp of a grid midpoint (about 1 in 2^20). The rest of
    the arithmetic (+, *, /) is exact-rounded IEEE, the same everywhere."""
    return np.round(weights / GRID) * GRID


def weights_for(spec: OnlineSpec, names: tuple[str, ...], initial: np.ndarray, log: SignalLog,
                k: int) -> list[np.ndarray]:
    """The weights of windows 0..k, each a normalized array in source order, from the
    config's `initial` weights and the first k-1 windows of `log` (which must hold them)."""
    assert k >= 0, k
    if len(log.windows) < max(k - 1, 0):
        raise PlanError(
            f"window {k} is planned from the signals of windows 0..{k - 2}, but the signal "
            f"log holds {len(log.windows)} windows"
        )
    if tuple(log.sources) != names:
        raise PlanError(
            f"the signal log's sources ({', '.join(log.sources)}) are not the plan's "
            f"({', '.join(names)})"
        )
    first = apply_floor(initial, spec.floor)
    out = [first]
    if k >= 1:
        out.append(first)
    for j in range(2, k + 1):
        out.append(_next(spec, names, j, log.windows[: j - 1], out))
    return out


def _next(spec: OnlineSpec, names: tuple[str, ...], k: int, signals: list[WindowSignal],
          weights: list[np.ndarray]) -> np.ndarray:
    """Window k's weights from the signals of windows 0..k-2 and the weights of 0..k-1."""
    what = f"[mixing] online policy {spec.policy!r} at window {k}"
    if spec.policy == "doremi":
        from mds.planner.plan.policy_doremi import doremi

        raw = on_grid(doremi(weights[-1], signals[-1], names, spec))
    elif spec.policy == "bandit":
        from mds.planner.plan.policy_bandit import bandit

        raw = on_grid(bandit(weights, signals, spec))
    else:
        from mds.planner.plan.policy_callable import call_policy

        history = History(
            names,
            tuple(_view(s, names) for s in signals),
            tuple(dict(zip(names, map(float, w), strict=True)) for w in weights),
        )
        raw = call_policy(spec.policy, k, history, what)
    if isinstance(raw, np.ndarray):
        raw = dict(zip(names, map(float, raw), strict=True))
    return apply_floor(check_weights(raw, names, what), spec.floor)
