"""One lane: ``take()`` returns the lane's rows of its next step (lane ``l`` of ``L``
reads record ``p*L + l`` at position ``p`` of an unshuffled source), elements keep their
lineages, a finite input ends with ``None``, and ``get_state``/``check_state``/
``set_lane_state`` round-trip a lane's place."""

from __future__ import annotations

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.engine.lane import Lane, LanePlan, take_lanes
from zephon_jax.engine.restore import set_lane_state
from zephon_jax.errors import StateError

RECORDS = [{"x": np.array([i], np.int32)} for i in range(6)]


def plus_ten(record):
    return {"x": record["x"] + 10}


def xs(elements):
    return [int(e.data["x"][0]) for e in elements]


def test_lanes_take_their_rows_position_by_position():
    plan = LanePlan(zj.Dataset.source(RECORDS).batch(4, num_lanes=2))
    lane0, lane1 = Lane(plan, 0), Lane(plan, 1)
    first = lane0.take()
    assert xs(first) == [0, 2] and [e.lineage for e in first] == [0, 1]
    assert xs(lane1.take()) == [1, 3]
    assert xs(lane0.take()) == [4, 0]  # the second epoch starts at position 3
    assert lane0.step == 2
    assert xs(lane1.take(3)) == [5, 1, 3]


def test_transforms_run_on_each_record():
    plan = LanePlan(zj.Dataset.source(RECORDS).map(plus_ten).batch(2, num_lanes=1))
    assert xs(Lane(plan, 0).take()) == [10, 11]


def test_operators_give_derived_lineages():
    docs = [{"x": np.arange(n, dtype=np.int32)} for n in (3, 1)]
    plan = LanePlan(zj.Dataset.source(docs).split(2, key="x").batch(3, num_lanes=1))
    rows = Lane(plan, 0).take()
    assert [e.data["x"].tolist() for e in rows] == [[0, 1], [2], [0]]
    assert [e.lineage for e in rows] == [((0,), 0), ((0,), 1), ((1,), 0)]


def test_a_finite_input_ends_with_none():
    plan = LanePlan(zj.Dataset.source(RECORDS).repeat(1).batch(4, num_lanes=2))
    lane = Lane(plan, 0)
    assert xs(lane.take()) == [0, 2]
    assert lane.take() is None  # record 4 alone cannot fill the step's 2 rows
    assert lane.take() is None


def test_state_round_trips_into_a_fresh_lane():
    plan = LanePlan(zj.Dataset.source(RECORDS).window_shuffle(2, seed=0).batch(2, num_lanes=2))
    lane = Lane(plan, 1)
    lane.take()
    state = lane.get_state()
    assert isinstance(state, bytes)
    snapshot = lane.check_state(state)
    assert (snapshot.next_position, snapshot.step) == (lane.next_position, 1)
    fresh = Lane(plan, 1)
    set_lane_state(fresh, state)
    assert fresh.step == 1
    assert xs(fresh.take()) == xs(lane.take())


def test_check_state_refuses_damaged_bytes_and_changes_nothing():
    plan = LanePlan(zj.Dataset.source(RECORDS).batch(2, num_lanes=1))
    lane = Lane(plan, 0)
    lane.take()
    state = bytearray(lane.get_state())
    state[-1] ^= 0xFF
    with pytest.raises(StateError):
        lane.check_state(bytes(state))
    assert lane.step == 1 and xs(lane.take()) == [2, 3]


def test_take_lanes_takes_from_each_lane():
    plan = LanePlan(zj.Dataset.source(RECORDS).batch(6, num_lanes=3))
    taken = take_lanes({l: Lane(plan, l) for l in (2, 0)}, 2)
    assert {l: xs(rows) for l, rows in taken.items()} == {2: [2, 5], 0: [0, 3]}
