"""Pure per-record transforms: map, random_map and filter."""

from zephon_jax.core.checks import TransformFailed
from zephon_jax.core.naming import callable_name
from zephon_jax.core.packed import plain
from zephon_jax.errors import ZephonError
from zephon_jax.transforms.filter import FilterTransform
from zephon_jax.transforms.map import MapTransform
from zephon_jax.transforms.random_map import RandomMapTransform

DROP = FilterTransform.DROP

__all__ = [
    "DROP",
    "FilterTransform",
    "MapTransform",
    "RandomMapTransform",
    "apply_transforms",
    "callable_name",
]


def apply_transforms(transforms, data, lane: int, stage: int, lineage):
    """Applies per-record transforms in order; returns ``DROP`` if a filter drops it.

    A transform that raises is reported as ``TransformFailed`` naming it, with
    the original exception chained. Packed rows reach user functions as plain dicts.
    """
    if transforms:
        data = plain(data)
    for transform in transforms:
        try:
            data = transform.apply(data, (lane, stage, lineage))
        except ZephonError:
            raise
        except Exception as e:
            raise TransformFailed(transform.describe()) from e
        if data is DROP:
            return DROP
    return data
