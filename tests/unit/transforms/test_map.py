"""``map``: applies the function (or a Grain object's ``map``) to each record, ignoring
the rng key."""

from __future__ import annotations

import pytest

from zephon_jax.transforms.map import MapTransform


def double(x):
    return 2 * x


class GrainMap:
    def map(self, x):
        return x + 1


def test_map_applies_the_function_whatever_the_key():
    m = MapTransform(double)
    assert m.apply(3, (0, 0, 0)) == 6
    assert m.apply(3, (5, 2, ((1,), 0))) == 6
    assert MapTransform(GrainMap()).apply(3, (0, 0, 0)) == 4


def test_names_and_bad_functions():
    assert MapTransform(double).describe() == f"map({__name__}.double)"
    with pytest.raises(TypeError, match="map needs a callable or a grain object with"):
        MapTransform(None)
