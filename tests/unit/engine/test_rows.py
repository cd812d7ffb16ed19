"""``RowProducer``: the chosen global rows of each batch, in the order given, from the
lanes that own them (lane ``l`` owns rows ``[l*R, (l+1)*R)``); which lanes run; stacking
rows; the state round trip; and the row checks."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.core.packed import PackedRow, PackSpec
from zephon_jax.engine.rows import (
    RowProducer,
    checked_rows,
    lanes_to_run,
    rows_by_size,
    stack_rows,
)
from zephon_jax.engine.token_rows import RunRow
from zephon_jax.errors import PipelineError
from zephon_jax.operators.token_bins import TokenRow
from zephon_jax.state.global_state import make_state

RECORDS = [{"x": np.array([i], np.int32)} for i in range(8)]
# 2 lanes of 2 rows: lane 0 reads records 0, 2, 4, ...; lane 1 records 1, 3, 5, ...
ENDLESS = zj.Dataset.source(RECORDS).batch(4, num_lanes=2)
FINITE = zj.Dataset.source(RECORDS).repeat(1).batch(4, num_lanes=2)


def xs(rows):
    return [int(r["x"][0]) for r in rows]


def test_picks_rows_of_two_lanes_in_the_order_asked():
    producer = RowProducer(ENDLESS, [3, 0])
    assert producer.lane_ids == [0, 1]
    assert xs(producer.next_rows()) == [3, 0]  # lane 1's second row, lane 0's first
    assert producer.last_picks() == [(1, 1), (0, 0)]  # (lane, lineage)
    assert xs(producer.next_rows()) == [7, 4]
    assert producer.last_picks() == [(1, 3), (0, 2)]
    picks = producer.last_picks()
    assert len(picks) == 2 and picks[0] == (1, 3) and list(picks) == [(1, 3), (0, 2)]


def test_only_the_owning_lanes_run_for_an_endless_input():
    producer = RowProducer(ENDLESS, [2, 3])
    assert producer.lane_ids == [1]
    assert xs(producer.next_rows()) == [1, 3]
    assert lanes_to_run(ENDLESS, [0, 3]) == [0, 1]
    assert lanes_to_run(FINITE, [3]) == [0, 1]  # a finite input: every lane, to end together
    assert lanes_to_run(FINITE, [3], agree_on_end=False) == [1]


def test_next_batch_stacks_rows_and_ends_with_the_input():
    producer = RowProducer(FINITE, [0, 1, 2, 3])
    first = producer.next_batch()
    assert first["x"].tolist() == [[0], [2], [1], [3]]
    assert producer.next_batch()["x"].ravel().tolist() == [4, 6, 5, 7]
    assert producer.next_batch() is None
    with pytest.raises(PipelineError, match="call next"):
        producer.provenance()


def test_state_round_trip_continues_the_same_rows():
    producer = RowProducer(ENDLESS, [1, 2])
    producer.next_rows()
    state = make_state(ENDLESS.fingerprint(), producer.step, producer.lane_states())
    expected = [xs(producer.next_rows()) for _ in range(3)]
    again = RowProducer(ENDLESS, [1, 2])
    again.restore(state)
    assert again.step == 1
    assert [xs(again.next_rows()) for _ in range(3)] == expected


def test_stack_rows():
    batch = stack_rows([{"a": np.array([1, 2]), "b": 3}, {"a": np.array([4, 5]), "b": 6}])
    assert batch["a"].tolist() == [[1, 2], [4, 5]] and batch["b"].tolist() == [3, 6]
    assert stack_rows([np.array([1]), np.array([2])]).tolist() == [[1], [2]]
    with pytest.raises(PipelineError, match=r"rows of one batch have different fields: \['a'\]"):
        stack_rows([{"a": 1}, {"b": 2}])


def test_row_checks():
    assert checked_rows(ENDLESS, [np.int64(3), 0]) == [3, 0]
    with pytest.raises(PipelineError, match="row 4 is outside the global batch of 4"):
        checked_rows(ENDLESS, [4])
    with pytest.raises(PipelineError, match="row -1 is outside"):
        RowProducer(ENDLESS, [-1])
    assert rows_by_size(ENDLESS, [2]) == {4: [2]}
    assert rows_by_size(ENDLESS, lambda size: range(size // 2)) == {4: [0, 1]}
    assert rows_by_size(ENDLESS, {4: [3]}) == {4: [3]}


def test_stack_rows_assembles_packed_rows_among_plain_ones_together():
    spec = PackSpec(4, "pack")
    calls = []

    class CountedRow(PackedRow):
        @staticmethod
        def assemble_batch(rows, pool=None):
            calls.append(len(rows))
            return None  # the general assembly

    packed = [CountedRow(spec, ("t",), [np.array([k, k + 1])], (2,)) for k in range(3)]
    plain_row = {"t": np.array([7, 7, 7, 0]), "t_segment_ids": np.array([1, 1, 1, 0])}
    plain_row["t_positions"] = np.array([0, 1, 2, 0])
    batch = stack_rows([packed[0], plain_row, packed[1], packed[2]])
    assert calls == [3]  # one assembly for the three packed rows, not one each
    assert batch["t"].tolist() == [[0, 1, 0, 0], [7, 7, 7, 0], [1, 2, 0, 0], [2, 3, 0, 0]]
    assert batch["t_segment_ids"].tolist()[0] == [1, 1, 0, 0]


def test_the_picks_keep_no_row_alive_and_give_the_rows_lineages():
    """The batch's picks keep what makes each lineage (plain data the collector stops
    tracking), not the rows, which die with the batch; the lineages are the rows' own
    (those the general path gives)."""
    docs = [np.arange(1 + (i * 29) % 70, dtype=np.int32) for i in range(200)]
    sources = [zj.Dataset.source([{"tokens": d} for d in docs[k::2]]) for k in range(2)]
    ds = zj.Dataset.mix(sources, [0.5, 0.5], unit="tokens").split(32).pack(32).batch(4)
    producer = RowProducer(ds, [3, 0, 2])
    for _ in range(3):
        producer.next_rows()
    gc.collect()
    # Rows made ahead wait as the placements' runs, with no element each until taken.
    assert sum(len(lane.pending) for lane in producer.lanes.values()) > 0
    assert not any(type(o) in (RunRow, TokenRow) for o in gc.get_objects())
    picks = producer.last_picks()
    gc.collect()  # the inner tuples are untracked first, then the tuples holding them
    assert not any(gc.is_tracked(v) for v in picks._values)
    previous = zj.set_compiled(False)
    try:
        general = RowProducer(ds, [3, 0, 2])
        for _ in range(3):
            general.next_rows()
        assert general.plan.columnar is None and producer.plan.columnar is not None
        assert picks == general.last_picks()
    finally:
        zj.set_compiled(previous)
