"""Seeded random permutations with random access: position i of epoch e -> item index.

A 4-round Feistel network on the smallest even-bit domain >= n, with cycle-walking to stay
inside [0, n). Pure 64-bit integer arithmetic in numpy, so it gives the same result on every
machine and numpy version, needs no O(n) table, and any stretch of an epoch can be computed
alone (what chunk-parallel planning needs).
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["epoch_key", "permute", "splitmix64", "unpermute"]

_ROUNDS = 4
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: a fast, well-distributed 64-bit hash."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def epoch_key(seed: int, source: str, epoch: int) -> tuple[int, ...]:
    """Round keys for one (seed, source, epoch): each epoch gets a fresh permutation."""
    digest = hashlib.blake2b(f"{seed}:{source}:{epoch}".encode(), digest_size=8 * _ROUNDS).digest()
    return tuple(int.from_bytes(digest[8 * i : 8 * i + 8], "little") for i in range(_ROUNDS))


def _feistel(x: np.ndarray, half_bits: int, keys: tuple[int, ...]) -> np.ndarray:
    mask = np.uint64((1 << half_bits) - 1)
    shift = np.uint64(half_bits)
    left, right = x >> shift, x & mask
    for key in keys:
        left, right = right, left ^ (splitmix64(right ^ np.uint64(key)) & mask)
    return (left << shift) | right


def _feistel_inverse(x: np.ndarray, half_bits: int, keys: tuple[int, ...]) -> np.ndarray:
    mask = np.uint64((1 << half_bits) - 1)
    shift = np.uint64(half_bits)
    left, right = x >> shift, x & mask
    for key in reversed(keys):
        left, right = right ^ (splitmix64(left ^ np.uint64(key)) & mask), left
    return (left << shift) | right


def permute(positions: np.ndarray, n: int, keys: tuple[int, ...]) -> np.ndarray:
    """Map positions in [0, n) through the permutation given by `keys`; returns int64."""
    return _cycle_walk(positions, n, keys, _feistel)


def unpermute(items: np.ndarray, n: int, keys: tuple[int, ...]) -> np.ndarray:
    """The inverse of `permute`: the positions in [0, n) that map to `items`; int64. Walks the
    cycle backwards: the values between an item and its position all lie outside [0, n)."""
    return _cycle_walk(items, n, keys, _feistel_inverse)


def _cycle_walk(values: np.ndarray, n: int, keys: tuple[int, ...], cipher) -> np.ndarray:
    """`cipher` (the Feistel network or its inverse) over a power-of-4 domain, restricted to
    [0, n) by cycle-walking: values that fall outside are encrypted again; the domain is
    < 4n, so each pass keeps at most 3/4 of them and the loop ends quickly."""
    values = np.asarray(values, dtype=np.uint64)
    if n <= 1:
        return values.astype(np.int64)
    bits = max(2, (n - 1).bit_length())
    bits += bits & 1
    out = cipher(values, bits // 2, keys)
    outside = np.flatnonzero(out >= np.uint64(n))
    while outside.size:
        out[outside] = cipher(out[outside], bits // 2, keys)
        outside = outside[out[outside] >= np.uint64(n)]
    return out.astype(np.int64)
