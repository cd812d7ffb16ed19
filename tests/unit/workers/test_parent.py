"""The loader's handle on one worker process: starting it, the dataset as a parcel, its
messages and slots, a death or a silence named with its cause, the worker's errors raised
in the loader, and a shutdown that leaves nothing behind."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
from multiprocessing import shared_memory

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.engine.rows import RowProducer, encode_snapshots
from zephon_jax.errors import PipelineError, WorkerError
from zephon_jax.workers import parent
from zephon_jax.workers.parent import (
    RemoteTraceback,
    Worker,
    describe_lanes,
    pickle_dataset,
    raise_worker_error,
    shutdown_all,
)
from zephon_jax.workers.protocol import AskStates, Batch, ErrorReport, Ready, States, Stop

RECORDS = [{"x": np.array([i], np.int32)} for i in range(12)]
# 2 lanes of 2 rows: lane 0 reads records 0, 2, 4, ...; lane 1 records 1, 3, 5, ...
ENDLESS = zj.Dataset.source(RECORDS).batch(4, num_lanes=2)
ROWS = [0, 1, 2, 3]


def shm_names(prefix: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


@pytest.fixture
def start():
    """Starts workers over ``ENDLESS`` (spawned, as the loader does); shuts them down after
    the test and checks that they left no shared memory."""
    prefix = f"zjtest{os.getpid()}p_"
    workers: list[Worker] = []

    def start_worker(timeout_s=20.0, prefetch=2):
        worker = Worker(
            mp.get_context("spawn"),
            len(workers),
            0,
            prefix,
            pickle.dumps(ENDLESS),
            ROWS,
            [0, 1],
            prefetch,
            timeout_s,
        )
        workers.append(worker)
        return worker

    yield start_worker
    shutdown_all(workers)
    assert not shm_names(prefix)


def in_process(steps: int) -> tuple[list[bytes], list[dict]]:
    producer = RowProducer(ENDLESS, ROWS)
    states = [encode_snapshots(producer.lane_snapshots())]
    batches = []
    for _ in range(steps):
        batches.append(producer.next_batch()["x"].tobytes())
        states.append(encode_snapshots(producer.lane_snapshots()))
    return batches, states


def receive_batch(worker: Worker) -> tuple[Batch, bytes]:
    batch = worker.receive()
    assert type(batch) is Batch
    worker.slots.attach(batch.slot, batch.layout)
    return batch, worker.slots.views(batch.slot)["x"].tobytes()


def test_lanes_described():
    assert describe_lanes([5]) == "lane 5"
    assert describe_lanes([0, 1, 2, 3]) == "lanes 0-3"
    assert describe_lanes(range(4, 6)) == "lanes 4-5"
    assert describe_lanes([0, 2, 4]) == "lanes 0, 2, 4"


def test_remote_traceback_reads_as_the_workers():
    remote = RemoteTraceback("Traceback ...\nValueError: x")
    assert remote.text == "Traceback ...\nValueError: x"
    assert str(remote) == "\n\nin the loader worker:\nTraceback ...\nValueError: x"


class Described:
    """Stands for a worker in the error messages."""

    def describe(self) -> str:
        return "loader worker 3 (lanes 6-7, pid 99)"


def test_a_worker_exception_is_raised_with_a_note_and_its_traceback():
    report = ErrorReport(
        "KeyError: 'x'", "Traceback (remote)\nKeyError: 'x'", pickle.dumps(KeyError("x"))
    )
    with pytest.raises(KeyError) as raised:
        raise_worker_error(Described(), report)
    assert raised.value.args == ("x",)
    assert raised.value.__notes__ == [
        "(raised in loader worker 3 (lanes 6-7, pid 99); its traceback is the cause above)"
    ]
    cause = raised.value.__cause__
    assert type(cause) is RemoteTraceback and cause.text == "Traceback (remote)\nKeyError: 'x'"


class Interrupted(BaseException):
    """Not an ``Exception``: the loader does not raise it as the worker's error."""


@pytest.mark.parametrize(
    "pickled",
    [None, b"not a pickle", pickle.dumps(Interrupted("stop"))],
    ids=["none", "junk", "base"],
)
def test_an_exception_that_cannot_be_raised_here_becomes_a_worker_error(pickled):
    report = ErrorReport("Odd: it broke", "Traceback (remote)", pickled)
    with pytest.raises(WorkerError) as raised:
        raise_worker_error(Described(), report)
    assert str(raised.value) == "loader worker 3 (lanes 6-7, pid 99) failed: Odd: it broke"
    assert raised.value.__cause__.text == "Traceback (remote)"


def test_the_dataset_pickles_or_the_error_names_the_fix():
    restored = pickle.loads(pickle_dataset(ENDLESS, "spawn"))
    assert RowProducer(restored, ROWS).next_batch()["x"].ravel().tolist() == [0, 2, 1, 3]
    unpicklable = zj.Dataset.source(RECORDS).map(lambda r: r).batch(4)
    with pytest.raises(PipelineError, match=r"start method 'forkserver'.*module level") as raised:
        pickle_dataset(unpicklable, "forkserver")
    assert "num_workers=0" in str(raised.value)


class Stops:
    def __init__(self, fails: bool):
        self.fails, self.stopped = fails, False

    def shutdown(self) -> None:
        if self.fails:
            raise OSError("cannot stop")
        self.stopped = True


def test_shutdown_all_goes_on_past_a_failure():
    workers = [Stops(False), Stops(True), Stops(False)]
    shutdown_all(workers)
    assert [w.stopped for w in workers] == [True, False, True]


def test_a_worker_reads_the_dataset_parcel_and_makes_the_in_process_batches(start, monkeypatch):
    monkeypatch.setattr(parent, "INLINE_BYTES", 0)  # every command goes as a parcel
    batches, states = in_process(5)
    worker = start()
    assert worker.describe() == f"loader worker 0 (lanes 0-1, pid {worker.pid})"
    assert worker.parcels == [f"{worker.prefix}p0"]  # the dataset, not yet read
    ready = worker.receive()
    assert type(ready) is Ready and encode_snapshots(ready.snapshots) == states[0]
    with pytest.raises(FileNotFoundError):  # the worker read the dataset and removed it
        shared_memory.SharedMemory(name=f"{worker.prefix}p0")
    assert worker.parcels == []  # a ready worker read every parcel
    first, second = receive_batch(worker), receive_batch(worker)
    assert [first[1], second[1]] == batches[:2]
    worker.free(first[0])
    third = receive_batch(worker)
    assert third[0].index == 3 and third[0].slot == first[0].slot and third[1] == batches[2]
    worker.send(AskStates(0, 3))  # goes as a parcel too
    answer = worker.receive()
    assert type(answer) is States and encode_snapshots(answer.snapshots) == states[3]
    # Batches read ahead of their turn, then dropped (a restore): their slots are freed.
    worker.pending.extend([second[0], third[0]])
    worker.drop_pending()
    assert not worker.pending
    assert [receive_batch(worker)[1] for _ in range(2)] == batches[3:5]


def test_shutdown_stops_the_process_and_is_idempotent(start):
    worker = start()
    assert type(worker.receive()) is Ready
    receive_batch(worker)
    process, pid = worker.process, worker.pid
    worker.shutdown()
    assert worker.commands is None and worker.results is None
    with pytest.raises(ValueError, match="closed"):
        process.is_alive()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    worker.shutdown()
    assert not shm_names(worker.prefix)


def test_a_killed_worker_is_named_with_its_signal(start):
    worker = start()
    assert type(worker.receive()) is Ready
    worker.ready = True
    os.kill(worker.pid, signal.SIGKILL)
    with pytest.raises(WorkerError) as raised:
        while True:  # the batches it made before dying come first
            assert type(worker.receive()) is Batch
    message = str(raised.value)
    assert message.startswith(
        f"loader worker 0 (lanes 0-1, pid {worker.pid}) died unexpectedly (signal SIGKILL "
        "(killed, possibly by the out-of-memory killer"
    )
    assert "set_state(...)" in message and "while starting" not in message
    worker.send(Stop())  # a dead worker's pipe: no error


def test_a_worker_that_dies_while_starting_says_so(start):
    worker = start()
    os.kill(worker.pid, signal.SIGKILL)
    with pytest.raises(WorkerError, match=r"died unexpectedly while starting .*if __name__"):
        worker.receive()


def test_a_silent_worker_is_killed_after_its_timeout(start):
    worker = start()
    assert type(worker.receive()) is Ready
    worker.ready, worker.timeout_s = True, 0.5
    receive_batch(worker), receive_batch(worker)  # its slots are full: it waits for a free
    with pytest.raises(WorkerError) as raised:
        worker.receive()
    message = str(raised.value)
    assert message.startswith(
        f"loader worker 0 (lanes 0-1, pid {worker.pid}) sent nothing for 0.5 s "
        "(worker_timeout_s) while making a batch or answering the loader"
    )
    assert "it was killed" in message and "worker_timeout_s=" in message
    assert worker.process.exitcode == -signal.SIGKILL


def test_a_worker_stopped_while_starting_is_killed_after_its_timeout(start):
    worker = start(timeout_s=0.5)
    os.kill(worker.pid, signal.SIGSTOP)
    with pytest.raises(
        WorkerError, match=r"sent nothing for 0.5 s \(worker_timeout_s\) while starting"
    ):
        worker.receive()
    assert worker.process.exitcode == -signal.SIGKILL  # a stopped process is killed too
