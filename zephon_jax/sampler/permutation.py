"""Keyed pseudorandom permutations of ``[0, n)`` without materializing them.

An unbalanced Feistel network over the smallest number of bits covering ``n``,
with cycle walking to stay inside ``[0, n)`` (the domain is at most ``2n``, so
one or two passes suffice on average). Everything is vectorized over numpy
arrays and uses integer arithmetic only, so results are bit-identical on every
machine.
"""

from __future__ import annotations

import functools

import numpy as np

_U64 = np.uint64
_ROUNDS = 4
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = _U64(0xBF58476D1CE4E5B9)
_M2 = _U64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer: a bijective avalanche hash of uint64 arrays (wraps mod 2**64)."""
    x = (x ^ (x >> _U64(30))) * _M1
    x = (x ^ (x >> _U64(27))) * _M2
    return x ^ (x >> _U64(31))


def derive_key(*parts: int) -> int:
    """Hashes integers (seeds, lane ids, epochs) into one 64-bit key."""
    h = np.array([_GOLDEN], dtype=_U64)
    for part in parts:
        h = _mix64(h ^ np.array([int(part) & 0xFFFFFFFFFFFFFFFF], dtype=_U64))
        h = h + np.array([_GOLDEN], dtype=_U64)
    return int(_mix64(h)[0])


def hash_u64(values: np.ndarray, key: int) -> np.ndarray:
    """Keyed 64-bit hash of each value in ``values``."""
    return _mix64(np.asarray(values, dtype=_U64) ^ _U64(key))


@functools.lru_cache(maxsize=8192)
def _round_keys(key: int) -> tuple[np.uint64, ...]:
    return tuple(_U64(derive_key(key, r)) for r in range(_ROUNDS))


def _feistel(x: np.ndarray, bits: int, round_keys: tuple[np.uint64, ...]) -> np.ndarray:
    # x = hi * 2**lo_bits + lo; each round maps (hi, lo) -> (lo, hi ^ F(lo)), swapping widths.
    hi_bits, lo_bits = bits // 2, bits - bits // 2
    for rk in round_keys:
        lo = x & _U64((1 << lo_bits) - 1)
        hi = x >> _U64(lo_bits)
        f = _mix64(lo ^ rk) >> _U64(64 - hi_bits)
        x = (lo << _U64(hi_bits)) | (hi ^ f)
        hi_bits, lo_bits = lo_bits, hi_bits
    return x


def permute(indices: np.ndarray | int, n: int, key: int) -> np.ndarray:
    """Maps each index in ``[0, n)`` to its image under the permutation named by ``key``.

    The map is a bijection on ``[0, n)`` for every ``n >= 1`` and ``key``; the
    result is an int64 array of the same shape as ``indices``.
    """
    x = np.asarray(indices, dtype=_U64)
    if n <= 1:
        return np.zeros(x.shape, dtype=np.int64)
    bits = max(2, (int(n) - 1).bit_length())
    round_keys = _round_keys(int(key))
    limit = _U64(n)
    x = _feistel(x, bits, round_keys)
    outside = x >= limit
    while outside.any():
        x = np.where(outside, _feistel(x, bits, round_keys), x)
        outside = x >= limit
    return x.astype(np.int64)
