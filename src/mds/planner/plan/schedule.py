"""Weight schedules over training steps: a constant, piecewise-linear points, or stages.

A schedule is evaluated at integer steps; weights are relative and normalized per step by
the mixing stage, so only their ratios matter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mds.errors import ConfigError

__all__ = ["WeightSchedule", "parse_schedule"]


@dataclass(frozen=True)
class WeightSchedule:
    """`kind` is "constant", "linear" (interpolate between points) or "stages" (step function).

    Before the first point the first weight holds, after the last point the last one.
    """

    kind: str
    steps: tuple[int, ...]
    weights: tuple[float, ...]

    def at(self, steps: np.ndarray) -> np.ndarray:
        """Weights at the given integer steps, as float64."""
        steps = np.asarray(steps, dtype=np.float64)
        xs = np.asarray(self.steps, dtype=np.float64)
        ys = np.asarray(self.weights, dtype=np.float64)
        if self.kind == "constant":
            return np.full(steps.shape, ys[0])
        if self.kind == "linear":
            return np.interp(steps, xs, ys)
        idx = np.searchsorted(xs, steps, side="right") - 1
        return ys[np.clip(idx, 0, len(ys) - 1)]

    def describe(self) -> Any:
        if self.kind == "constant":
            return self.weights[0]
        return {
            ("points" if self.kind == "linear" else "stages"): [
                list(p) for p in zip(self.steps, self.weights, strict=True)
            ]
        }


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    if value < 0:
        raise ConfigError(f"{where} must be >= 0, got {value!r}")
    return float(value)


def _points(raw: Any, where: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where} must be a non-empty list of [step, weight] pairs")
    steps, weights = [], []
    for i, point in enumerate(raw):
        if not (isinstance(point, list) and len(point) == 2):
            raise ConfigError(f"{where}[{i}] must be a [step, weight] pair, got {point!r}")
        step, weight = point
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError(f"{where}[{i}]: step must be an integer >= 0, got {step!r}")
        if steps and step <= steps[-1]:
            raise ConfigError(
                f"{where}[{i}]: steps must be strictly increasing, got {step} after {steps[-1]}"
            )
        steps.append(step)
        weights.append(_number(weight, f"{where}[{i}]: weight"))
    return tuple(steps), tuple(weights)


def parse_schedule(raw: Any, where: str) -> WeightSchedule:
    """`weight = 0.3`, `weight = [[0, 1.0], [1000, 0.2]]` (linear), or a table with
    `points = [...]` (linear) or `stages = [[0, 1.0], [500, 0.2]]` (held until the next)."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return WeightSchedule("constant", (0,), (_number(raw, where),))
    if isinstance(raw, list):
        return WeightSchedule("linear", *_points(raw, where))
    if isinstance(raw, dict):
        keys = sorted(raw)
        if keys == ["points"]:
            return WeightSchedule("linear", *_points(raw["points"], f"{where}.points"))
        if keys == ["stages"]:
            return WeightSchedule("stages", *_points(raw["stages"], f"{where}.stages"))
        raise ConfigError(
            f"{where} table must have exactly one key, `points` or `stages`; got {', '.join(keys) or 'none'}"
        )
    raise ConfigError(
        f"{where} must be a number, a list of [step, weight] points, or a table with `points` or `stages`; got {raw!r}"
    )
