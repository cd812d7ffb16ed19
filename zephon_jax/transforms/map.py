"""``map``: applies a pure function to every record."""

from __future__ import annotations

from typing import Any, Callable

from zephon_jax.core.checks import unwrap_grain
from zephon_jax.core.naming import callable_name


class MapTransform:
    """Wraps ``fn(record) -> record`` or a Grain ``MapTransform`` (its ``.map``).

    Contract: ``fn`` is pure (the same record gives the same output), which is
    what lets a carry hold record pointers instead of data.
    """

    def __init__(self, fn: Callable[[Any], Any] | Any):

        self._fn = unwrap_grain(fn, "map", "map")
        self.name = callable_name(fn)

    def apply(self, record: Any, rng_key: tuple) -> Any:
        return self._fn(record)

    def describe(self) -> str:
        return f"map({self.name})"
