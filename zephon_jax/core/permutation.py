"""Keyed pseudorandom permutations of ``[0, n)`` without materializing them.

A four-round Feistel network over ``Z_a x Z_b`` with ``a = ceil(sqrt(n))`` and
``b = ceil(n / a)``: each round adds a keyed hash of one half to the other,
modulo its size, which is a bijection of ``[0, a*b)``. Since ``a*b - n < a + b``,
the rare images outside ``[0, n)`` are walked back in by applying the network
again (cycle walking). Everything is vectorized over numpy arrays with integer
arithmetic only, so results are bit-identical on every machine; once a pipeline
has loaded the compiled kernels (numba), the same network runs compiled
(:mod:`zephon_jax.core.kernels`); the hash, :func:`~zephon_jax.core.compiled_kernels.mix64`,
is the kernels' one, run here over whole arrays.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from zephon_jax.core.compiled_kernels import interpreted, mix64
from zephon_jax.core.kernels import loaded_kernels

_U64 = np.uint64
_ROUNDS = 4
_GOLDEN = 0x9E3779B97F4A7C15
# SplitMix64's finalizer over uint64 arrays: the compiled kernel's source, interpreted.
_mix64 = interpreted(mix64)


@functools.lru_cache(maxsize=65536)
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


@functools.lru_cache(maxsize=8192)
def _round_key_array(key: int) -> np.ndarray:
    keys = np.array(_round_keys(key), _U64)
    keys.flags.writeable = False
    return keys


def _feistel(x: np.ndarray, a: np.uint64, b: np.uint64, round_keys) -> np.ndarray:
    left = x // b
    right = x - left * b
    for r, rk in enumerate(round_keys):
        if r % 2 == 0:
            left = (left + _mix64(right ^ rk) % a) % a
        else:
            right = (right + _mix64(left ^ rk) % b) % b
    return left * b + right


def permute(indices: np.ndarray | int, n: int, key: int) -> np.ndarray:
    """Maps each index in ``[0, n)`` to its image under the permutation named by ``key``.

    The map is a bijection on ``[0, n)`` for every ``n >= 1`` and ``key``; the
    result is an int64 array of the same shape as ``indices``.
    """
    x = np.asarray(indices, dtype=_U64)
    if n <= 1:
        return np.zeros(x.shape, dtype=np.int64)
    a = math.isqrt(n - 1) + 1
    b = -(-n // a)
    a_, b_, limit = _U64(a), _U64(b), _U64(n)
    compiled = loaded_kernels()
    if compiled is not None:  # the same network, element by element
        out = np.empty(x.shape, np.int64)
        compiled.permute(x.reshape(-1), limit, a_, b_, _round_key_array(int(key)), out.reshape(-1))
        return out
    round_keys = _round_keys(int(key))
    shape = x.shape
    x = x.reshape(-1)  # never 0-d: numpy scalars warn where arrays wrap mod 2**64
    x = _feistel(x, a_, b_, round_keys)
    outside = x >= limit
    while outside.any():
        x = np.where(outside, _feistel(x, a_, b_, round_keys), x)
        outside = x >= limit
    return x.astype(np.int64).reshape(shape)
