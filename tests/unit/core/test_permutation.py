"""Keyed permutations: ``permute`` is a bijection on ``[0, n)`` for every ``n`` and key,
deterministic per key, the same compiled and interpreted; ``derive_key`` and
``hash_u64`` are keyed hashes."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_jax.core import kernels
from zephon_jax.core.permutation import derive_key, hash_u64, permute


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 10, 16, 17, 100, 257, 1000])
@pytest.mark.parametrize("key", [0, 1, 2**63 + 5])
def test_permute_is_a_bijection_on_range_n(n, key):
    image = permute(np.arange(n), n, key)
    assert image.dtype == np.int64 and image.shape == (n,)
    assert sorted(image.tolist()) == list(range(n))


def test_permute_of_one_is_zero_and_keeps_the_shape():
    assert permute(np.zeros((2, 3), np.int64), 1, 9).tolist() == [[0] * 3] * 2
    assert permute(0, 1, 9).shape == ()


def test_permute_is_deterministic_per_key_and_differs_between_keys():
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


def test_permute_compiled_and_interpreted_agree(monkeypatch):
    compiled = kernels.kernels()
    if compiled is None:
        pytest.fail("numba is a dependency: the compiled kernels must load")
    n = 1000
    monkeypatch.setattr(kernels, "_KERNELS", None)
    interpreted = permute(np.arange(n), n, 11)
    monkeypatch.setattr(kernels, "_KERNELS", compiled)
    assert np.array_equal(permute(np.arange(n), n, 11), interpreted)


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
