"""``random_map``: the generator is seeded from the seed and the record's lane, stage and
lineage only: the same key gives the same draws; any part changed gives others."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_jax.core.lineage import Opaque
from zephon_jax.core.permutation import derive_key
from zephon_jax.transforms.random_map import RandomMapTransform, flatten_ints


def draw(record, rng):
    return record, rng.integers(0, 2**62, 4).tolist()


class GrainRandom:
    def random_map(self, record, rng):
        return rng.random()


def test_flatten_ints_marks_tuples_by_their_length():
    assert flatten_ints(7, []) == [7]
    assert flatten_ints(((3, 4), 1), []) == [-3, -3, 3, 4, 1]
    assert flatten_ints((np.int64(2),), []) == [-2, 2]
    assert flatten_ints(((3,), 4), []) != flatten_ints((3, 4), [])
    opaque = flatten_ints(Opaque("x"), [])
    assert len(opaque) == 1 and opaque == flatten_ints(Opaque("x"), [])


def test_the_generator_is_keyed_by_seed_lane_stage_and_lineage():
    t = RandomMapTransform(draw, seed=3)
    _, draws = t.apply("r", (1, 2, ((5,), 0)))
    key = derive_key(3, 1, 2, -3, -2, 5, 0)
    assert draws == np.random.Generator(np.random.Philox(key=key)).integers(0, 2**62, 4).tolist()


@pytest.mark.parametrize(
    "other", [(0, 2, ((5,), 0)), (1, 3, ((5,), 0)), (1, 2, ((5,), 1)), (1, 2, ((6,), 0)), (1, 2, 5)]
)
def test_any_part_of_the_key_changes_the_draws(other):
    t = RandomMapTransform(draw, seed=3)
    base = t.apply("r", (1, 2, ((5,), 0)))
    assert t.apply("r", (1, 2, ((5,), 0))) == base
    assert t.apply("r", other)[1] != base[1]
    assert RandomMapTransform(draw, seed=4).apply("r", (1, 2, ((5,), 0)))[1] != base[1]


def test_grain_objects_and_names():
    value = RandomMapTransform(GrainRandom(), seed=1).apply(None, (0, 0, 0))
    assert 0 <= value < 1
    assert RandomMapTransform(draw, seed=7).describe() == f"random_map({__name__}.draw, seed=7)"
    with pytest.raises(TypeError, match="random_map needs a callable"):
        RandomMapTransform(1, seed=0)
