"""``filter``: keeps a record where the predicate holds, else returns ``DROP``; takes a
predicate or a Grain object's ``filter``."""

from __future__ import annotations

import pytest

from zephon_jax.transforms.filter import FilterTransform


def is_even(x):
    return x % 2 == 0


class GrainFilter:
    def filter(self, x):
        return x > 2


def test_kept_records_pass_as_they_are_and_others_are_dropped():
    f = FilterTransform(is_even)
    record = [4]
    assert f.apply(4, (0, 0, 0)) == 4
    assert FilterTransform(lambda r: True).apply(record, (0, 0, 0)) is record
    assert f.apply(3, (0, 0, 0)) is FilterTransform.DROP


def test_grain_filters_and_names():
    f = FilterTransform(GrainFilter())
    assert [f.apply(x, (0, 0, 0)) is FilterTransform.DROP for x in (2, 3)] == [True, False]
    assert FilterTransform(is_even).describe() == f"filter({__name__}.is_even)"
    with pytest.raises(TypeError, match="filter needs a callable or a grain object with"):
        FilterTransform("x")
