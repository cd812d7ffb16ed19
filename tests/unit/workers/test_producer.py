"""``WorkerRowProducer``: the in-process producer's batches and states from worker processes,
states kept in the workers and fetched on demand, restores, the end of a finite input,
a worker's error raised in the loader, argument checks and ``close``; workers forked from a
fork server that loaded the package, or spawned."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from multiprocessing import forkserver

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.engine.rows import RowProducer, encode_snapshots
from zephon_jax.errors import PipelineError, WorkerError
from zephon_jax.state.global_state import make_state
from zephon_jax.workers.producer import (
    DEFAULT_START_METHOD,
    SERVER_MODULE,
    StateAt,
    WorkerRowProducer,
    worker_context,
)

RECORDS = [{"x": np.array([i, i * i], np.int32), "w": np.float32(i) / 4} for i in range(40)]
# 4 lanes of 2 rows: lane l owns global rows 2l and 2l + 1.
ENDLESS = zj.Dataset.source(RECORDS).shuffle(seed=3).batch(8, num_lanes=4)
FINITE = zj.Dataset.source(RECORDS[:20]).repeat(1).batch(8, num_lanes=4)
ROWS = [7, 0, 5, 2, 1, 6, 3, 4]  # scattered over both workers' lanes


def fails_on_13(record):
    if int(record["x"][0]) == 13:
        raise ValueError("thirteen is not allowed")
    return record


def as_bytes(batch) -> list:
    return [(k, v.dtype.str, v.shape, v.tobytes()) for k, v in batch.items()]


def shm_names(prefix: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


@pytest.fixture
def make():
    """Makes worker producers (2 workers, by the default start method); closes them after the test and checks
    that their processes ended and left no shared memory."""
    producers: list[WorkerRowProducer] = []

    def make_producer(dataset=ENDLESS, rows=ROWS, **kwargs):
        producer = WorkerRowProducer(dataset, rows, kwargs.pop("num_workers", 2), **kwargs)
        producers.append(producer)
        return producer

    yield make_producer
    for producer in producers:
        pids = producer.worker_pids()
        producer.close()
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        assert not shm_names(producer._prefix)


@pytest.mark.parametrize("start_method", [DEFAULT_START_METHOD, "spawn"])
def test_batches_and_states_are_the_in_process_ones(make, start_method):
    reference = RowProducer(ENDLESS, ROWS)
    producer = make(prefetch=2, start_method=start_method)
    assert producer.num_workers == 2 and producer.lane_ids == [0, 1, 2, 3]
    assert len(set(producer.worker_pids())) == 2
    assert producer.lane_states() == reference.lane_states()  # before the first batch
    for step in range(6):
        assert producer.rows == ROWS and producer.step == step
        expected = reference.next_batch()
        assert as_bytes(producer.next_batch()) == as_bytes(expected)
        assert producer.lane_states() == reference.lane_states()


def test_state_kept_in_the_workers_restores_exactly(make):
    reference = RowProducer(ENDLESS, ROWS)
    expected, states = [], [reference.lane_states()]
    for _ in range(7):
        expected.append(as_bytes(reference.next_batch()))
        states.append(reference.lane_states())
    producer = make(prefetch=3)
    for _ in range(3):
        producer.next_batch()
    assert producer.state_at_last() == StateAt(0, 3)
    assert producer.snapshots_before_last().keys() == {0, 1, 2, 3}
    state = make_state(ENDLESS.fingerprint(), 3, producer.lane_states())
    assert {int(l): a.tobytes() for l, a in state["lanes"].items()} == states[3]
    producer.keep_states_from(2)
    assert [as_bytes(producer.next_batch()) for _ in range(2)] == expected[3:5]
    producer.restore(state)
    assert producer.step == 3 and producer.state_at_last() == StateAt(1, 0)
    with pytest.raises(PipelineError, match="no batch was handed out since"):
        producer.snapshots_before_last()
    assert producer.lane_states() == states[3]
    assert [as_bytes(producer.next_batch()) for _ in range(4)] == expected[3:7]
    with pytest.raises(PipelineError, match="before the last restore"):
        producer.snapshots_at(StateAt(0, 2))


def test_snapshots_at_an_earlier_batch_come_from_the_workers(make):
    reference = RowProducer(ENDLESS, ROWS)
    states = [reference.lane_states()]
    for _ in range(3):
        reference.next_batch()
        states.append(reference.lane_states())
    producer = make(prefetch=2)
    producer.keep_states_from(1)
    producer.next_batch()
    at = producer.state_at_last()
    producer.next_batch(), producer.next_batch()
    assert at == StateAt(0, 1)
    assert encode_snapshots(producer.snapshots_at(at)) == states[1]
    assert encode_snapshots(producer.snapshots_before_last()) == states[2]


def test_the_end_of_a_finite_input_is_the_in_process_one(make):
    reference = RowProducer(FINITE, ROWS)
    expected = []
    while (batch := reference.next_batch()) is not None:
        expected.append(as_bytes(batch))
    assert len(expected) == 2
    producer = make(FINITE, prefetch=4)
    assert [as_bytes(producer.next_batch()) for _ in range(2)] == expected
    assert producer.next_batch() is None
    assert producer.lane_states() == reference.lane_states()
    assert producer.next_batch() is None  # and stays ended


def test_a_worker_error_names_the_record_and_stops_the_producer(make):
    dataset = zj.Dataset.source(RECORDS).map(fails_on_13).batch(8, num_lanes=4)
    with pytest.raises(zj.RecordError) as expected:
        reference = RowProducer(dataset, ROWS)
        for _ in range(10):
            reference.next_batch()
    assert "record 13" in str(expected.value)
    producer = make(dataset)
    with pytest.raises(zj.RecordError) as raised:
        for _ in range(10):
            producer.next_batch()
    assert str(raised.value) == str(expected.value)
    lane = int(str(expected.value).split("on lane ")[1].split(",")[0])
    worker = lane // 2  # lanes 0-1 in worker 0, lanes 2-3 in worker 1
    assert raised.value.__notes__[-1].startswith(f"(raised in loader worker {worker} (lanes ")
    assert "thirteen is not allowed" in str(raised.value.__cause__)
    with pytest.raises(WorkerError, match=rf"loader worker {worker} .*failed.*set_state"):
        producer.next_batch()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_workers": 0}, r"num_workers >= 1; got 0"),
        ({"num_workers": True}, r"num_workers >= 1; got True"),
        ({"num_workers": 2, "prefetch": 0}, r"worker_prefetch must be an int >= 1; got 0"),
        ({"num_workers": 2, "prefetch": 1.5}, r"worker_prefetch must be an int >= 1; got 1.5"),
        ({"num_workers": 2, "timeout_s": -1}, r"worker_timeout_s needs a number of seconds > 0"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(PipelineError, match=message):
        WorkerRowProducer(ENDLESS, ROWS, **kwargs)


def test_no_rows_and_an_unpicklable_dataset_are_refused_before_starting():
    with pytest.raises(PipelineError, match="at least one row"):
        WorkerRowProducer(ENDLESS, [], 2)
    unpicklable = zj.Dataset.source(RECORDS).map(lambda r: r).batch(8, num_lanes=4)
    with pytest.raises(PipelineError, match="cannot be pickled.*module level"):
        WorkerRowProducer(unpicklable, ROWS, 2)


def test_close_ends_the_workers_and_later_calls_say_so(make):
    producer = make(num_workers=3)  # 3 workers for 4 lanes: blocks of 2, 1 and 1
    assert producer.num_workers == 3
    producer.next_batch()
    pids = producer.worker_pids()
    producer.close()
    producer.close()  # idempotent
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not shm_names(producer._prefix)
    for call in (producer.next_batch, producer.lane_snapshots):
        with pytest.raises(WorkerError, match="this producer is closed"):
            call()
    with pytest.raises(WorkerError, match="closed"):
        producer.restore(
            make_state(ENDLESS.fingerprint(), 0, RowProducer(ENDLESS, ROWS).lane_states())
        )


def _parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("PPid:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_are_forked_from_a_server_that_loaded_the_package_and_numba(make):
    assert DEFAULT_START_METHOD == "forkserver"  # Linux has a fork server
    producer = make()
    producer.next_batch()
    servers = {_parent_pid(pid) for pid in producer.worker_pids()}
    assert len(servers) == 1 and os.getpid() not in servers  # not this process's children
    (server,) = servers
    with open(f"/proc/{server}/maps") as maps:
        mapped = maps.read()
    assert "numba/_dispatcher" in mapped  # imported before the fork, by SERVER_MODULE


def test_the_fork_server_keeps_the_modules_the_program_asked_it_to_load():
    asked = list(forkserver._forkserver._preload_modules)
    try:
        mp.set_forkserver_preload(["json"])
        worker_context("forkserver")
        assert forkserver._forkserver._preload_modules == ["json", SERVER_MODULE]
        worker_context("forkserver")  # asked once
        assert forkserver._forkserver._preload_modules == ["json", SERVER_MODULE]
        worker_context("spawn")
        assert forkserver._forkserver._preload_modules == ["json", SERVER_MODULE]
    finally:
        mp.set_forkserver_preload(asked)
