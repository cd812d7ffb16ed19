"""Clear errors for invalid pipelines and incompatible restores."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pipelines import make_docs, take

import zephon_jax as zj


def _source():
    return zj.Dataset.source(make_docs(50, 40, seed=0))


def test_record_longer_than_seq_len_reaching_pack_without_split():
    ds = _source().pack(16).batch(2)
    with pytest.raises(zj.PipelineError, match=r"add \.split\(16\) before \.pack"):
        next(iter(zj.Loader(ds)))


@pytest.mark.parametrize("weights", [[1, 0], [1, -1], [1, math.nan], [1, math.inf], [1], []])
def test_invalid_mixture_weights(weights):
    with pytest.raises(zj.PipelineError, match="weight"):
        zj.Dataset.mix([_source(), _source()], weights)


def test_global_batch_size_not_a_multiple_of_lanes():
    with pytest.raises(zj.PipelineError, match="not a multiple of num_lanes=3"):
        _source().split(8).batch(8, num_lanes=3)


def test_process_count_that_cannot_hold_the_batch():
    ds = _source().split(8).pack(8).batch(8)
    with pytest.raises(zj.PipelineError, match="process_count=3 cannot hold global_batch_size=8"):
        zj.Loader(ds, process_index=0, process_count=3)


@pytest.mark.parametrize(
    "other, field",
    [
        (lambda: _source().shuffle(2).split(8).pack(8).batch(4), "seeds"),
        (lambda: _source().shuffle(1).split(8).pack(8, method="first_fit").batch(4), "operators"),
        (lambda: _source().shuffle(1).split(8).pack(8).batch(8), "global_batch_size"),
        (lambda: _source().shuffle(1).split(8).pack(8).batch(4, num_lanes=2), "num_lanes"),
        (
            lambda: (
                zj.Dataset.source(make_docs(51, 40, seed=0)).shuffle(1).split(8).pack(8).batch(4)
            ),
            "sources",
        ),
    ],
)
def test_fingerprint_mismatch_on_restore_names_the_field(other, field):
    ds = _source().shuffle(1).split(8).pack(8).batch(4)
    it = iter(zj.Loader(ds))
    take(it, 3)
    state = it.get_state()
    target = iter(zj.Loader(other()))
    with pytest.raises(zj.StateMismatchError) as info:
        target.set_state(state)
    assert info.value.field == field
    assert field in str(info.value)


def test_state_of_one_process_does_not_restore_another_topology():
    ds = _source().split(8).pack(8).batch(4)
    it = iter(zj.Loader(ds, process_index=0, process_count=2))
    take(it, 2)
    with pytest.raises(zj.StateError, match="merge_states"):
        iter(zj.Loader(ds)).set_state(it.get_state())


def test_state_is_plain_data():
    ds = _source().split(8).pack(8).window_shuffle(3, seed=1).batch(4)
    it = iter(zj.Loader(ds))
    take(it, 2)
    state = it.get_state()

    def check(value):
        if isinstance(value, dict):
            for k, v in value.items():
                assert isinstance(k, str)
                check(v)
        else:
            assert isinstance(value, (int, str, np.ndarray)), type(value)

    check(state)
