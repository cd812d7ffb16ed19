"""``window_shuffle``: a buffer of ``window`` elements per lane; the ``c``-th new element
evicts the slot a keyed hash of ``(seed, lane, c)`` names; output is a permutation of the
input that never moves an element forward by more than the window; the carry holds at most
``window`` elements and round-trips through ``save``/``load``."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_jax.core.lineage import Element
from zephon_jax.core.permutation import derive_key, hash_u64
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.operators.base import Saved
from zephon_jax.operators.window_shuffle import WindowShuffleOperator


def _run(op, n, lane=0, carry=None, start=0):
    carry = op.init(lane) if carry is None else carry
    out = []
    for i in range(start, n):
        carry, emitted = op.step(carry, Element(i, i))
        assert len(carry.buffer) <= op.window  # the carry bound
        out += [e.data for e in emitted]
    return carry, out


@pytest.mark.parametrize("window, n", [(1, 5), (3, 2), (4, 50), (7, 300)])
def test_output_is_a_permutation_delayed_at_most_the_window(window, n):
    op = WindowShuffleOperator(window, seed=5)
    carry, out = _run(op, n)
    assert len(out) == max(0, n - window)  # one out per element once the buffer is full
    _, rest = op.flush(carry)
    order = out + [e.data for e in rest]
    assert sorted(order) == list(range(n))
    for index, record in enumerate(order):
        assert index >= record - window  # never earlier than the window allows


def test_evicted_slots_are_the_keyed_hash_by_hand():
    window, seed, lane = 3, 11, 2
    op = WindowShuffleOperator(window, seed)
    _, out = _run(op, 8, lane=lane)
    key = derive_key(seed, lane)
    buffer, expected = [0, 1, 2], []
    for c, record in enumerate(range(3, 8)):
        slot = int(hash_u64(np.array([c], np.uint64), key)[0] % np.uint64(window))
        expected.append(buffer[slot])
        buffer[slot] = record
    assert out == expected


def test_lanes_and_seeds_shuffle_differently():
    def order(seed, lane):
        op = WindowShuffleOperator(8, seed)
        carry, out = _run(op, 64, lane=lane)
        return out + [e.data for e in op.flush(carry)[1]]

    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(1, 1)
    assert order(1, 0) != order(2, 0)


def test_saved_carry_continues_the_same_order():
    op = WindowShuffleOperator(4, seed=3)
    carry, first = _run(op, 10)
    saved = op.save(carry)
    assert len(saved.held) == 4 and saved.aux == 6
    restored = op.load(Saved(saved.held, saved.aux), 0)
    _, tail = _run(op, 20, carry=restored, start=10)
    _, straight = _run(op, 20)
    assert first + tail == straight


@pytest.mark.parametrize("held, count", [(5, 0), (1, -1), (1, "2")])
def test_load_refuses_altered_carries(held, count):
    op = WindowShuffleOperator(4, seed=0)
    elements = tuple(Element(i, i) for i in range(held))
    with pytest.raises(StateError, match="the state was altered"):
        op.load(Saved(elements, count), 0)


def test_arguments_and_descriptions():
    op = WindowShuffleOperator(4, seed=9)
    assert op.passthrough and op.max_held == 4
    assert op.describe() == "window_shuffle(window=4, seed=9)"
    assert op.carry_bound() == "4 element pointers"
    with pytest.raises(PipelineError, match=r"window_shuffle\(window\) needs a positive int"):
        WindowShuffleOperator(0, seed=0)
