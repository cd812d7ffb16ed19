"""A lane's tally: what delivered rows count (tokens, segments, documents, epoch + 1 per
source), skipped steps, lazy snapshots, loading checks, and the row bookkeeping helpers."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.engine.accounting import (
    LazyTally,
    Tally,
    empty_tally,
    packed_rows,
    plain_tally,
    record_tokens,
    take_rows,
    whole_records,
)
from zephon_jax.engine.lane import Lane, LanePlan
from zephon_jax.errors import StateError
from zephon_jax.operators.pack import EmittedRows

LENGTHS = (3, 1, 2, 4)
RECORDS = [{"tokens": np.arange(n, dtype=np.int32)} for n in LENGTHS]


def whole_plan():
    return LanePlan(zj.Dataset.source(RECORDS).batch(2, num_lanes=1))


def test_record_tokens():
    assert record_tokens({"tokens": np.zeros(5)}) == 5
    assert record_tokens(np.zeros(7)) == 7
    assert record_tokens({"other": np.zeros(5)}) == 0
    assert record_tokens(3) == 0


def test_plan_kinds_and_empty_tally():
    plan = whole_plan()
    assert whole_records(plan) and not packed_rows(plan)
    assert empty_tally(plan) == (0, (0, 0, 0, 0), ())
    packed = LanePlan(zj.Dataset.source(RECORDS).split(2).pack(4).batch(2, num_lanes=1))
    assert packed_rows(packed) and not whole_records(packed)
    split_only = LanePlan(zj.Dataset.source(RECORDS).split(2).batch(2, num_lanes=1))
    assert not packed_rows(split_only) and not whole_records(split_only)


def test_delivered_whole_records_are_counted_and_pending_ones_are_not():
    plan = whole_plan()
    lane = Lane(plan, 0)
    tally = Tally(plan, 0)
    tally.made_rows(lane.take(), pending=0)  # records 0 and 1: 3 + 1 tokens, epoch 0
    snapshot = tally.snapshot(0)
    assert type(snapshot) is LazyTally
    assert plain_tally(snapshot) == (0, (4, 2, 2, 1), ())
    assert pickle.loads(pickle.dumps(snapshot)) == (0, (4, 2, 2, 1), ())
    assert snapshot == (0, (4, 2, 2, 1), ())
    tally.made_rows(lane.take(), pending=2)  # records 2 and 3 wait: not delivered
    assert plain_tally(tally.snapshot(2)) == (0, (4, 2, 2, 1), ())
    tally.fold(0)  # now delivered: 2 + 4 tokens
    assert tally.saved == (0, (10, 4, 4, 1), ())
    tally.made_rows(lane.take(), pending=2)  # second epoch: records 0 and 1 again
    tally.skipped(2, 0)  # they were taken by a skipped step: passed over
    assert tally.saved == (1, (10, 4, 4, 1), ())
    tally.made_rows(lane.take(), pending=0)  # records 2 and 3 of epoch 1
    tally.fold(0)
    assert tally.saved == (1, (16, 6, 6, 2), ())


def test_packed_rows_count_pieces_and_documents():
    # split(2) pieces: rec0 [0:2] [2:3], rec1 [0:1], ...; the first row of pack(4) holds
    # those three: 4 tokens, 3 segments, 2 documents (rec0 and rec1 begin there), epoch 0
    plan = LanePlan(zj.Dataset.source(RECORDS).split(2).pack(4).batch(1, num_lanes=1))
    lane = Lane(plan, 0)
    tally = Tally(plan, 0)
    rows = lane.take()
    assert rows[0].data["tokens_segment_ids"].tolist() == [1, 1, 2, 3]
    tally.made_rows(rows, pending=0)
    tally.fold(0)
    assert tally.saved == (0, (4, 3, 2, 1), ())


def test_undelivered_rows_are_passed_over():
    plan = whole_plan()
    lane = Lane(plan, 0)
    tally = Tally(plan, 0)
    tally.made_rows(lane.take(), pending=2)
    tally.undelivered(2, 0)
    assert tally.saved == (0, (0, 0, 0, 0), ()) and tally.rows == 0


def test_load_takes_a_matching_tally_and_refuses_another_pipelines():
    plan = whole_plan()
    tally = Tally(plan, 3)
    tally.load((2, (5, 1, 1, 1), ()), [])
    assert tally.saved == (2, (5, 1, 1, 1), ()) and tally.made == []
    with pytest.raises(StateError, match="lane 3: the state's accounting has 2 sources"):
        tally.load((0, (0,) * 8, ()), [])


def test_take_rows_splits_lineage_and_column_blocks():
    blocks = [["a", "b"], ["c", "d", "e"]]
    assert take_rows(blocks, 2) == ([["a", "b"]], [["c", "d", "e"]])
    assert take_rows(blocks, 3) == ([["a", "b"], ["c"]], [["d", "e"]])
    assert take_rows(blocks, 9) == (blocks, [])
    assert blocks == [["a", "b"], ["c", "d", "e"]]
    # a column block: rows 0..2 end after pieces 2, 3 and 5
    columns = EmittedRows(pieces=2, rows=1)  # grows as rows are added
    _emit(columns, [10, 11], [2])
    _emit(columns, [12, 13, 14], [3, 5])
    assert len(columns) == 3
    [first], [rest] = take_rows([columns], 2)
    assert [a.tolist() for a in first] == [[10, 11, 12], [1, 1, 1], [2, 3]]
    assert [a.tolist() for a in rest.head(len(rest))] == [[13, 14], [1, 1], [2]]
    (whole, head), after = take_rows([["a"], columns], 3)
    assert whole == ["a"] and head[2].tolist() == [2, 3] and len(after[0]) == 1
    assert [a.tolist() for a in take_rows([columns], 3)[0][0]] == [
        [10, 11, 12, 13, 14], [1, 1, 1, 1, 1], [2, 3, 5]
    ]  # fmt: skip
    # appending more rows leaves the first ones as they were (a snapshot counts them)
    _emit(columns, [15], [6])
    assert [a.tolist() for a in columns.head(3)] == [[10, 11, 12, 13, 14], [1] * 5, [2, 3, 5]]
    assert columns.head(4)[2].tolist() == [2, 3, 5, 6]


def test_a_log_grows_only_what_lacks_room_and_recodes_into_a_copy():
    log = EmittedRows(pieces=4, rows=2)
    _emit(log, [10, 11, 12], [3])
    log.grow_out(2)  # 3 + 2 pieces do not fit, 1 + 2 rows do not either
    assert log.out.shape[1] == 8 and len(log.row_end) == 4
    log.grow_out(2)  # both fit now: nothing grows
    assert log.out.shape[1] == 8 and len(log.row_end) == 4
    _emit(log, [13], [4, 4])
    log.grow_out(1)  # the rows lack room, the pieces do not
    assert log.out.shape[1] == 8 and len(log.row_end) == 8
    copy = log.recoded(lambda codes: codes + 100)
    assert [a.tolist() for a in copy.head(3)] == [[110, 111, 112, 113], [1] * 4, [3, 4, 4]]
    assert log.head(3)[0].tolist() == [10, 11, 12, 13]  # (a snapshot may read it)
    assert copy.out.shape == log.out.shape and len(copy.row_end) == len(log.row_end)


def _emit(log, codes, ends):
    """Appends pieces ``codes`` (length 1 each) and rows ending at ``ends`` to ``log``
    as the placement kernel does, growing it first if needed."""
    n, m = len(codes), len(ends)
    while log.size + n > log.out.shape[1] or log.rows + m > len(log.row_end):
        log.grow_out()
    log.out[:, log.size : log.size + n] = [codes, [0] * n, [1] * n, [0] * n]
    log.row_end[log.rows : log.rows + m] = ends
    log.size += n
    log.rows += m
