"""Rows of integers held as slices of one array: row k is values[starts[k]:ends[k]].

What the Parquet page reader decodes a read's rows into (`formats.parquet.pages`) and what
the executor keeps rows read ahead as (`executor.catalog.early_rows`): one array and two
offset arrays for a read, not a numpy view (~112 bytes) per row, which a row costs only
when it is used.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

__all__ = ["RowSlices", "narrow_ids"]

_U16 = int(np.iinfo(np.uint16).max)


def narrow_ids(values: np.ndarray) -> np.ndarray:
    """`values` as uint16 if all of them fit (token ids of a vocabulary under 65,536: half
    the bytes of int32), else as they are."""
    if values.dtype.kind not in "iu" or values.itemsize <= 2 or not values.size:
        return values
    if values.min() < 0 or values.max() > _U16:
        return values
    return values.astype(np.uint16)


class RowSlices(Sequence):
    """Rows as slices of `values` (row k: values[starts[k]:ends[k]], a view). Slicing the
    rows (`rows[a:b]`) shares the values."""

    __slots__ = ("ends", "starts", "values")

    def __init__(self, values: np.ndarray, starts: np.ndarray, ends: np.ndarray):
        self.values, self.starts, self.ends = values, starts, ends

    @classmethod
    def of_lengths(cls, values: np.ndarray, lengths: np.ndarray) -> RowSlices:
        """Rows that follow each other in `values`, of `lengths` values each."""
        ends = np.cumsum(lengths, dtype=np.int64)
        return cls(values, ends - lengths, ends)

    @classmethod
    def joined(cls, parts: list[tuple[np.ndarray, Sequence[np.ndarray]]], n: int) -> RowSlices:
        """`n` rows put together from `parts`: (the positions of its rows among the `n`, its
        rows: a RowSlices or a list of arrays). The values are copied into one array, at
        the widest of the parts' dtypes."""
        arrays, starts, ends = [], np.zeros(n, np.int64), np.zeros(n, np.int64)
        at = 0
        for where, rows in parts:
            if isinstance(rows, RowSlices):
                arrays.append(rows.values)
                starts[where], ends[where] = rows.starts + at, rows.ends + at
                at += len(rows.values)
            elif len(rows):
                lengths = np.fromiter(map(len, rows), np.int64, len(rows))
                got = cls.of_lengths(np.concatenate(rows), lengths)
                arrays.append(got.values)
                starts[where], ends[where] = got.starts + at, got.ends + at
                at += len(got.values)
        return cls(np.concatenate(arrays), starts, ends)

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, k: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, k: slice) -> RowSlices: ...

    def __getitem__(self, k):
        if isinstance(k, slice):
            return RowSlices(self.values, self.starts[k], self.ends[k])
        return self.values[self.starts[k] : self.ends[k]]

    def __iter__(self) -> Iterator[np.ndarray]:
        values = self.values
        for a, b in zip(self.starts.tolist(), self.ends.tolist(), strict=True):
            yield values[a:b]

    @property
    def nbytes(self) -> int:
        """Bytes the values and the offsets hold (all the values, whichever rows are left)."""
        return self.values.nbytes + self.starts.nbytes + self.ends.nbytes

    def narrow(self) -> RowSlices:
        """The rows with their values as uint16 if all of them fit (`narrow_ids`)."""
        values = narrow_ids(self.values)
        return self if values is self.values else RowSlices(values, self.starts, self.ends)
