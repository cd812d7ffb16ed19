"""The fingerprint sees what a function computes with: partials, closures, callable objects."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from pipelines import make_docs, take

import zephon_jax as zj
from zephon_jax.core.naming import callable_name


def scale(record, factor=1):
    return {"tokens": record["tokens"] * factor}


def shift(record, factor=1):
    return {"tokens": record["tokens"] + factor}


def repeat_record(record, times=1):
    return [record] * times


def twice(record):
    return [record, record]


class LongerThan:
    """A callable object whose parameter is a public attribute."""

    def __init__(self, n: int, table=None):
        self.n = n
        self.table = table
        self._calls = 0  # private: not a parameter

    def __call__(self, record) -> bool:
        self._calls += 1
        return len(record["tokens"]) > self.n


class Chunker(zj.Operator):
    """A user operator with a parameter."""

    def __init__(self, size: int):
        self.size = size

    def init(self):
        return None

    def step(self, carry, record):
        return carry, [{"tokens": record["tokens"][: self.size]}]


def make_adder(amount):
    def add(record):
        return {"tokens": record["tokens"] + amount}

    return add


def pipeline(map_fn=None, flat=None, pred=None, op=None) -> zj.BatchedDataset:
    ds = zj.Dataset.source(make_docs(40, 12, seed=2))
    if map_fn is not None:
        ds = ds.map(map_fn)
    if pred is not None:
        ds = ds.filter(pred)
    ds = ds.split(4)
    if flat is not None:
        ds = ds.flat_map(flat)
    if op is not None:
        ds = ds.apply(op)
    return ds.split(4).pack(4).batch(2)


CHANGES = [
    ("transforms", {"map_fn": functools.partial(scale)}, {"map_fn": functools.partial(shift)}),
    (
        "transforms",
        {"map_fn": functools.partial(scale, factor=2)},
        {"map_fn": functools.partial(scale, factor=3)},
    ),
    (
        "transforms",
        {"map_fn": functools.partial(scale, factor=np.int32(2))},
        {"map_fn": functools.partial(scale, factor=np.int64(2))},
    ),
    ("transforms", {"pred": LongerThan(2)}, {"pred": LongerThan(3)}),
    (
        "transforms",
        {"pred": LongerThan(2, table=np.arange(5))},
        {"pred": LongerThan(2, table=np.arange(1, 6))},
    ),
    ("transforms", {"map_fn": make_adder(1)}, {"map_fn": make_adder(2)}),
    (
        "operators",
        {"flat": functools.partial(repeat_record, times=1)},
        {"flat": functools.partial(repeat_record, times=2)},
    ),
    ("operators", {"flat": functools.partial(twice)}, {"flat": functools.partial(repeat_record)}),
    ("operators", {"op": Chunker(3)}, {"op": Chunker(2)}),
]


@pytest.mark.parametrize("field, saved, other", CHANGES)
def test_restoring_into_another_function_or_argument_raises(field, saved, other):
    it = iter(zj.Loader(pipeline(**saved)))
    take(it, 2)
    state = it.get_state()
    with pytest.raises(zj.StateMismatchError) as info:
        iter(zj.Loader(pipeline(**other))).set_state(state)
    assert info.value.field == field


@pytest.mark.parametrize("field, saved, other", CHANGES)
def test_the_same_definition_built_again_restores(field, saved, other):
    ds = pipeline(**saved)
    expected = take(iter(zj.Loader(ds)), 5)
    it = iter(zj.Loader(ds))
    take(it, 2)
    state = it.get_state()
    rebuilt = {k: _rebuild(v) for k, v in saved.items()}
    fresh = iter(zj.Loader(pipeline(**rebuilt)))
    fresh.set_state(state)
    for got, want in zip(take(fresh, 3), expected[2:]):
        for key in want:
            assert got[key].tobytes() == want[key].tobytes()


def _rebuild(fn):
    """An equal but distinct object: a new partial, a new instance, a new closure."""
    if isinstance(fn, functools.partial):
        return functools.partial(fn.func, *fn.args, **fn.keywords)
    if isinstance(fn, LongerThan):
        return LongerThan(fn.n, None if fn.table is None else fn.table.copy())
    if isinstance(fn, Chunker):
        return Chunker(fn.size)
    if getattr(fn, "__closure__", None):
        return make_adder(fn.__closure__[0].cell_contents)
    return fn


def test_private_attributes_and_calls_do_not_change_the_fingerprint():
    pred = LongerThan(2)
    before = pipeline(pred=pred).fingerprint()
    take(iter(zj.Loader(pipeline(pred=pred))), 3)
    assert pred._calls > 0
    assert pipeline(pred=pred).fingerprint() == before


def test_what_the_fingerprint_shows():
    here = __name__
    assert callable_name(scale) == f"{here}.scale"
    assert (
        callable_name(functools.partial(scale, 2, factor=3))
        == f"partial({here}.scale, 2, factor=3)"
    )
    assert callable_name(LongerThan(4)) == f"{here}.LongerThan(n=4, table=None)"
    assert callable_name(LongerThan(4).__call__) == f"{here}.LongerThan(n=4, table=None).__call__"
    assert callable_name(make_adder(7)) == f"{here}.make_adder.<locals>.add[amount=7]"
    table = callable_name(LongerThan(1, table=np.arange(3, dtype=np.int16)))
    assert "table=array(<i2, (3,), sha256:" in table
    # Objects that are not plain data show only their type: their contents are unseen.
    assert callable_name(functools.partial(scale, factor=object())) == (
        f"partial({here}.scale, factor=<builtins.object>)"
    )
    assert len(callable_name(functools.partial(scale, factor="x" * 500))) < 120


def training_pipeline(**to_training) -> zj.BatchedDataset:
    ds = zj.Dataset.source(make_docs(40, 12, seed=2)).split(4).pack(4)
    return ds.to_training(**to_training).batch(2)


@pytest.mark.parametrize(
    "saved, other",
    [
        ({}, {"convention": "maxtext"}),
        ({"convention": "maxtext"}, {}),
        ({"field_names": "maxtext"}, {"field_names": "maxtext", "convention": "maxtext"}),
    ],
)
def test_a_state_does_not_restore_into_another_training_convention(saved, other):
    it = iter(zj.Loader(training_pipeline(**saved)))
    take(it, 2)
    state = it.get_state()
    with pytest.raises(zj.StateMismatchError) as info:
        iter(zj.Loader(training_pipeline(**other))).set_state(state)
    assert info.value.field == "transforms"
    iter(zj.Loader(training_pipeline(**saved))).set_state(state)


def test_the_default_convention_keeps_the_fingerprint_of_earlier_versions():
    fingerprint = training_pipeline(convention="default").fingerprint()
    assert "convention" not in fingerprint["transforms"]
    assert fingerprint == training_pipeline().fingerprint()
    assert (
        "convention='maxtext'"
        in training_pipeline(convention="maxtext").fingerprint()["transforms"]
    )


def _seeded(seed, second=None):
    """A mixture shuffled by ``seed``; with ``second``, its parts shuffled by ``seed`` and
    ``second`` instead."""
    a = zj.Dataset.source(make_docs(40, 12, seed=1))
    b = zj.Dataset.source(make_docs(30, 6, seed=2))
    if second is None:
        ds = zj.Dataset.mix([a, b], [0.5, 0.5]).shuffle(seed)
    else:
        ds = zj.Dataset.mix([a.shuffle(seed), b.shuffle(second)], [0.5, 0.5])
    return ds.pack(16, num_bins=2).batch(4)


@pytest.mark.parametrize(
    "saved, now, state_shows, pipeline_shows",
    [
        ((1,), (2,), "shuffle(1)", "shuffle(2)"),
        ((1, 2), (1, 3), "shuffle seeds [1, 2]", "shuffle seeds [1, 3]"),
    ],
)
def test_a_seed_mismatch_shows_the_seeds_as_written(saved, now, state_shows, pipeline_shows):
    it = iter(zj.Loader(_seeded(*saved)))
    take(it, 2)
    state = it.get_state()
    with pytest.raises(zj.StateMismatchError) as info:
        iter(zj.Loader(_seeded(*now))).set_state(state)
    message = str(info.value)
    assert info.value.field == "seeds"
    assert f"  state:    {state_shows}\n  pipeline: {pipeline_shows}\n" in message
    # The fingerprint keeps the derived per-node seeds, which the message does not show.
    assert info.value.saved == state["fingerprint"]["seeds"]
    assert str(json.loads(info.value.saved)[0]) not in message
    # A state without the seeds as written (an older one) shows the fingerprint's values.
    del state["fingerprint"]["seeds_given"]
    with pytest.raises(zj.StateMismatchError) as info:
        iter(zj.Loader(_seeded(*now))).set_state(state)
    assert f"  state:    {state['fingerprint']['seeds']!r}" in str(info.value)


def test_the_seeds_as_written_do_not_enter_the_comparison():
    state = {**zj.Loader(_seeded(3)).dataset.fingerprint()}
    assert json.loads(state["seeds_given"]) == [3]
    changed = {**state, "seeds_given": "[4]"}
    it = iter(zj.Loader(_seeded(3)))
    take(it, 1)
    full = it.get_state()
    full["fingerprint"] = changed
    iter(zj.Loader(_seeded(3))).set_state(full)  # restores: only the derived seeds count
