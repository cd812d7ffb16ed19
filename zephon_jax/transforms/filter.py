"""``filter``: keeps the records for which a pure predicate holds."""

from __future__ import annotations

from typing import Any, Callable

from zephon_jax.core.checks import unwrap_grain
from zephon_jax.core.naming import callable_name


class FilterTransform:
    """Wraps ``pred(record) -> bool`` or a Grain ``Filter`` (its ``.filter``)."""

    DROP = object()

    def __init__(self, pred: Callable[[Any], bool] | Any):

        self._pred = unwrap_grain(pred, "filter", "filter")
        self.name = callable_name(pred)

    def apply(self, record: Any, rng_key: tuple) -> Any:
        return record if self._pred(record) else FilterTransform.DROP

    def describe(self) -> str:
        return f"filter({self.name})"
