"""A source's sample stream: epoch after epoch, each a fresh seeded permutation.

Stream position q is sample `perm_e(q mod n)` of epoch e = q div n. Any stretch of the
stream can be computed on its own, which is what chunk-parallel planning needs.

A stream with excluded samples (`mds plan --exclude`, docs/plan-format.md) is the same
stream with those samples left out of every epoch: position q is the (q mod m)-th kept
sample of epoch q div m in the epoch's own order (m = n - excluded), so every other
sample keeps its place relative to the others.
"""

from __future__ import annotations

import numpy as np

from mds.planner.plan.permutation import epoch_key, permute, unpermute
from mds.planner.plan.pool import SourcePool

__all__ = ["SourceStream"]

_BLOCK = 1 << 16


class SourceStream:
    """Positions in the eligible set (and their lengths) for stream positions [q, q + k)."""

    def __init__(self, pool: SourcePool, seed: int):
        self.pool = pool
        self.seed = seed
        self._keys: dict[int, tuple[int, ...]] = {}
        self._mean: float | None = None  # mean length, computed once (a pass over the pool)
        self.excluded = np.zeros(0, np.int64)  # sorted eligible positions left out
        self._gaps: dict[int, np.ndarray] = {}  # per epoch: excluded offsets minus their rank

    def exclude(self, positions: np.ndarray) -> None:
        """Leave the eligible positions `positions` out of every epoch (see module docstring)."""
        self.excluded = np.unique(np.asarray(positions, np.int64))
        if self.pool.n and len(self.excluded) >= self.pool.n:
            raise ValueError(f"source '{self.pool.name}': every sample is excluded")
        self._gaps.clear()
        self._mean = None

    @property
    def epoch_size(self) -> int:
        """Samples per epoch: the eligible ones that are not excluded."""
        return self.pool.n - len(self.excluded)

    def offsets(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        """Where eligible positions `positions` lie in epoch `epoch` of the stream without
        exclusions (offsets in [0, n))."""
        return unpermute(np.asarray(positions, np.int64), self.pool.n, self._key(epoch))

    def _excluded_offsets(self, epoch: int) -> np.ndarray:
        """Sorted offsets of epoch `epoch` (raw, in [0, n)) that hold an excluded sample."""
        return np.sort(unpermute(self.excluded, self.pool.n, self._key(epoch)))

    def _raw_offsets(self, epoch: int, kept: np.ndarray) -> np.ndarray:
        """Raw offsets in epoch `epoch` of its kept offsets `kept` (a select over the gaps)."""
        gaps = self._gaps.get(epoch)
        if gaps is None:
            if len(self._gaps) > 64:
                self._gaps.clear()
            off = self._excluded_offsets(epoch)
            gaps = self._gaps[epoch] = off - np.arange(len(off))
        return kept + np.searchsorted(gaps, kept, side="right")

    def raw_position(self, position: int) -> int:
        """The position of the same draw in the stream without exclusions."""
        m = self.epoch_size
        if not len(self.excluded) or not m:
            return position
        epoch, offset = divmod(position, m)
        return epoch * self.pool.n + int(self._raw_offsets(epoch, np.array([offset]))[0])

    def position_of_raw(self, raw: int) -> int:
        """This stream's position of the first kept draw at or after `raw`, a position of
        the stream without exclusions: where a cursor of that stream continues here."""
        n = self.pool.n
        if not len(self.excluded) or not n:
            return raw
        epoch, offset = divmod(raw, n)
        before = int(np.searchsorted(self._excluded_offsets(epoch), offset, side="left"))
        return epoch * self.epoch_size + offset - before

    def _key(self, epoch: int) -> tuple[int, ...]:
        key = self._keys.get(epoch)
        if key is None:
            if len(self._keys) > 64:
                self._keys.clear()
            key = self._keys[epoch] = epoch_key(self.seed, self.pool.name, epoch)
        return key

    def positions(self, start: int, count: int) -> np.ndarray:
        """Eligible-set positions of stream positions [start, start + count), int64."""
        n, m = self.pool.n, self.epoch_size
        out = np.empty(count, dtype=np.int64)
        q, done = start, 0
        while done < count:
            epoch, offset = divmod(q, m)
            k = min(count - done, m - offset)
            raw = np.arange(offset, offset + k)
            if len(self.excluded):
                raw = self._raw_offsets(epoch, raw)
            out[done : done + k] = permute(raw, n, self._key(epoch))
            q += k
            done += k
        return out

    def epoch_of(self, position: int) -> int:
        return position // self.epoch_size if self.epoch_size else 0

    def tokens_between(self, start: int, count: int) -> int:
        return int(self.pool.lengths[self.positions(start, count)].sum()) if count else 0

    def take_until(self, start: int, tokens: int, targets: np.ndarray) -> np.ndarray:
        """For each target (non-decreasing), the fewest samples from `start` after which the
        source's cumulative tokens (`tokens` so far) reach it; int64 counts from `start`."""
        need = float(targets.max()) - tokens if targets.size else 0.0
        cum = np.zeros(1, dtype=np.int64)
        # First block sized from the mean length (doubling after): a fixed 2^16 start made
        # small sources walk thousands of epochs per call. Same result, only fewer samples read.
        if self._mean is None:
            self._mean = max(float(self.pool.lengths.mean()), 1.0) if self.epoch_size else 1.0
        mean = self._mean
        block = int(min(_BLOCK, max(16.0, 1.25 * need / mean + 16)))
        while cum[-1] < need:
            lengths = self.pool.lengths[self.positions(start + len(cum) - 1, block)]
            cum = np.concatenate([cum, cum[-1] + np.cumsum(lengths)])
            block *= 2
        return np.searchsorted(cum + tokens, targets, side="left").astype(np.int64)
