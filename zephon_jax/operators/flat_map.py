"""``flat_map``: replaces each record by the records a pure function returns for it."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from zephon_jax.core.checks import unwrap_grain
from zephon_jax.core.naming import callable_name
from zephon_jax.operators.contract import stateless


class FlatMapOperator(stateless):
    """Applies ``fn(record) -> iterable of records`` (or a Grain ``FlatMapTransform``).

    Output ``m`` of a record is made from it with recipe ``m`` and is rebuilt
    by calling ``fn`` again, so ``fn`` must be pure. Carry: none; all outputs of
    a record are emitted at once.
    """

    may_pack = False  # declared for the engine (see LineageOperator)

    def __init__(self, fn: Callable[[Any], Iterable[Any]] | Any):
        super().__init__(unwrap_grain(fn, "flat_map", "flat_map"), "flat_map")
        self.fn_name = callable_name(fn)
        self.description = f"flat_map({self.fn_name})"
