"""``flat_map``: replaces each record by the records a pure function returns for it."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from zephon_jax.element import Element
from zephon_jax.operators.base import LineageOperator, Rebuild
from zephon_jax.operators.packing import plain


class FlatMapOperator(LineageOperator):
    """Applies ``fn(record) -> iterable of records`` (or a Grain ``FlatMapTransform``).

    Output ``m`` of a record has lineage ``(parent_lineage, m)`` and is rebuilt by
    calling ``fn`` again, so ``fn`` must be pure. Carry: none; all outputs of a
    record are emitted at once.
    """

    name = "flat_map"

    def __init__(self, fn: Callable[[Any], Iterable[Any]] | Any):
        from zephon_jax.transforms import callable_name

        grain_fn = getattr(fn, "flat_map", None)
        self._fn = grain_fn if callable(grain_fn) and not callable(fn) else fn
        if not callable(self._fn):
            raise TypeError(f"flat_map needs a callable or a grain FlatMapTransform; got {fn!r}")
        self.fn_name = callable_name(fn)

    def step(self, carry, element):
        outputs = self._fn(plain(element.data))
        return carry, [Element(out, (element.lineage, m)) for m, out in enumerate(outputs)]

    def parents(self, lineage):
        return (lineage[0],)

    def regenerate(self, lineage, rebuild: Rebuild):
        parent, m = lineage
        for i, out in enumerate(self._fn(plain(rebuild(parent).data))):
            if i == m:
                return out
        raise RuntimeError(
            f"flat_map({self.fn_name}) returned fewer outputs on restore than before; "
            "the function must be pure"
        )

    def provenance_pieces(self, lineage, start, stop):
        """Output ``m`` of a record is not a slice of it: ``output`` names it instead."""
        parent, m = lineage
        return [(parent, None, None, m)]

    def carry_bound(self) -> str:
        return "none (outputs are emitted at once)"

    def describe(self) -> str:
        return f"flat_map({self.fn_name})"
