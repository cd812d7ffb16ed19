"""Pure per-record transforms: map, random_map and filter."""

from zephon_jax.transforms.filter import FilterTransform
from zephon_jax.transforms.map import MapTransform
from zephon_jax.transforms.random_map import RandomMapTransform

DROP = FilterTransform.DROP

__all__ = ["DROP", "FilterTransform", "MapTransform", "RandomMapTransform", "callable_name"]


def callable_name(fn) -> str:
    """A stable, human-readable name of a user function for fingerprints and errors."""
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or repr(target)
    return f"{module}.{name}" if module else name
