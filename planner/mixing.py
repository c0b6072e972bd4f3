"""How many samples each source contributes to each step, following the weight schedules.

The state between steps is small (a cursor and a cumulative target per source), so any
step range can be computed from the state at its start; the planner records that state at
every chunk boundary. Two modes, set by the step size:

* samples_per_step: each step's S samples are apportioned by the largest-remainder
  (Hamilton) method applied to every source's deficit against its cumulative target, so
  each cumulative count stays within one sample of S * sum of normalized weights.
* tokens_per_step: each source takes samples, in stream order, while its cumulative
  tokens are below its target; it overshoots by less than one sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mds.executor.errors import PlanError
from mds.planner.plan_config import PlanConfig
from mds.planner.pool import SourcePool
from mds.planner.stream import SourceStream

__all__ = ["MixState", "Mixer", "hamilton"]


@dataclass
class MixState:
    """Per-source cursor (samples consumed), tokens consumed and cumulative target."""

    step: int
    consumed: np.ndarray  # int64 [sources]: stream position
    tokens: np.ndarray  # int64 [sources]
    target: np.ndarray  # float64 [sources]: S or T times the summed normalized weights

    def copy(self) -> MixState:
        return MixState(self.step, self.consumed.copy(), self.tokens.copy(), self.target.copy())


def hamilton(deficit: np.ndarray, total: int) -> np.ndarray:
    """Largest-remainder (Hamilton) apportionment of `total` integers by `deficit`.

    Negative deficits get 0. Ties in the remainder go to the lower source index.
    """
    want = np.maximum(deficit, 0.0)
    base = np.floor(want).astype(np.int64)
    left = total - int(base.sum())
    if left > 0:
        order = np.lexsort((np.arange(len(want)), -(want - base)))
        base[order[:left]] += 1
    elif left < 0:
        # More whole deficits than room (possible only after rounding in earlier steps):
        # take back from the sources that are the least behind.
        order = np.lexsort((np.arange(len(want)), want - base))
        for i in order:
            if left == 0:
                break
            take = min(base[i], -left)
            base[i] -= take
            left += take
    assert int(base.sum()) == total
    return base


class Mixer:
    """Per-step source counts for a plan; see the module docstring."""

    def __init__(self, config: PlanConfig, pools: list[SourcePool], streams: list[SourceStream]):
        self.train = config.train
        self.schedules = [s.weight for s in config.sources]
        self.pools = pools
        self.streams = streams

    def start(self) -> MixState:
        n = len(self.pools)
        return MixState(0, np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.float64))

    def shares(self, a: int, b: int) -> np.ndarray:
        """Normalized weights [b-a, sources]; a source with no samples gets weight 0."""
        steps = np.arange(a, b)
        w = (
            np.stack([s.at(steps) for s in self.schedules], axis=1)
            if self.schedules
            else np.zeros((b - a, 0))
        )
        empty = [i for i, p in enumerate(self.pools) if p.n == 0]
        if empty and (w[:, empty] > 0).any():
            p = self.pools[empty[0]]
            raise PlanError(
                f"source '{p.name}' has weight > 0 but no samples (after `filter` and `overlong`)"
            )
        total = w.sum(axis=1)
        zero = np.flatnonzero(total <= 0)
        if zero.size:
            raise PlanError(
                f"all source weights are 0 at step {a + int(zero[0])}; at least one must be > 0"
            )
        return w / total[:, None]

    def run(self, state: MixState, b: int) -> tuple[np.ndarray, MixState]:
        """Counts [b - state.step, sources] for steps [state.step, b) and the state at b."""
        a = state.step
        shares = self.shares(a, b)
        out = np.zeros((b - a, len(self.pools)), dtype=np.int64)
        state = state.copy()
        if self.train.samples_per_step is not None:
            size = self.train.samples_per_step
            for k in range(b - a):
                state.target += size * shares[k]
                out[k] = hamilton(state.target - state.consumed, size)
                state.consumed += out[k]
        else:
            size = self.train.tokens_per_step
            ends = np.empty_like(shares)
            for k in range(b - a):
                state.target += size * shares[k]
                ends[k] = state.target
            for s, stream in enumerate(self.streams):
                if self.pools[s].n == 0:
                    continue
                taken = stream.take_until(int(state.consumed[s]), int(state.tokens[s]), ends[:, s])
                out[:, s] = np.diff(taken, prepend=0)
                state.tokens[s] += stream.tokens_between(int(state.consumed[s]), int(taken[-1]))
                state.consumed[s] += taken[-1]
        for s, pool in enumerate(self.pools):
            limit = None if pool.max_epochs is None else pool.max_epochs * pool.n
            if limit is not None and state.consumed[s] > limit:
                before = state.consumed[s] - out[:, s].sum()
                step = a + int(np.searchsorted(before + np.cumsum(out[:, s]), limit, side="right"))
                raise PlanError(
                    f"source '{pool.name}' runs out at step {step}: it would need more than "
                    f"max_epochs = {pool.max_epochs} passes over its {pool.n} samples; raise "
                    "`max_epochs`, lower its weight or plan fewer steps"
                )
        state.step = b
        return out, state
