"""Keyed permutations: ``permute`` is a bijection on ``[0, n)`` for every ``n`` and key,
deterministic per key, the same compiled and interpreted; ``derive_key`` and
``hash_u64`` are keyed hashes."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from pipelines import kernels_set

from zephon_jax.core import kernels
from zephon_jax.core.permutation import derive_key, hash_u64, permute


@pytest.fixture(params=["interpreted", "compiled"])
def network(request):
    """Runs the test with the network interpreted (numpy) or compiled (numba)."""
    with kernels_set(request.param == "compiled"):  # True raises without numba
        assert (kernels.loaded_kernels() is not None) == (request.param == "compiled")
        yield request.param


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 10, 16, 17, 100, 257, 1000])
@pytest.mark.parametrize("key", [0, 1, 2**63 + 5])
def test_permute_is_a_bijection_on_range_n(network, n, key):
    image = permute(np.arange(n), n, key)
    assert image.dtype == np.int64 and image.shape == (n,)
    assert sorted(image.tolist()) == list(range(n))


def test_permute_of_one_is_zero_and_keeps_the_shape():
    assert permute(np.zeros((2, 3), np.int64), 1, 9).tolist() == [[0] * 3] * 2
    assert permute(0, 1, 9).shape == ()


def test_permute_is_deterministic_per_key_and_differs_between_keys(network):
    n = 101
    first = permute(np.arange(n), n, 42)
    assert np.array_equal(first, permute(np.arange(n), n, 42))
    assert not np.array_equal(first, permute(np.arange(n), n, 43))
    assert not np.array_equal(first, np.arange(n))


def test_permute_maps_each_index_alone_as_in_the_whole():
    n, key = 53, 7
    whole = permute(np.arange(n), n, key)
    for i in (0, 1, 26, 52):
        assert int(permute(i, n, key)) == whole[i]
    block = permute(np.arange(n).reshape(1, n), n, key)
    assert block.shape == (1, n) and np.array_equal(block[0], whole)


def test_permute_of_an_int_index_does_not_warn():
    with kernels_set(False), warnings.catch_warnings():  # the interpreted network
        warnings.simplefilter("error")
        assert int(permute(5, 53, 7)) == ref_permute(5, 53, 7)


def test_permute_compiled_and_interpreted_agree():
    n = 1000
    with kernels_set(False):
        interpreted = permute(np.arange(n), n, 11)
    with kernels_set(True):  # raises without numba, a dependency
        assert np.array_equal(permute(np.arange(n), n, 11), interpreted)


# ----- a plain-Python reference of the documented network --------------------------------

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def ref_mix64(x):
    """SplitMix64's finalizer over Python ints."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def ref_derive_key(*parts):
    h = GOLDEN
    for part in parts:
        h = (ref_mix64(h ^ (part & M64)) + GOLDEN) & M64
    return ref_mix64(h)


def ref_permute(i, n, key):
    """Four Feistel rounds over Z_a x Z_b (a = ceil(sqrt(n)), b = ceil(n / a)), each
    adding a keyed hash of one half to the other, cycle-walked back into [0, n)."""
    if n <= 1:
        return 0
    a = math.isqrt(n - 1) + 1
    b = -(-n // a)
    keys = [ref_derive_key(key, r) for r in range(4)]
    x = i
    while True:
        left, right = divmod(x, b)
        for r, rk in enumerate(keys):
            if r % 2 == 0:
                left = (left + ref_mix64(right ^ rk) % a) % a
            else:
                right = (right + ref_mix64(left ^ rk) % b) % b
        x = left * b + right
        if x < n:
            return x


@pytest.mark.parametrize("parts", [(), (0,), (7, 3), (2**64 - 1, 5, 0)])
def test_derive_key_is_the_documented_hash(parts):
    assert derive_key(*parts) == ref_derive_key(*parts)


@pytest.mark.parametrize("n, key", [(2, 5), (10, 0), (37, 12345), (100, 2**63 + 1)])
def test_permute_is_the_documented_network(network, n, key):
    assert permute(np.arange(n), n, key).tolist() == [ref_permute(i, n, key) for i in range(n)]


def test_derive_key_differs_per_input_and_is_stable():
    keys = {derive_key(*parts) for parts in [(0,), (1,), (0, 0), (0, 1), (1, 0), (2**64 - 1,)]}
    assert len(keys) == 6
    assert derive_key(3, 4) == derive_key(3, 4)
    assert 0 <= derive_key(3, 4) < 2**64
    assert derive_key(-1) == derive_key(2**64 - 1)  # parts are taken mod 2**64


def test_hash_u64_is_keyed_and_elementwise():
    values = np.arange(5, dtype=np.uint64)
    h = hash_u64(values, 1)
    assert h.dtype == np.uint64 and len(set(h.tolist())) == 5
    assert not np.array_equal(h, hash_u64(values, 2))
    assert hash_u64(values[3:4], 1)[0] == h[3]
