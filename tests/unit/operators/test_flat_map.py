"""``flat_map``: output ``m`` of a record is derived from it with recipe ``m`` and remade
by calling the (pure) function again; Grain objects' ``flat_map`` is used."""

from __future__ import annotations

import pytest

from zephon_jax.core.lineage import Element
from zephon_jax.errors import StateError
from zephon_jax.operators.base import Saved
from zephon_jax.operators.flat_map import FlatMapOperator


def repeat(record):
    return [record * 10 + i for i in range(record)]


class Grainish:
    def flat_map(self, record):
        return [record, record]


def test_each_output_is_derived_from_its_record_with_its_index():
    op = FlatMapOperator(repeat)
    carry, out = op.step(None, Element(3, 7))
    assert carry is None
    assert [e.data for e in out] == [30, 31, 32]
    assert [e.lineage for e in out] == [((7,), 0), ((7,), 1), ((7,), 2)]
    assert op.step(None, Element(0, 8))[1] == []


def test_remake_calls_the_function_again():
    op = FlatMapOperator(repeat)
    assert op.remake(2, [3]) == 32
    assert op.remake(0, [1]) == 10
    with pytest.raises(RuntimeError, match="fewer outputs on restore"):
        op.remake(3, [3])
    with pytest.raises(StateError, match="an output index is an int >= 0"):
        op.remake(-1, [3])


def test_trace_names_the_output_of_its_input():
    assert FlatMapOperator(repeat).trace(1, (7,), None, None) == [(7, None, None, 1)]


def test_grain_objects_and_names():
    op = FlatMapOperator(Grainish())
    assert [e.data for e in op.step(None, Element(5, 0))[1]] == [5, 5]
    assert FlatMapOperator(repeat).describe() == f"flat_map({__name__}.repeat)"
    assert op.name == "flat_map"
    with pytest.raises(TypeError, match="flat_map needs a callable"):
        FlatMapOperator(42)


def test_the_saved_form_is_no_carry_as_before():
    """States taken before flat_map was made with lineage_operator still restore."""
    op = FlatMapOperator(repeat)
    carry, _ = op.step(op.init(0), Element(3, 7))
    assert op.save(carry) == Saved((), None)
    assert op.load(Saved((), None), 0) is None
    with pytest.raises(StateError, match="it has no carry: the state was altered"):
        op.load(Saved((), (0, None)), 0)
