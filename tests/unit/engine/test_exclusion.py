"""Excluding documents: a state's ``(label, record)`` pairs resolved to leaves, and the
excluded records dropped from what a lane reads (row-wise and column-wise)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from zephon_jax.core.lineage import Element
from zephon_jax.engine.exclusion import (
    drop_excluded,
    excluded_columns,
    excluded_keys,
    excluded_records,
    holds_excluded,
    is_excluded,
)
from zephon_jax.errors import StateError
from zephon_jax.transforms import DROP


def test_excluded_records_by_label_and_by_index():
    got = excluded_records(["web", "code"], [("code", 3), (0, 7), ("web", np.int64(1)), (1, 3)])
    assert got == {1: frozenset({3}), 0: frozenset({7, 1})}
    assert excluded_records(["a"], []) == {}


def test_excluded_records_refuses_unknown_shared_and_out_of_range_labels():
    with pytest.raises(StateError, match="names none of this pipeline's sources"):
        excluded_records(["a", "b"], [("c", 1)])
    with pytest.raises(StateError, match="names several.*exclude by the source's index"):
        excluded_records(["a", "a"], [("a", 1)])
    with pytest.raises(StateError, match="source 2, but this pipeline has 2 sources"):
        excluded_records(["a", "b"], [(2, 0)])
    with pytest.raises(StateError, match="source -1"):
        excluded_records(["a", "b"], [(-1, 0)])


def test_is_excluded():
    excluded = {0: frozenset({2})}
    assert is_excluded(excluded, 0, 2)
    assert not is_excluded(excluded, 0, 3) and not is_excluded(excluded, 1, 2)


def test_excluded_columns_keeps_the_others_in_order():
    positions = np.array([10, 11, 12, 13, 14])
    leaves = np.array([0, 1, 0, 1, 0])
    records = np.array([5, 5, 6, 7, 7])
    kept = excluded_columns({0: frozenset({5, 7}), 1: frozenset({7}), 2: frozenset({1})},
                            positions, leaves, records)  # fmt: skip
    assert [k.tolist() for k in kept] == [[11, 12], [1, 0], [5, 6]]


class FakeLane:
    """A lane whose lane-local position ``p`` is record ``p`` of leaf ``p % 2``."""

    def __init__(self, excluded):
        self.plan = SimpleNamespace(excluded=excluded, operators=())

    def locate(self, lineages):
        return [(p % 2, p, 0) for p in lineages]


def test_drop_excluded_replaces_excluded_elements_by_drop_and_keeps_markers():
    lane = FakeLane({1: frozenset({3})})
    marker = object()
    items = [Element({"x": i}, i) for i in range(5)]
    items.insert(2, marker)
    out = drop_excluded(lane, items)
    assert out[:3] == items[:3] and out[3] is items[3]
    assert out[4] is DROP and out[5] is items[5]
    assert items[4] is not DROP  # the input list is not changed
    assert drop_excluded(lane, [marker]) == [marker]


def test_holds_excluded_for_an_element_before_any_operator():
    lane = FakeLane({1: frozenset({3})})
    assert holds_excluded(lane, 0, 3)
    assert not holds_excluded(lane, 0, 2)


def test_excluded_keys_are_sorted_leaf_and_record_pairs():
    keys = excluded_keys({1: frozenset({5, 2}), 0: frozenset({7})})
    assert keys.dtype == np.int64
    assert keys.tolist() == [7, (1 << 40) | 2, (1 << 40) | 5]
    assert excluded_keys({}).tolist() == []
