"""Per-row operations on a chunk's [T, N] arrays (one row per step) for the balancer:
gathers and scatters by flat index, and the orders it sorts slots and ranks in, made of
packed unique keys so numpy's fast unstable sort gives one answer on every machine."""

from __future__ import annotations

import numpy as np

__all__ = ["INF", "KEY_BITS", "KEY_COST", "ranks_by_load", "rows_put", "rows_take", "slots_by_cost"]

INF = np.iinfo(np.int64).max
# Costs below 2^KEY_BITS (a plan scales them to at most 2^40) pack into sort keys with room.
KEY_BITS = 41
KEY_COST = np.int64(1 << KEY_BITS)


def rows_take(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """a[t, idx[t, ...]] for each row t of 2-D `a` (np.take_along_axis on the last axis, by
    flat indices: a few times faster)."""
    T, n = a.shape
    return a.reshape(-1)[idx + (n * np.arange(T)).reshape((T,) + (1,) * (idx.ndim - 1))]


def rows_put(out: np.ndarray, idx: np.ndarray, values: np.ndarray) -> None:
    """out[t, idx[t, j]] = values[t, j] for each row t of a contiguous 2-D `out`."""
    T, n = out.shape
    out.reshape(-1)[idx + (n * np.arange(T)).reshape((T,) + (1,) * (idx.ndim - 1))] = values


def slots_by_cost(cost: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Per row: valid slots by cost descending (ties: lower index), then padding.

    A packed unique key lets numpy use its fast unstable sort and still give one answer."""
    T, N = cost.shape
    bits = max(1, (N - 1).bit_length())
    if cost.max(initial=0) < KEY_COST and KEY_BITS + 1 + bits <= 63:
        rank_key = np.where(valid, KEY_COST - 1 - cost, KEY_COST)  # padding sorts last
        return np.argsort((rank_key << bits) | np.arange(N), axis=1)
    return np.argsort(np.where(valid, -cost, 1), axis=1, kind="stable")


def ranks_by_load(load: np.ndarray) -> np.ndarray:
    """Per row: ranks by load, descending (ties: lower rank). A packed unique key (load
    below the row's maximum, then rank) lets numpy use its fast unstable sort."""
    bits = max(1, (load.shape[1] - 1).bit_length())
    top = load.max(axis=1, keepdims=True)
    if load.size and int((top - load.min(axis=1, keepdims=True)).max()) < 1 << (62 - bits):
        return np.argsort(((top - load) << bits) | np.arange(load.shape[1]), axis=1)
    return np.argsort(-load, axis=1, kind="stable")
