"""``Loader`` on a tiny in-memory dataset, in this process: argument checks, which rows
and lanes a process holds (``process_rows`` by hand), and the iterator's contract
(batches, the end of a finite input, ``get_state``/``set_state``, ``provenance``)."""

from __future__ import annotations

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.errors import PipelineError, StateMismatchError
from zephon_jax.loader import process_rows

RECORDS = [{"x": np.array([i], np.int32)} for i in range(8)]
# 2 lanes of 2 rows: lane 0 reads records 0, 2, 4, ...; lane 1 records 1, 3, 5, ...
ENDLESS = zj.Dataset.source(RECORDS).batch(4, num_lanes=2)
FINITE = zj.Dataset.source(RECORDS).repeat(1).batch(4, num_lanes=2)


def xs(batch):
    return batch["x"].ravel().tolist()


@pytest.mark.parametrize(
    "size, index, count, rows",
    [
        (8, 0, 1, range(0, 8)),
        (8, 1, 2, range(4, 8)),
        (12, 2, 4, range(6, 9)),
        (4, 3, 4, range(3, 4)),
    ],
)
def test_process_rows_by_hand(size, index, count, rows):
    assert process_rows(size, index, count) == rows


@pytest.mark.parametrize(
    "size, index, count, match",
    [
        (8, 2, 2, r"process_index must be in \[0, 2\); got 2"),
        (8, -1, 2, "process_index must be in"),
        (8, 0, 0, "process_count needs a positive int"),
        (6, 0, 4, "process_count=4 cannot hold global_batch_size=6 evenly"),
    ],
)
def test_process_rows_refuses_bad_topologies(size, index, count, match):
    with pytest.raises(PipelineError, match=match):
        process_rows(size, index, count)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_workers": -1}, "num_workers must be an int >= 0; got -1"),
        ({"num_workers": True}, "num_workers must be an int >= 0"),
        ({"device_prefetch": -1}, "device_prefetch must be an int >= 0"),
        ({"worker_timeout_s": 0}, "worker_timeout_s needs a number of seconds > 0"),
        ({"worker_start_method": "thread"}, r"worker_start_method must be one of \[.*'spawn'"),
        ({"process_index": 0, "process_count": 3}, "process_count=3 cannot hold"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(PipelineError, match=match):
        zj.Loader(ENDLESS, **kwargs)


def test_an_unbatched_dataset_is_refused():
    with pytest.raises(PipelineError, match=r"finish the pipeline with \.batch"):
        zj.Loader(zj.Dataset.source(RECORDS))


def test_rows_and_lanes_of_each_process():
    first = zj.Loader(ENDLESS, process_index=0, process_count=2)
    second = zj.Loader(ENDLESS, process_index=1, process_count=2)
    assert list(first.rows) == [0, 1] and list(second.rows) == [2, 3]
    assert first.lanes == [0] and second.lanes == [1]
    assert list(first.rows_of_process(1)) == [2, 3]
    assert first.lanes_to_save() == [0] and second.lanes_to_save() == [1]
    # a finite input: every process runs every lane, each lane saved once
    finite = zj.Loader(FINITE, process_index=1, process_count=4)
    assert finite.lanes == [0, 1] and list(finite.rows) == [1]
    assert finite.lanes_to_save() == []  # lane 0 (row 1) is saved by process 0


def test_batches_and_the_processes_parts():
    it = iter(zj.Loader(ENDLESS))
    assert [xs(next(it)) for _ in range(2)] == [[0, 2, 1, 3], [4, 6, 5, 7]]
    part = iter(zj.Loader(ENDLESS, process_index=1, process_count=2))
    assert [xs(next(part)) for _ in range(2)] == [[1, 3], [5, 7]]


def test_a_finite_input_stops():
    it = iter(zj.Loader(FINITE))
    assert [xs(b) for b in it] == [[0, 2, 1, 3], [4, 6, 5, 7]]
    with pytest.raises(StopIteration):
        next(it)


def test_state_round_trip_continues_where_it_left_off():
    it = iter(zj.Loader(ENDLESS))
    next(it)
    state = it.get_state()
    assert state["step"] == 1
    expected = [xs(next(it)) for _ in range(3)]
    again = iter(zj.Loader(ENDLESS))
    again.set_state(state)
    assert again.step == 1
    assert [xs(next(again)) for _ in range(3)] == expected


def test_a_state_of_another_pipeline_is_refused_and_changes_nothing():
    it = iter(zj.Loader(ENDLESS))
    next(it)
    other = iter(zj.Loader(zj.Dataset.source(RECORDS).batch(2, num_lanes=2)))
    next(other)
    with pytest.raises(StateMismatchError):
        it.set_state(other.get_state())
    assert xs(next(it)) == [4, 6, 5, 7]


def test_provenance_needs_a_batch_first():
    it = iter(zj.Loader(ENDLESS))
    with pytest.raises(PipelineError, match=r"call next\(\) first"):
        it.provenance()
    next(it)
    assert [row[0]["record"] for row in it.provenance()] == [0, 2, 1, 3]
    it.set_state(it.get_state())
    with pytest.raises(PipelineError, match="just restored"):
        it.provenance()
