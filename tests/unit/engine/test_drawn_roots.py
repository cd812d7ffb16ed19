"""DrawnRoots: a mixture lane's draws by index, in one array that views taken earlier
keep seeing unchanged."""

from __future__ import annotations

import numpy as np

from zephon_jax.engine.drawn_roots import DrawnRoots
from zephon_jax.sampler.scheduled_mixture import draw_table


def _filled(n: int) -> DrawnRoots:
    roots = DrawnRoots()
    roots.extend(draw_table([(i, i % 2, 10 + i) for i in range(n)]))
    return roots


def test_draws_are_read_by_index_as_tuples_and_columns():
    roots = _filled(100)  # past the first capacity: it grew
    assert len(roots) == 100 and roots.end == 100
    assert roots.tuples([0, 99, 5]) == [(0, 0, 10), (99, 1, 109), (5, 1, 15)]
    assert roots.view().columns(np.array([3, 4])).tolist() == [[3, 4], [1, 0], [13, 14]]


def test_keeping_some_draws_renumbers_them_before_the_next_index():
    """The kept draws take the last indices before the next draw's, in order; a view
    taken before still reads the old numbering."""
    roots = _filled(100)
    before = roots.view()
    first = roots.keep_only(np.array([3, 40, 41, 99]))
    assert first == 96 and roots.base == 96 and len(roots) == 4 and roots.end == 100
    assert roots.tuples([96, 97, 98, 99]) == [(3, 1, 13), (40, 0, 50), (41, 1, 51), (99, 1, 109)]
    assert roots.limit == 8  # the next pass once twice the kept draws are held
    roots.extend(draw_table([(100, 0, 110)] * 200))  # writes and grows after the pass
    assert roots.tuples([100]) == [(100, 0, 110)]
    assert before.columns(np.arange(100))[2].tolist() == list(range(10, 110))


def test_a_kernel_appends_after_size_and_growing_keeps_the_draws():
    roots = _filled(3)
    roots.array[:, roots.size] = (3, 1, 13)  # as draw_place writes the next draw
    roots.size += 1
    roots.grow(1000)
    assert roots.array.shape[1] >= 1004
    assert roots.tuples(range(4)) == [(0, 0, 10), (1, 1, 11), (2, 0, 12), (3, 1, 13)]


def test_keeping_every_draw_or_none():
    roots = _filled(10)
    assert roots.keep_only(np.arange(10)) == 0
    assert roots.base == 0 and len(roots) == 10 and roots.limit == 20
    assert roots.tuples([9]) == [(9, 1, 19)]
    assert roots.keep_only(np.zeros(0, np.int64)) == 10
    assert len(roots) == 0 and roots.end == 10


def test_a_view_reads_its_draws_as_tuples_after_the_roots_grow_and_drop():
    roots = _filled(10)
    view = roots.view()
    roots.extend(draw_table([(50, 1, 60)] * 300))  # grows into a new array
    roots.keep_only(np.array([200]))
    assert view.tuples([9, 0]) == [(9, 1, 19), (0, 0, 10)]
    assert roots.tuples([309]) == [(50, 1, 60)]
