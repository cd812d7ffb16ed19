"""Adapter running a user-defined :class:`~zephon_jax.operators.base.Operator` in a lane."""

from __future__ import annotations

from typing import Any

from zephon_jax import codec
from zephon_jax.element import Element, Opaque
from zephon_jax.errors import PipelineError
from zephon_jax.operators.base import LineageOperator, Rebuild
from zephon_jax.operators.packing import plain


class UserOperator(LineageOperator):
    """Runs ``op.init/step/flush`` over records; its outputs are stored as data.

    The user's carry is plain data and is written to states as it is; outputs
    get an ``Opaque`` lineage that holds the record, so a state stores them by
    value wherever they are still in flight.
    """

    name = "apply"

    def __init__(self, op: Any, name: str | None = None):
        for method in ("init", "step", "flush"):
            if not callable(getattr(op, method, None)):
                raise PipelineError(
                    f"Dataset.apply needs an operator with init(), step(carry, record) and "
                    f"flush(carry); {type(op).__name__} has no {method}()"
                )
        from zephon_jax.transforms import callable_name

        self.op = op
        self.op_name = name or callable_name(type(op))

    def init(self, lane):
        return self.op.init()

    def _wrap(self, outputs) -> list[Element]:
        if outputs is None:
            return []
        return [Element(out, Opaque(out)) for out in outputs]

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

    def carry_to_plain(self, carry):
        # Encoded now: a snapshot must not change when the user's step mutates the carry.
        return codec.encode(carry)  # raises a StateError naming the offending type

    def carry_from_plain(self, plain, lane, rebuild: Rebuild):
        return codec.decode(plain)

    def parents(self, lineage):
        return ()

    def regenerate(self, lineage, rebuild: Rebuild):
        return lineage.data

    def carry_bound(self) -> str:
        bound = getattr(self.op, "carry_bound", "user-defined (stored by value)")
        return str(bound() if callable(bound) else bound)

    def describe(self) -> str:
        describe = getattr(self.op, "describe", None)
        return f"apply({describe() if callable(describe) else self.op_name})"
