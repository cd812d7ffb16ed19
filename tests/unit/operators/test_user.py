"""The record-level operator adapter: the operator sees records, its outputs get ``Opaque``
lineages holding the record, its carry is saved encoded (a snapshot does not change when
the operator mutates its carry), and malformed operators are refused."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_jax.core.lineage import Element, Opaque
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.operators.base import Operator
from zephon_jax.operators.user import UserOperator


class Pairs(Operator):
    """Emits the sum of each two records; keeps the first of a pair in a list."""

    max_held = 1

    def init(self):
        return []

    def step(self, carry, record):
        carry.append(record)
        if len(carry) == 2:
            total = carry[0] + carry[1]
            carry.clear()
            return carry, [total]
        return carry, []

    def flush(self, carry):
        return [], list(carry)


def test_outputs_hold_their_record_as_opaque_lineage():
    op = UserOperator(Pairs())
    carry = op.init(0)
    carry, out = op.step(carry, Element(3, 0))
    assert out == []
    carry, out = op.step(carry, Element(4, 1))
    assert [e.data for e in out] == [7]
    assert isinstance(out[0].lineage, Opaque) and out[0].lineage.data == 7
    carry, _ = op.step(carry, Element(5, 2))
    carry, left = op.flush(carry)
    assert [e.data for e in left] == [5] and carry == []


def test_saved_carry_is_a_snapshot_that_loads_back():
    op = UserOperator(Pairs())
    carry, _ = op.step(op.init(0), Element(np.int64(9), 0))
    saved = op.save(carry)
    assert saved.held == ()
    carry.append(1)  # mutated after the snapshot
    assert op.load(saved, 0) == [9]


def test_a_carry_that_cannot_be_encoded_is_refused():
    op = UserOperator(Pairs())
    with pytest.raises(StateError):
        op.save([object()])


def test_operators_without_a_method_are_refused():
    class NoFlush:
        def init(self):
            return None

        def step(self, carry, record):
            return carry, []

    with pytest.raises(PipelineError, match=r"NoFlush has no flush\(\)"):
        UserOperator(NoFlush())


def test_a_step_that_returns_no_pair_is_refused():
    class Bad(Pairs):
        def step(self, carry, record):
            return [record]

    with pytest.raises(
        PipelineError, match=r"step must return \(carry, list_of_records\); got list"
    ):
        UserOperator(Bad(), name="bad").step([], Element(1, 0))


def test_none_outputs_are_no_outputs():
    class Quiet(Pairs):
        def step(self, carry, record):
            return carry, None

    assert UserOperator(Quiet()).step([], Element(1, 0)) == ([], [])


def test_names_bounds_and_descriptions():
    op = UserOperator(Pairs())
    assert op.max_held == 1
    assert op.op_name.endswith("Pairs")
    assert op.carry_bound() == "user-defined (stored by value)"
    assert op.describe().startswith("apply(") and "Pairs" in op.describe()

    class Described(Pairs):
        carry_bound = "2 records"

        def describe(self):
            return "pairs()"

    described = UserOperator(Described())
    assert described.carry_bound() == "2 records"
    assert described.describe() == "apply(pairs())"
