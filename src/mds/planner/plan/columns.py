"""A pool's per-position columns that are computed when read instead of held per index row.

The planner reads a pool's rows and costs only at the positions it plans (a chunk's samples)
and through the largest raw cost (the quantization scale). Holding them per eligible row
would cost 20 bytes a row (uint32 rows, float64 raw and int64 integer costs) for nothing.
Each column here indexes like a read-only array: `column[pos]` gives exactly what the whole
column, made first, would give at `pos` (the same operations, element by element), and
`np.asarray(column)` makes the whole column, for tools and tests.
"""

from __future__ import annotations

import numpy as np

__all__ = ["AllRows", "LengthCosts", "QuantizedCosts"]

# Rows per block where a whole column is made (np.asarray, max with a negative coefficient).
_BLOCK = 1 << 20


class _Column:
    """Length, shape and whole-column conversion; subclasses define dtype and __getitem__."""

    dtype: np.dtype

    def __init__(self, n: int):
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, pos) -> np.ndarray:
        raise NotImplementedError

    @property
    def shape(self) -> tuple[int]:
        return (self._n,)

    @property
    def size(self) -> int:
        return self._n

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.empty(self._n, dtype=self.dtype)
        for a in range(0, self._n, _BLOCK):
            out[a : a + _BLOCK] = self[a : a + _BLOCK]
        return out if dtype is None else out.astype(dtype)

    def tolist(self) -> list:
        return np.asarray(self).tolist()


class AllRows(_Column):
    """The rows of a pool that keeps every index row: position p is row p."""

    def __init__(self, n: int, dtype):
        super().__init__(n)
        self.dtype = np.dtype(dtype)

    def __getitem__(self, pos) -> np.ndarray:
        if isinstance(pos, slice):
            return np.arange(*pos.indices(self._n), dtype=self.dtype)
        p = np.asarray(pos)
        if p.dtype == bool:
            return np.flatnonzero(p).astype(self.dtype)
        p = np.where(p < 0, p + self._n, p)
        if p.size and (p.min() < 0 or p.max() >= self._n):
            raise IndexError(f"position out of range for {self._n} rows")
        return p.astype(self.dtype)


class LengthCosts(_Column):
    """Raw costs a*L + b*L*L (+ d, a per-sample constant, when set) (float64) of each
    position, from the pool's lengths."""

    dtype = np.dtype(np.float64)

    def __init__(self, lengths: np.ndarray, a: float, b: float, d: float = 0.0):
        super().__init__(len(lengths))
        self.lengths, self.a, self.b, self.d = lengths, a, b, d

    def _cost(self, L):
        # d = 0 adds nothing, not even a rounding step: costs without it keep their bits.
        cost = self.a * L + self.b * L * L
        return cost + self.d if self.d else cost

    def __getitem__(self, pos) -> np.ndarray:
        return self._cost(np.asarray(self.lengths[pos], dtype=np.float64))

    def max(self) -> float:
        """The largest raw cost. With a, b, d >= 0 each rounded operation of a*L + b*L*L + d
        is non-decreasing in L >= 0, so that is the cost of the longest sample."""
        if not self._n:
            raise ValueError("max of an empty pool's costs")
        if self.a >= 0 and self.b >= 0 and self.d >= 0:
            L = np.float64(self.lengths.max())  # the same float64 operations as __getitem__
            return float(self._cost(L))
        return max(float(self[a : a + _BLOCK].max()) for a in range(0, self._n, _BLOCK))


class QuantizedCosts(_Column):
    """Integer costs (int64) of each position: round(raw * scale), at least 1 for a
    non-empty sample; `raw` is an array or a LengthCosts."""

    dtype = np.dtype(np.int64)

    def __init__(self, raw, lengths: np.ndarray, scale: float):
        super().__init__(len(lengths))
        self.raw, self.lengths, self.scale = raw, lengths, scale

    def __getitem__(self, pos) -> np.ndarray:
        q = np.rint(np.asarray(self.raw[pos]) * self.scale).astype(np.int64)
        return np.where((q == 0) & (np.asarray(self.lengths[pos]) > 0), 1, q)
