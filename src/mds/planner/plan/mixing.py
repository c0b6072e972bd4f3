"""How many samples each source contributes to each step, following the weight schedules.

The state between steps is small (a cursor and a cumulative target per source), so any
step range can be computed from the state at its start; the planner records that state at
every chunk boundary. Two modes, set by the step size:

* samples_per_step: earliest-deadline-first apportionment. Sample m of a source may be
  taken once its cumulative target C reaches m - 1 and must be taken by the step where C
  first exceeds m; each step serves the S pending samples with the earliest deadlines
  (the mandatory ones first), looking ahead in the schedule. EDF is optimal for unit jobs
  with release times and deadlines, and a schedule with every lag within one sample
  always exists (Tijdeman, "The chairman assignment problem", 1980), so every cumulative
  count stays within one sample of S * sum of normalized weights, after every step.
* tokens_per_step: each source takes samples, in stream order, while its cumulative
  tokens are below its target; it overshoots by less than one sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mds.errors import PlanError
from mds.planner.plan.config import PlanConfig
from mds.planner.plan.pool import SourcePool
from mds.planner.plan.stream import SourceStream

__all__ = ["MixState", "Mixer"]

_EPS = 1e-6  # float slack in the bounds; targets are sums of float64 shares
_UNKEPT = "step {step}: cannot keep every source within one sample of its target"
_JOBS = 4  # pending jobs per source and step: its count may move within [C - 1, C + 1]


@dataclass
class MixState:
    """Per-source cursor (samples consumed), tokens consumed and cumulative target."""

    step: int
    consumed: np.ndarray  # int64 [sources]: stream position
    tokens: np.ndarray  # int64 [sources]
    target: np.ndarray  # float64 [sources]: S or T times the summed normalized weights

    def copy(self) -> MixState:
        return MixState(self.step, self.consumed.copy(), self.tokens.copy(), self.target.copy())


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

    def shares(self, a: int, b: int, checked: int | None = None) -> np.ndarray:
        """Normalized weights [b-a, sources]. Steps before `checked` (default b) must be
        valid; later ones are look-ahead only, where an invalid step just adds nothing."""
        checked = b if checked is None else checked
        steps = np.arange(a, b)
        w = (
            np.stack([s.at(steps) for s in self.schedules], axis=1)
            if self.schedules
            else np.zeros((b - a, 0))
        )
        empty = [i for i, p in enumerate(self.pools) if p.n == 0]
        if empty and (w[: checked - a, empty] > 0).any():
            p = self.pools[empty[0]]
            raise PlanError(
                f"source '{p.name}' has weight > 0 but no samples (after `filter` and `overlong`)"
            )
        if empty:
            w[:, empty] = 0.0
        total = w.sum(axis=1)
        zero = np.flatnonzero(total[: checked - a] <= 0)
        if zero.size:
            raise PlanError(
                f"all source weights are 0 at step {a + int(zero[0])}; at least one must be > 0"
            )
        return w / np.where(total > 0, total, 1.0)[:, None]

    def _curve(self, start: np.ndarray, a: int, b: int, checked: int | None = None) -> np.ndarray:
        """Cumulative targets after each step of [a, b): sequential float64 sums from `start`,
        the same additions in the same order whichever step range is asked for."""
        size = self.train.samples_per_step or self.train.tokens_per_step
        rows = np.vstack([start[None, :], size * self.shares(a, b, checked)])
        return np.cumsum(rows, axis=0)[1:]

    def _edf(self, state: MixState, b: int) -> np.ndarray:
        """samples_per_step counts for [state.step, b) (see the module docstring)."""
        a, size, n = state.step, self.train.samples_per_step, len(self.pools)
        end = max(self.train.steps, b)
        out = np.zeros((b - a, n), dtype=np.int64)
        if b == a:
            return out
        horizon = min(end, b + max(64, b - a))
        while True:
            curve = self._curve(state.target, a, horizon, checked=b)
            # Per source, the integer thresholds m its jobs can have in this range, and the
            # first row where the target exceeds each (its deadline); len(curve) = beyond.
            first = np.floor(state.target).astype(np.int64) - 1
            last = np.floor(curve[b - a - 1]).astype(np.int64) + 3
            sizes = last - first + 1
            offsets = np.concatenate([[0], np.cumsum(sizes)])
            deadline = np.concatenate(
                [
                    np.searchsorted(
                        curve[:, s], np.arange(first[s], last[s] + 1) + _EPS, side="right"
                    )
                    for s in range(n)
                ]
            )
            if horizon == end or not (deadline == len(curve)).any():
                break
            horizon = min(end, horizon + 4 * (horizon - a))
        never = np.int64(np.iinfo(np.int64).max - 1)  # due after the last step
        absent = np.int64(np.iinfo(np.int64).max)  # padding: not a job at all
        deadline = np.where(deadline == len(curve), never, deadline)
        deadline = np.append(deadline, absent)
        low = np.ceil(curve[: b - a] - 1 - _EPS).astype(np.int64)  # A >= C - 1
        high = np.floor(curve[: b - a] + 1 + _EPS).astype(np.int64)  # A <= C + 1
        jobs = np.arange(_JOBS)
        consumed = state.consumed.copy()
        for k in range(b - a):
            lo = np.maximum(low[k] - consumed, 0)
            extra = np.maximum(high[k] - consumed, lo) - lo
            room = size - int(lo.sum())
            take = lo
            if room < 0:
                raise PlanError(_UNKEPT.format(step=a + k))
            if room:
                assert int(extra.max()) <= _JOBS
                # Candidate jobs, source-major: the source's m-th sample for the next `extra` m.
                m = (consumed + lo + 1)[:, None] + jobs
                slot = offsets[:-1, None] + (m - first[:, None])
                due = deadline[np.where(jobs < extra[:, None], slot, -1)].ravel()
                # Earliest deadline first; then the source most behind its target; then order.
                pick = np.lexsort(((m - curve[k][:, None]).ravel(), due))[:room]
                if due[pick[-1]] == absent:
                    raise PlanError(_UNKEPT.format(step=a + k))
                take = lo + np.bincount(pick // _JOBS, minlength=n)
            out[k] = take
            consumed += take
        return out

    def run(self, state: MixState, b: int) -> tuple[np.ndarray, MixState]:
        """Counts [b - state.step, sources] for steps [state.step, b) and the state at b."""
        a = state.step
        shares = self.shares(a, b)
        out = np.zeros((b - a, len(self.pools)), dtype=np.int64)
        state = state.copy()
        if self.train.samples_per_step is not None:
            out = self._edf(state, b)
            state.target = self._curve(state.target, a, b)[-1] if b > a else state.target
            state.consumed += out.sum(axis=0)
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
            # an excluded stream's epochs are shorter (plan/stream.py): its cursor counts them
            size = self.streams[s].epoch_size
            limit = None if pool.max_epochs is None else pool.max_epochs * size
            if limit is not None and state.consumed[s] > limit:
                before = state.consumed[s] - out[:, s].sum()
                step = a + int(np.searchsorted(before + np.cumsum(out[:, s]), limit, side="right"))
                raise PlanError(
                    f"source '{pool.name}' runs out at step {step}: it would need more than "
                    f"max_epochs = {pool.max_epochs} passes over its {size} samples; raise "
                    "`max_epochs`, lower its weight or plan fewer steps"
                )
        state.step = b
        return out, state
