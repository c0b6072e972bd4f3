"""`[mixing] online = {...}`: the online-mixing part of a plan config (docs/online-mixing.md).
Parsed and validated here, every error naming the key, the rule and the value."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from mds.errors import ConfigError
from mds.planner.index.config_file import check_keys

__all__ = ["BUILTIN_POLICIES", "OnlineSpec", "parse_mixing"]

BUILTIN_POLICIES = ("doremi", "bandit")
COMMON_KEYS = ("policy", "window", "floor")
POLICY_KEYS = {
    "doremi": ("step_size", "smoothing", "reference"),
    "bandit": ("step_size", "exploration", "seed"),
}
MIXING_KEYS = ("online",)
DEFAULT_FLOOR = 0.01
DEFAULT_STEP_SIZE = {"doremi": 1.0, "bandit": 0.1}
DEFAULT_SMOOTHING = 0.1
DEFAULT_EXPLORATION = 0.1
# "package.module:function": dotted identifiers, one colon, nothing else (no eval).
CALLABLE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class OnlineSpec:
    """How an online run's weights follow its signals: the policy (a built-in name or
    "package.module:function"), the window in steps, the least share per source, and the
    policy's own knobs (the defaults filled in)."""

    policy: str
    window: int
    floor: float
    step_size: float = 1.0
    smoothing: float = DEFAULT_SMOOTHING
    reference: tuple[tuple[str, float], ...] = ()
    exploration: float = DEFAULT_EXPLORATION
    seed: int = 0

    def describe(self) -> dict[str, Any]:
        """The canonical form the plan's config records (only the policy's own keys)."""
        out: dict[str, Any] = {"policy": self.policy, "window": self.window, "floor": self.floor}
        if self.policy == "doremi":
            out.update(
                step_size=self.step_size,
                smoothing=self.smoothing,
                reference={name: loss for name, loss in self.reference},
            )
        elif self.policy == "bandit":
            out.update(step_size=self.step_size, exploration=self.exploration, seed=self.seed)
        return out


def _float(table: dict[str, Any], key: str, where: str, default: float, lo: float, hi: float,
           open_lo: bool = False) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}`{key}` must be a finite number, got {value!r}")
    if value < lo or value > hi or (open_lo and value == lo):
        rule = f"{'>' if open_lo else '>='} {lo:g}" + (f" and <= {hi:g}" if hi < math.inf else "")
        raise ConfigError(f"{where}`{key}` must be {rule}, got {value!r}")
    return float(value)


def parse_mixing(
    data: dict[str, Any], where: str, sources: list[Any], steps: int, seed: int
) -> OnlineSpec | None:
    """The `[mixing]` table of a plan config (None without `online`). `sources`: the
    parsed [[source]] mix specs (an online run starts from their constant weights)."""
    mixing = data.get("mixing")
    if mixing is None:
        return None
    if not isinstance(mixing, dict):
        raise ConfigError(f"{where}[mixing]: must be a table")
    check_keys(mixing, MIXING_KEYS, f"{where}[mixing]: ")
    table = mixing.get("online")
    if table is None:
        return None
    at = f"{where}[mixing] online: "
    if not isinstance(table, dict):
        raise ConfigError(f"{at}must be a table such as {{ policy = \"doremi\", window = 100 }}")
    policy = table.get("policy")
    if not isinstance(policy, str) or not policy:
        raise ConfigError(
            f"{at}`policy` is required: \"doremi\", \"bandit\" or \"package.module:function\""
        )
    if policy not in BUILTIN_POLICIES and not CALLABLE.match(policy):
        raise ConfigError(
            f"{at}`policy` {policy!r} is neither doremi, bandit nor \"package.module:function\""
        )
    check_keys(table, COMMON_KEYS + POLICY_KEYS.get(policy, ()), at)
    window = table.get("window")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(f"{at}`window` must be an integer >= 1 (steps), got {window!r}")
    if window > steps:
        raise ConfigError(
            f"{at}`window` {window} is longer than the run's {steps} steps; make it at most "
            f"{steps} (or drop [mixing] online for a fixed mix)"
        )
    if not sources:
        raise ConfigError(f"{at}needs at least one [[source]]")
    floor = _float(table, "floor", at, DEFAULT_FLOOR, 0.0, 1.0)
    if floor * len(sources) > 1.0:
        raise ConfigError(
            f"{at}`floor` {floor:g} x {len(sources)} sources exceeds 1; make it at most "
            f"{1.0 / len(sources):g}"
        )
    for mix in sources:
        if mix.weight.kind != "constant":
            raise ConfigError(
                f"{where}[[source]] '{mix.name}': `weight` must be a constant with [mixing] "
                "online (it is the first window's weight; the policy sets the later ones)"
            )
    spec = OnlineSpec(policy=policy, window=window, floor=floor)
    if policy == "doremi":
        return _doremi(table, at, spec, [m.name for m in sources])
    if policy == "bandit":
        seed_value = table.get("seed", seed)
        if isinstance(seed_value, bool) or not isinstance(seed_value, int) or seed_value < 0:
            raise ConfigError(f"{at}`seed` must be an integer >= 0, got {seed_value!r}")
        return OnlineSpec(
            policy=policy,
            window=window,
            floor=floor,
            step_size=_float(table, "step_size", at, DEFAULT_STEP_SIZE["bandit"], 0.0, math.inf,
                             open_lo=True),
            exploration=_float(table, "exploration", at, DEFAULT_EXPLORATION, 0.0, 1.0,
                               open_lo=True),
            seed=seed_value,
        )
    return spec


def _doremi(table: dict[str, Any], at: str, spec: OnlineSpec, names: list[str]) -> OnlineSpec:
    reference = table.get("reference", {})
    if not isinstance(reference, dict):
        raise ConfigError(f"{at}`reference` must be a table of source = loss, got {reference!r}")
    for name, loss in reference.items():
        if name not in names:
            raise ConfigError(
                f"{at}`reference` names source {name!r}, which is not a [[source]] "
                f"(sources: {', '.join(names)})"
            )
        if isinstance(loss, bool) or not isinstance(loss, int | float) or not math.isfinite(loss):
            raise ConfigError(f"{at}`reference.{name}` must be a finite number, got {loss!r}")
    return OnlineSpec(
        policy="doremi",
        window=spec.window,
        floor=spec.floor,
        step_size=_float(table, "step_size", at, DEFAULT_STEP_SIZE["doremi"], 0.0, math.inf,
                         open_lo=True),
        smoothing=_float(table, "smoothing", at, DEFAULT_SMOOTHING, 0.0, 1.0),
        reference=tuple((n, float(reference[n])) for n in names if n in reference),
    )
