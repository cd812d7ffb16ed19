"""The worker loop (:func:`worker_main`), run in a thread of the test and driven through
its pipes as the loader drives it: it announces its lanes, makes batches ahead into free
slots, keeps and sends snapshots, restores, ends, reports failures and stops."""

from __future__ import annotations

import gc
import itertools
import multiprocessing as mp
import os
import pickle
import signal
import threading

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.engine.rows import RowProducer, encode_snapshots
from zephon_jax.state.global_state import make_state
from zephon_jax.workers.child import worker_main
from zephon_jax.workers.pipes import FrameReader, Readable
from zephon_jax.workers.protocol import (
    AskStates,
    Batch,
    End,
    Failed,
    Free,
    LoadDataset,
    Ready,
    Restore,
    Restored,
    States,
    Stop,
    decode,
    send,
)
from zephon_jax.workers.shared_slots import SlotReader

RECORDS = [{"x": np.array([i], np.int32)} for i in range(12)]
# 2 lanes of 2 rows: lane 0 reads records 0, 2, 4, ...; lane 1 records 1, 3, 5, ...
ENDLESS = zj.Dataset.source(RECORDS).batch(4, num_lanes=2)
FINITE = zj.Dataset.source(RECORDS[:8]).repeat(1).batch(4, num_lanes=2)
ROWS = [0, 1, 2, 3]
_prefixes = itertools.count()


def fails_on_five(record):
    if int(record["x"][0]) == 5:
        raise ValueError("five is not allowed")
    return record


class Child:
    """:func:`worker_main` in a thread, with the loader's ends of its pipes and its slots."""

    def __init__(self, rows, lanes, prefetch):
        self.prefix = f"zjtest{os.getpid()}c{next(_prefixes)}_"
        commands_in, self.commands = mp.Pipe(duplex=False)
        self.results, results_out = mp.Pipe(duplex=False)
        self.ends = [commands_in, results_out]
        self.thread = threading.Thread(
            target=worker_main,
            args=(rows, lanes, prefetch, self.prefix, commands_in, results_out),
            daemon=True,
        )
        self.thread.start()
        self.reader = FrameReader(self.results.fileno())
        self.readable = Readable(self.results)
        self.slots = SlotReader(self.prefix, prefetch)

    def send(self, message) -> None:
        send(self.commands, message)

    def receive(self, timeout_s: float = 20.0):
        """The worker's next message (a batch's slot is attached, as the loader does)."""
        while True:
            frame = self.reader.next()
            if frame is not None:
                message = decode(frame)
                if isinstance(message, Batch):
                    self.slots.attach(message.slot, message.layout)
                return message
            assert self.readable.wait(timeout_s), "the worker sent nothing"

    def silent(self, wait_s: float = 0.3) -> bool:
        """Whether the worker sends nothing within ``wait_s``."""
        return self.reader.next() is None and not self.readable.wait(wait_s)

    def batch(self, slot: int) -> np.ndarray:
        return self.slots.views(slot)["x"].copy()

    def close(self) -> None:
        if self.commands is not None:
            self.commands.close()  # the worker reads the end of its commands: it stops
            self.commands = None
        self.thread.join(20)
        assert not self.thread.is_alive(), "the worker did not stop"
        self.slots.close()
        for end in [self.results, *self.ends]:
            end.close()


@pytest.fixture
def start(monkeypatch):
    """Starts a worker thread; ``worker_main`` sets signals only on the main thread, so
    its call is recorded instead. Undoes the worker's ``gc.freeze`` afterwards."""
    calls = []
    monkeypatch.setattr(signal, "signal", lambda *args: calls.append(args))
    children = []

    def start_child(dataset, rows=ROWS, lanes=(0, 1), prefetch=2, payload=None):
        child = Child(rows, list(lanes), prefetch)
        children.append(child)
        child.send(LoadDataset(pickle.dumps(dataset) if payload is None else payload))
        child.signal_calls = calls
        return child

    yield start_child
    for child in children:
        child.close()
        if os.path.isdir("/dev/shm"):
            assert not [n for n in os.listdir("/dev/shm") if n.startswith(child.prefix)]
    gc.unfreeze()


def in_process(dataset, steps: int, rows=ROWS):
    """The batches and encoded lane states (before the first, after each) in-process."""
    producer = RowProducer(dataset, rows)
    states = [encode_snapshots(producer.lane_snapshots())]
    batches = []
    for _ in range(steps):
        batches.append(producer.next_batch()["x"].copy())
        states.append(encode_snapshots(producer.lane_snapshots()))
    return batches, states


def test_ready_then_batches_ahead_into_every_free_slot(start):
    child = start(ENDLESS)
    batches, states = in_process(ENDLESS, 3)
    ready = child.receive()
    assert type(ready) is Ready and encode_snapshots(ready.snapshots) == states[0]
    assert child.signal_calls == [(signal.SIGINT, signal.SIG_IGN)]
    first, second = child.receive(), child.receive()
    assert (first.generation, first.index, first.slot, first.rows) == (0, 1, 1, True)
    assert first.layout.segment == f"{child.prefix}1_0"
    assert (second.generation, second.index, second.slot) == (0, 2, 0)
    assert child.batch(1).ravel().tolist() == [0, 2, 1, 3]
    assert child.batch(0).ravel().tolist() == [4, 6, 5, 7]
    assert child.batch(1).tobytes() == batches[0].tobytes()
    assert child.silent()  # both slots are taken
    child.send(Free(0, 1, 0))
    third = child.receive()
    assert third == Batch(0, 3, 1, True, None)  # the slot's layout is unchanged
    assert child.batch(1).tobytes() == batches[2].tobytes()
    assert child.batch(1).ravel().tolist() == [8, 10, 9, 11]


def test_snapshots_are_sent_when_asked_and_kept_from_keep_from(start):
    child = start(ENDLESS)
    _, states = in_process(ENDLESS, 3)
    child.receive(), child.receive(), child.receive()  # ready, batches 1 and 2
    for index in (0, 2, 1):
        child.send(AskStates(0, index))
        answer = child.receive()
        assert type(answer) is States and (answer.generation, answer.index) == (0, index)
        assert encode_snapshots(answer.snapshots) == states[index]
    child.send(AskStates(7, 1))  # another generation's: no answer
    assert child.silent()
    child.send(Free(0, 1, 2))  # drops the snapshots before batch 2
    assert child.receive().index == 3
    child.send(AskStates(0, 3))
    assert encode_snapshots(child.receive().snapshots) == states[3]
    child.send(AskStates(0, 2))
    assert encode_snapshots(child.receive().snapshots) == states[2]


def test_restore_starts_a_generation_from_the_state(start):
    child = start(ENDLESS)
    batches, states = in_process(ENDLESS, 4)
    child.receive(), child.receive(), child.receive()  # ready, batches 1 and 2
    state = make_state(ENDLESS.fingerprint(), 1, states[1])
    child.send(Restore(1, state))
    restored = child.receive()
    assert type(restored) is Restored and restored.generation == 1
    assert encode_snapshots(restored.snapshots) == states[1]
    assert child.silent()  # its slots still hold the batches made before
    child.send(Free(0, 1, 0))
    child.send(Free(0, 0, 0))
    made = [child.receive(), child.receive()]
    assert [(b.generation, b.index) for b in made] == [(1, 1), (1, 2)]
    assert [child.batch(b.slot).tobytes() for b in made] == [b.tobytes() for b in batches[1:3]]
    child.send(AskStates(1, 2))
    assert encode_snapshots(child.receive().snapshots) == states[3]


def test_a_failed_restore_is_reported_and_waits_for_another(start):
    child = start(ENDLESS, prefetch=3)
    _, states = in_process(ENDLESS, 1)
    assert type(child.receive()) is Ready
    assert [child.receive().index for _ in range(3)] == [1, 2, 3]
    bad = make_state(ENDLESS.fingerprint(), 1, states[1])
    bad["lanes"]["1"] = np.frombuffer(b"\xff\x01junk", np.uint8)
    child.send(Restore(1, bad))
    failed = child.receive()
    assert type(failed) is Failed and failed.generation == 1
    assert failed.error.summary.startswith("StateError: ")
    assert "lane 1" in failed.error.summary
    child.send(Free(0, 0, 0))
    assert child.silent()  # a free slot, but it makes nothing until restored
    child.send(Restore(2, make_state(ENDLESS.fingerprint(), 1, states[1])))
    assert type(child.receive()) is Restored
    batch = child.receive()
    assert (batch.generation, batch.index, batch.slot) == (2, 1, 0)
    assert child.batch(0).ravel().tolist() == [4, 6, 5, 7]


def test_the_end_of_a_finite_input_sends_the_lanes_after_it(start):
    child = start(FINITE, prefetch=4)
    producer = RowProducer(FINITE, ROWS)
    expected = [producer.next_batch()["x"].ravel().tolist() for _ in range(2)]
    assert producer.next_batch() is None
    assert type(child.receive()) is Ready
    made = [child.receive(), child.receive()]
    assert [child.batch(b.slot).ravel().tolist() for b in made] == expected
    end = child.receive()
    assert type(end) is End and end.generation == 0
    assert encode_snapshots(end.snapshots) == encode_snapshots(producer.lane_snapshots())
    assert child.silent()  # free slots, but the input ended


def test_a_worker_without_rows_announces_empty_batches(start):
    child = start(ENDLESS, rows=[], lanes=[1])  # runs lane 1; its rows are not asked for
    assert list(child.receive().snapshots) == [1]
    batch = child.receive()
    assert batch == Batch(0, 1, 1, False, None)
    assert child.slots.layouts[1] is None  # nothing was written


def test_a_failing_record_is_reported_as_in_process(start):
    dataset = zj.Dataset.source(RECORDS).map(fails_on_five).batch(4, num_lanes=2)
    with pytest.raises(zj.RecordError) as expected:
        RowProducer(dataset, ROWS).next_batch()
    child = start(dataset)
    assert type(child.receive()) is Ready
    failed = child.receive()
    assert type(failed) is Failed and failed.generation == 0
    assert failed.error.summary == f"RecordError: {expected.value}"
    assert "record 5" in failed.error.summary and "lane 1" in failed.error.summary
    assert "five is not allowed" in failed.error.traceback
    error = pickle.loads(failed.error.pickled)
    assert type(error) is zj.RecordError and str(error) == str(expected.value)
    child.send(Free(0, 1, 0))
    assert child.silent()


def test_a_dataset_that_does_not_unpickle_fails_every_generation(start):
    child = start(None, payload=b"not a pickle")
    failed = child.receive()
    assert type(failed) is Failed and failed.generation is None
    assert failed.error.summary.startswith(
        "PipelineError: a loader worker could not unpickle the dataset: UnpicklingError"
    )
    assert "num_workers=0" in failed.error.summary
    child.thread.join(20)
    assert not child.thread.is_alive()


def test_stop_before_the_dataset_ends_it_silently(monkeypatch):
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    child = Child(ROWS, [0, 1], 2)
    try:
        child.send(Stop())
        child.thread.join(20)
        assert not child.thread.is_alive()
        assert child.silent(0.0)
    finally:
        child.close()


def test_stop_and_a_closed_pipe_end_the_loop(start):
    stopped = start(ENDLESS)
    closed = start(ENDLESS)
    for child in (stopped, closed):
        assert type(child.receive()) is Ready
        child.receive(), child.receive()
    stopped.send(Stop())
    closed.commands.close()
    closed.commands = None
    for child in (stopped, closed):
        child.thread.join(20)
        assert not child.thread.is_alive()
