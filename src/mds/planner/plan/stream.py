"""A source's sample stream: epoch after epoch, each a fresh seeded permutation.

Stream position q is sample `perm_e(q mod n)` of epoch e = q div n. Any stretch of the
stream can be computed on its own, which is what chunk-parallel planning needs.
"""

from __future__ import annotations

import numpy as np

from mds.planner.plan.permutation import epoch_key, permute
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

    def _key(self, epoch: int) -> tuple[int, ...]:
        key = self._keys.get(epoch)
        if key is None:
            if len(self._keys) > 64:
                self._keys.clear()
            key = self._keys[epoch] = epoch_key(self.seed, self.pool.name, epoch)
        return key

    def positions(self, start: int, count: int) -> np.ndarray:
        """Eligible-set positions of stream positions [start, start + count), int64."""
        n = self.pool.n
        out = np.empty(count, dtype=np.int64)
        q, done = start, 0
        while done < count:
            epoch, offset = divmod(q, n)
            k = min(count - done, n - offset)
            out[done : done + k] = permute(np.arange(offset, offset + k), n, self._key(epoch))
            q += k
            done += k
        return out

    def epoch_of(self, position: int) -> int:
        return position // self.pool.n if self.pool.n else 0

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
            self._mean = max(float(self.pool.lengths.mean()), 1.0) if self.pool.n else 1.0
        mean = self._mean
        block = int(min(_BLOCK, max(16.0, 1.25 * need / mean + 16)))
        while cum[-1] < need:
            lengths = self.pool.lengths[self.positions(start + len(cum) - 1, block)]
            cum = np.concatenate([cum, cum[-1] + np.cumsum(lengths)])
            block *= 2
        return np.searchsorted(cum + tokens, targets, side="left").astype(np.int64)
