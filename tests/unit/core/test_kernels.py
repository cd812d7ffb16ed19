"""``kernels()``: the compiled kernels once looked for, ``None`` (with one warning naming
the fix) when numba cannot be imported, ``None`` silently under ``ZEPHON_JAX_COMPILED=0``;
``loaded_kernels()`` only once something asked for them; ``set_compiled`` turns them off
and on for pipelines planned afterwards, with the same batches either way."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from pipelines import kernels_set

import zephon_jax as zj
from zephon_jax.core import compiled_kernels, kernels
from zephon_jax.engine.lane import LanePlan
from zephon_jax.sources import TokenArray


@pytest.fixture
def fresh(monkeypatch):
    """The kernels not yet looked for: the default again (the choice before is restored
    after the test, before ``monkeypatch`` undoes its changes)."""
    with kernels_set(None):
        yield monkeypatch


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


# ----- set_compiled ------------------------------------------------------------------


def _token_pipeline() -> zj.BatchedDataset:
    rng = np.random.default_rng(3)
    docs = [rng.integers(1, 900, int(n)).astype(np.int32) for n in rng.integers(1, 40, 60)]
    tokens = TokenArray.from_documents(docs)
    return zj.Dataset.source(tokens).shuffle(seed=4).split(16).pack(24).batch(4, num_lanes=2)


def _batches(ds: zj.BatchedDataset, steps: int) -> list:
    return [dict(batch) for batch, _ in zip(zj.Loader(ds), range(steps))]


def test_set_compiled_false_turns_the_kernels_off_and_none_restores_the_default(fresh):
    assert zj.set_compiled is kernels.set_compiled and "set_compiled" in zj.__all__
    assert kernels.kernels() is not None  # the default: compiled (numba imports)
    assert zj.set_compiled(False) is None  # the previous choice: the default
    assert kernels.compiled_setting() is False
    assert kernels.kernels() is None and kernels.loaded_kernels() is None
    assert LanePlan(_token_pipeline()).columnar is None  # the general path
    assert zj.set_compiled(None) is False
    assert kernels.compiled_setting() is None
    assert kernels.loaded_kernels() is None  # looked for again, when a pipeline asks
    assert kernels.kernels() is not None
    assert LanePlan(_token_pipeline()).columnar is not None


def test_set_compiled_true_loads_the_kernels_for_the_sampler_too(fresh):
    assert kernels.loaded_kernels() is None
    assert zj.set_compiled(True) is None
    assert kernels.loaded_kernels() is not None  # the permutation runs compiled
    assert kernels.loaded_kernels().permute is compiled_kernels.permute
    assert LanePlan(_token_pipeline()).columnar is not None
    assert zj.set_compiled(False) is True
    assert kernels.loaded_kernels() is None


def test_set_compiled_true_without_numba_names_the_cause_and_the_fix(fresh):
    fresh.setattr(compiled_kernels, "COMPILED", False)
    missing = ImportError("No module named 'numba'")
    fresh.setattr(compiled_kernels, "IMPORT_ERROR", missing)
    with pytest.raises(zj.ZephonError) as caught:
        zj.set_compiled(True)
    message = str(caught.value)
    assert "numba cannot be imported (No module named 'numba')" in message
    assert "pip install 'numba>=0.59'" in message and "set_compiled(False)" in message
    assert caught.value.__cause__ is missing
    assert kernels.compiled_setting() is None  # unchanged
    assert zj.set_compiled(False) is None  # interpreted is always possible


def test_set_compiled_true_under_the_environment_switch_names_it(fresh):
    fresh.setattr(compiled_kernels, "COMPILED", False)
    fresh.setattr(compiled_kernels, "IMPORT_ERROR", None)  # ZEPHON_JAX_COMPILED=0
    with pytest.raises(zj.ZephonError, match="ZEPHON_JAX_COMPILED=0 was set when zephon_jax"):
        zj.set_compiled(True)
    assert kernels.compiled_setting() is None


@pytest.mark.parametrize("wrong", [0, 1, "0", "false"], ids=["int0", "int1", "str0", "strfalse"])
def test_set_compiled_takes_only_booleans_or_none(fresh, wrong):
    with pytest.raises(TypeError, match="True, False or None"):
        zj.set_compiled(wrong)
    assert kernels.compiled_setting() is None


def test_a_pack_pipeline_gives_the_same_batches_compiled_and_interpreted(fresh):
    ds = _token_pipeline()
    with kernels_set(True):
        assert LanePlan(ds).columnar is not None
        compiled = _batches(ds, 5)
    with kernels_set(False):
        assert LanePlan(ds).columnar is None
        interpreted = _batches(ds, 5)
    assert len(compiled) == len(interpreted) == 5
    for got, want in zip(compiled, interpreted):
        assert sorted(got) == sorted(want)
        for key in want:
            assert got[key].dtype == want[key].dtype
            assert got[key].tobytes() == want[key].tobytes(), key
    assert kernels.compiled_setting() is None  # each block restored the choice before
