"""Plan segments of an online-mixed run (docs/online-mixing.md): segment k plans the steps
of window k with the weights the policy gives it, as a re-plan of segment k-1 at the
window's first step (the code of `mds plan --from --at-step`, plan/derive.py), so every
source's cursor carries over exactly. Each segment is an ordinary plan file whose footer's
`online` object records the weights and the signals it was made from.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mds.core import storage
from mds.core.planfile_reader import PlanReader
from mds.core.segments import OnlineFacts, online_facts, segment_path
from mds.core.signal_log import SignalLog, canonical_bytes
from mds.errors import ConfigError, PlanError
from mds.planner.plan.build import PlanSummary, build_plan, with_overrides
from mds.planner.plan.config import PlanConfig
from mds.planner.plan.policy import weights_for
from mds.planner.plan.schedule import WeightSchedule

__all__ = ["config_digest", "plan_segment", "replay_segments", "windows_of"]


def config_digest(config: PlanConfig) -> str:
    """BLAKE2b-128 of the run's canonical config (all steps, the config's weights) less its
    dp_size, which a run may change at a window's start (the signal log records it): every
    segment records it, so a segment is never planned from another config."""
    canonical = config.canonical()
    del canonical["train"]["dp_size"]
    return hashlib.blake2b(canonical_bytes(canonical), digest_size=16).hexdigest()


def windows_of(config: PlanConfig) -> int:
    assert config.online is not None
    return -(-config.train.steps // config.online.window)


def _initial(config: PlanConfig) -> np.ndarray:
    return np.array([s.weight.weights[0] for s in config.sources], dtype=np.float64)


def _facts(place: Any) -> tuple[OnlineFacts, str]:
    with PlanReader(place) as reader:
        facts = online_facts(reader.footer, place)
        plan_id = reader.plan_id
    if facts is None:
        raise PlanError(f"{place}: not a segment of an online run (no `online` facts)")
    return facts, plan_id


def plan_segment(
    config: PlanConfig,
    plan: Path | str,
    k: int,
    log: SignalLog | None = None,
    **build: Any,
) -> PlanSummary:
    """Plan segment `k` of the online run whose first segment is `plan` (segment k-1 must
    exist, made from this config): window k's steps, with the weights the policy gives it
    from the first k-1 windows of `log`. `build`: build_plan's options (workers, ...)."""
    spec = config.online
    if spec is None:
        raise ConfigError("--segment and --replay need [mixing] online in the config")
    names = tuple(s.name for s in config.sources)
    n = windows_of(config)
    if not 0 <= k < n:
        raise ConfigError(f"--segment {k}: the run has windows 0 to {n - 1}")
    log = log if log is not None else SignalLog("", names, spec.window)
    if log.window_steps != spec.window:
        raise PlanError(
            f"the signal log's windows are {log.window_steps} steps, the config's {spec.window}"
        )
    weights = weights_for(spec, names, _initial(config), log, k)
    digest = config_digest(config)
    used = max(k - 1, 0)
    start, end = k * spec.window, min((k + 1) * spec.window, config.train.steps)
    parent = None
    if k > 0:
        parent = segment_path(plan, k - 1)
        if not storage.exists(parent):
            raise PlanError(
                f"{parent}: window {k - 1}'s segment is missing; segment {k} continues it, so "
                f"plan them in order (-o {plan} alone plans window 0)"
            )
        facts, _ = _facts(parent)
        if facts.config_digest != digest:
            raise PlanError(
                f"{parent} was planned from another config (digest {facts.config_digest}, "
                f"this one {digest}); plan an online run's segments from the config it began with"
            )
        before = dict(zip(names, map(float, weights[k - 1]), strict=True))
        if facts.window != k - 1 or facts.weights != before:
            raise PlanError(
                f"{parent} does not hold window {k - 1} as this signal log makes it (its "
                f"signal digest {facts.signal_digest}); give the log the run wrote"
            )
        if k >= 2:
            _, first_id = _facts(segment_path(plan, 0))
            if log.plan_id != first_id:
                raise PlanError(
                    f"the signal log belongs to the run of plan {log.plan_id}, but "
                    f"{segment_path(plan, 0)} is plan {first_id}"
                )
    online = {
        "window": k,
        "windows": n,
        "window_steps": spec.window,
        "steps": config.train.steps,
        "weights": dict(zip(names, map(float, weights[k]), strict=True)),
        "signal_windows": used,
        "signal_digest": log.digest(used),
        "config_digest": digest,
    }
    sources = tuple(
        replace(s, weight=WeightSchedule("constant", (0,), (float(w),)))
        for s, w in zip(config.sources, weights[k], strict=True)
    )
    dp = log.dp_at(k, config.train.dp_size)
    if dp != config.train.dp_size:  # the run changed its number of ranks (docs/online-mixing.md)
        config = with_overrides(config, dp_size=dp)
    segment = replace(
        config, train=replace(config.train, steps=end), sources=sources, segment=online
    )
    out = segment_path(plan, k)
    if k == 0:
        return build_plan(segment, out, **build)
    return build_plan(segment, out, parent=parent, at_step=start, **build)


def replay_segments(
    config: PlanConfig, plan: Path | str, log: SignalLog, **build: Any
) -> list[PlanSummary]:
    """Plan segment 0 and every segment `log` determines (k up to its windows + 1, at most
    the run's last) at `plan`: with the run's config and index, each is the run's segment,
    byte for byte. Segment 0 must be the plan the log belongs to."""
    first = plan_segment(config, plan, 0, **build)
    if log.plan_id != first.plan_id:
        raise PlanError(
            f"the signal log belongs to the run of plan {log.plan_id}, but this config and "
            f"index make plan {first.plan_id} as segment 0; replay with the run's config and index"
        )
    last = min(windows_of(config) - 1, len(log.windows) + 1)
    out = [first]
    for k in range(1, last + 1):
        out.append(plan_segment(config, plan, k, log, **build))
    return out
