"""Adapter running a record-level :class:`~zephon_jax.operators.base.Operator` in a lane.

The by-value fallback: such an operator sees records, not elements, so nothing
says which inputs an output is made from. Its carry is saved as it is (encoded
plain data) and its outputs get an ``Opaque`` lineage that holds the record, so
a state stores them by value wherever they are still in flight. Write a
:class:`~zephon_jax.operators.base.LineageOperator` to store pointers instead.
"""

from __future__ import annotations

from typing import Any

from zephon_jax.core.lineage import Element, opaque
from zephon_jax.core.naming import callable_name
from zephon_jax.core.packed import plain
from zephon_jax.errors import PipelineError
from zephon_jax.operators.base import LineageOperator, Saved
from zephon_jax.state import codec


class UserOperator(LineageOperator):
    """Runs ``op.init/step/flush`` over records; its carry and outputs are stored as data."""

    name = "apply"

    def __init__(self, op: Any, name: str | None = None):
        for method in ("init", "step", "flush"):
            if not callable(getattr(op, method, None)):
                raise PipelineError(
                    f"Dataset.apply needs an operator with init(), step(carry, record) and "
                    f"flush(carry); {type(op).__name__} has no {method}()"
                )

        self.op = op
        self.op_name = name or callable_name(type(op))
        # The class and its plain-data parameters (public attributes), for the fingerprint.
        self.op_description = callable_name(op)
        self.max_held = int(getattr(op, "max_held", 0) or 0)

    def init(self, lane):
        return self.op.init()

    def _wrap(self, outputs) -> list[Element]:
        if outputs is None:
            return []
        return [Element(out, opaque(out)) for out in outputs]

    def step(self, carry, element):
        result = self.op.step(carry, plain(element.data))
        if not (isinstance(result, tuple) and len(result) == 2):
            raise PipelineError(
                f"{self.op_name}.step must return (carry, list_of_records); got "
                f"{type(result).__name__}"
            )
        carry, outputs = result
        return carry, self._wrap(outputs)

    def flush(self, carry):
        carry, outputs = self.op.flush(carry)
        return carry, self._wrap(outputs)

    def save(self, carry) -> Saved:
        # Encoded now: a snapshot must not change when the user's step mutates the carry.
        return Saved((), codec.encode(carry))  # raises a StateError naming the offending type

    def load(self, saved: Saved, lane: int):
        return codec.decode(saved.aux)

    def carry_bound(self) -> str:
        bound = getattr(self.op, "carry_bound", "user-defined (stored by value)")
        return str(bound() if callable(bound) else bound)

    def describe(self) -> str:
        describe = getattr(self.op, "describe", None)
        return f"apply({describe() if callable(describe) else self.op_description})"
