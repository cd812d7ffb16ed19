"""``kernels()``: the compiled kernels once looked for, ``None`` (with one warning naming
the fix) when numba cannot be imported, ``None`` silently under ``ZEPHON_JAX_COMPILED=0``;
``loaded_kernels()`` only once something asked for them."""

from __future__ import annotations

import warnings

import pytest

from zephon_jax.core import compiled_kernels, kernels


@pytest.fixture
def fresh(monkeypatch):
    """The kernels not yet looked for (restored after the test)."""
    monkeypatch.setattr(kernels, "_KERNELS", False)
    return monkeypatch


def test_kernels_are_the_compiled_ones_and_looked_for_once(fresh):
    assert kernels.loaded_kernels() is None  # nothing asked yet
    found = kernels.kernels()
    assert found is not None
    assert found.place is compiled_kernels.place
    assert found.gather is compiled_kernels.gather
    assert found.permute is compiled_kernels.permute
    assert found.mix64 is compiled_kernels.mix64
    assert kernels.kernels() is found
    assert kernels.loaded_kernels() is found


def test_without_numba_kernels_warn_once_with_the_fix(fresh):
    fresh.setattr(compiled_kernels, "COMPILED", False)
    fresh.setattr(compiled_kernels, "IMPORT_ERROR", ImportError("no module\nnamed numba"))
    with pytest.warns(RuntimeWarning) as caught:
        assert kernels.kernels() is None
        assert kernels.kernels() is None  # looked for once: no second warning
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "\n" not in message
    assert "no module named numba" in message
    assert "pip install 'numba>=0.59'" in message and "ZEPHON_JAX_COMPILED=0" in message
    assert kernels.loaded_kernels() is None


def test_compiled_off_by_environment_gives_none_silently(fresh):
    fresh.setattr(compiled_kernels, "COMPILED", False)
    fresh.setattr(compiled_kernels, "IMPORT_ERROR", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernels.kernels() is None
