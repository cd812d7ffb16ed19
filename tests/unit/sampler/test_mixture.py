"""Mixture schedules: the two-way Bresenham splits, the order-seeded block permutation,
where a finite mixture ends, and the node's checks and description."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_jax.errors import PipelineError
from zephon_jax.sampler.mixture import BLOCK, MAX_DRAWS, MixtureNode, route_draws
from zephon_jax.sampler.source import SourceNode


def node(weights, order_seed=None, key=7):
    children = tuple(SourceNode(list(range(10))) for _ in weights)
    return MixtureNode(children, tuple(weights), order_seed=order_seed, node_key=key)


def test_equal_halves_alternate_and_each_component_counts_up():
    comp, sub = route_draws((0.5, 0.5), 7, 3, np.arange(20))
    # share 2**31: left draws are exactly every other draw, whatever the phase
    assert np.all(comp[::2] == comp[0]) and np.all(comp[1::2] == 1 - comp[0])
    for c in (0, 1):
        assert sub[comp == c].tolist() == list(range(10))


def test_a_quarter_share_takes_one_draw_in_four():
    comp, sub = route_draws((0.25, 0.75), 1, 0, np.arange(400))
    for block in range(100):
        assert np.count_nonzero(comp[4 * block : 4 * block + 4] == 0) == 1
    assert sub[comp == 0].tolist() == list(range(100))
    assert sub[comp == 1].tolist() == list(range(300))


def test_ordered_blocks_keep_counts_and_each_components_order():
    plain, ordered = node((0.3, 0.7)), node((0.3, 0.7), order_seed=5)
    draws = np.arange(3 * BLOCK)
    plain_split = plain.split(2, draws)
    ordered_split = ordered.split(2, draws)
    for (pm, ps), (om, os_) in zip(plain_split, ordered_split):
        for b in range(3):
            block = slice(b * BLOCK, (b + 1) * BLOCK)
            assert np.count_nonzero(pm[block]) == np.count_nonzero(om[block])
        assert os_.tolist() == ps.tolist()  # component draws in increasing order
    assert not np.array_equal(plain_split[0][0], ordered_split[0][0])  # slots permuted
    # the same draws asked for piecewise route the same way
    late = ordered.split(2, draws[BLOCK + 5 :])
    for (om, os_), (lm, ls) in zip(ordered_split, late):
        assert lm.tolist() == om[BLOCK + 5 :].tolist()
        assert ls.tolist() == os_[om[: BLOCK + 5].sum() :].tolist()


def test_draws_available_is_where_every_component_is_exhausted():
    half = node((0.5, 0.5))
    # alternating: 3 draws of each need 6 draws; 3 of one and 5 of the other, 10
    assert half.draws_available(0, [3, 3]) == 6
    assert half.draws_available(0, [3, 5]) == 10
    assert half.draws_available(0, [3, None]) is None
    assert half.draws_available(0, [0, 0]) == 0
    ordered = node((0.5, 0.5), order_seed=1)
    assert ordered.draws_available(0, [3, 3]) == BLOCK  # rounded up to whole blocks
    assert ordered.draws_available(0, [0, 0]) == 0


def test_checks_and_describe():
    with pytest.raises(PipelineError, match="got 2 datasets but 3 weights"):
        MixtureNode((SourceNode([1]), SourceNode([2])), (0.2, 0.3, 0.5))
    with pytest.raises(PipelineError, match="more than 2\\*\\*32"):
        node((0.5, 0.5)).split(0, np.array([MAX_DRAWS]))
    d = node((1 / 3, 2 / 3), order_seed=4).describe()
    assert d["weights"] == [0.333333333333, 0.666666666667]
    assert d["order_seed"] == 4 and d["transforms"] == [] and len(d["mix"]) == 2
