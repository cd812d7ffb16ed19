"""Resolving lane-local positions: leaves in depth-first order, a source's records and
epochs, all lanes at once equal to lane by lane, and where a finite input ends."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from zephon_jax.sampler.mixture import MixtureNode
from zephon_jax.sampler.resolve import (
    can_end,
    end_position,
    leaf_paths,
    leaves,
    resolve,
    resolve_lanes,
)
from zephon_jax.sampler.source import SourceNode


def tree():
    a, b, c = SourceNode([0] * 3, transforms=("ta",)), SourceNode([0] * 4), SourceNode([0] * 5)
    inner = MixtureNode((b, c), (0.5, 0.5), transforms=("inner",))
    return MixtureNode((a, inner), (0.5, 0.5), transforms=("root",)), (a, b, c)


def test_leaves_and_leaf_paths_depth_first():
    root, (a, b, c) = tree()
    assert leaves(root) == [a, b, c]
    assert leaf_paths(root) == [("ta", "root"), ("inner", "root"), ("inner", "root")]
    assert leaves(a) == [a] and leaf_paths(a) == [("ta",)]


def test_resolve_a_source_gives_records_and_epochs():
    # lane 1 of 2 reads global indices 1, 3, 5, 7 of a 3-record source
    res = resolve(SourceNode([0] * 3, num_epochs=2), 1, np.arange(4), 2)
    assert res.leaf.tolist() == [0, 0, 0, 0]
    assert res.record.tolist() == [1, 0, 2, 1]
    assert res.epoch.tolist() == [0, 1, 1, 2]
    assert res.valid.tolist() == [True, True, True, False]


def test_resolve_a_mixture_numbers_leaves_depth_first():
    root, _ = tree()
    res = resolve(root, 0, np.arange(40), 1)
    assert set(res.leaf.tolist()) == {0, 1, 2}
    assert np.count_nonzero(res.leaf == 0) == 20  # half to the first child
    for leaf, size in ((0, 3), (1, 4), (2, 5)):
        n = np.count_nonzero(res.leaf == leaf)
        records = res.record[res.leaf == leaf]
        assert records.tolist() == [k % size for k in range(n)]  # one lane: in order


def test_resolve_lanes_equals_lane_by_lane():
    source = SourceNode(list(range(7)), shuffle_seed=3, num_epochs=2)
    root, _ = tree()
    positions = [np.arange(5), np.arange(2, 9), np.array([], np.int64)]
    for node in (source, root):
        together = resolve_lanes(node, [0, 2, 1], positions, 3)
        for lane, p, got in zip([0, 2, 1], positions, together):
            want = resolve(node, lane, p, 3)
            for field in ("leaf", "record", "epoch", "valid"):
                assert getattr(got, field).tolist() == getattr(want, field).tolist()


def test_can_end_and_end_position():
    finite = SourceNode([0] * 5, num_epochs=1)
    endless = SourceNode([0] * 5)
    assert can_end(finite) and not can_end(endless)
    assert not can_end(MixtureNode((finite, endless), (0.5, 0.5)))
    both = MixtureNode((finite, SourceNode([0] * 3, num_epochs=1)), (0.5, 0.5))
    assert can_end(both)
    # lane 1 of 2: 5 records give draws 1, 3 (2 draws); 3 records give draw 1 (1 draw)
    assert end_position(finite, 1, 2) == 2 and end_position(endless, 1, 2) is None
    assert end_position(both, 1, 2) == both.draws_available(1, [2, 1])
    assert end_position(MixtureNode((finite, endless), (0.5, 0.5)), 0, 1) is None
    # a node of another kind (a scheduled mixture) can end if some leaf can
    other = SimpleNamespace(children=(finite, endless))
    assert can_end(other)
    assert not can_end(SimpleNamespace(children=(endless,)))
