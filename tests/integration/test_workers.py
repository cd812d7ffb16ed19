"""Loader workers: the same batches and states for every worker count, and clean failures."""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.errors import WorkerError
from zephon_jax.workers import parent
from zephon_jax.workers.producer import StateAt
from zephon_jax.workers.protocol import Free

STEPS = 20
BAD_LENGTH = 77  # the record length on which failing_map raises


def make_docs(num_docs: int, max_len: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, size=num_docs)
    return [{"tokens": rng.integers(1, 1000, size=int(n)).astype(np.int32)} for n in lengths]


def add_one(record):
    return {"tokens": record["tokens"] + 1}


def failing_map(record):
    if len(record["tokens"]) == BAD_LENGTH:
        raise ValueError(f"record of length {BAD_LENGTH} is not allowed")
    return record


DOCS = make_docs(400, 200, seed=0)


def packing_pipeline(batch_size: int = 8) -> zj.BatchedDataset:
    return (
        zj.Dataset.source(DOCS)
        .shuffle(seed=1)
        .map(add_one)
        .split(64)
        .pack(64, method="first_fit", num_bins=4)
        .window_shuffle(3, seed=2)
        .batch(batch_size)
    )


def run(loader: zj.Loader, steps: int, start_state=None) -> tuple[list, list]:
    """``steps`` batches and the state after each; closes the workers."""
    it = iter(loader)
    try:
        if start_state is not None:
            it.set_state(start_state)
        batches, states = [], []
        for _ in range(steps):
            batches.append(next(it))
            states.append(it.get_state())
        return batches, states
    finally:
        it.close()


def assert_same_batches(actual: list, expected: list) -> None:
    assert len(actual) == len(expected)
    for t, (a, e) in enumerate(zip(actual, expected)):
        assert list(a) == list(e), f"batch {t}: fields differ"
        for k in e:
            assert a[k].dtype == e[k].dtype and a[k].shape == e[k].shape, f"batch {t} field {k}"
            assert a[k].tobytes() == e[k].tobytes(), f"batch {t} field {k} differs"


def assert_same_states(actual: list, expected: list) -> None:
    for t, (a, e) in enumerate(zip(actual, expected)):
        assert a["step"] == e["step"]
        assert list(a["lanes"]) == list(e["lanes"])
        for lane in e["lanes"]:
            assert a["lanes"][lane].tobytes() == e["lanes"][lane].tobytes(), (
                f"state {t} lane {lane}"
            )


@pytest.fixture(scope="module")
def reference():
    """The uninterrupted in-process run."""
    return run(zj.Loader(packing_pipeline()), STEPS)


def shm_names(prefix: str) -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}


# ----- determinism ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "num_workers, prefetch, start_method", [(1, 2, None), (2, 2, None), (2, 6, "spawn")]
)
def test_batches_and_states_identical_for_every_worker_count(
    reference, num_workers, prefetch, start_method
):
    loader = zj.Loader(
        packing_pipeline(),
        num_workers=num_workers,
        worker_prefetch=prefetch,
        worker_start_method=start_method,
    )
    assert loader.worker_start_method == (start_method or "forkserver")
    batches, states = run(loader, STEPS)
    assert_same_batches(batches, reference[0])
    assert_same_states(states, reference[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_workers_start_by_the_method_asked(start_method):
    """Spawned workers are this process's children; forked ones the fork server's."""
    it = iter(zj.Loader(packing_pipeline(), num_workers=1, worker_start_method=start_method))
    try:
        next(it)
        (pid,) = it._producer.worker_pids()
        with open(f"/proc/{pid}/status") as status:
            ppid = next(int(line.split()[1]) for line in status if line.startswith("PPid:"))
        assert (ppid == os.getpid()) == (start_method == "spawn")
    finally:
        it.close()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm to list segments")
def test_every_command_as_a_shared_memory_parcel(reference, monkeypatch):
    """Large loader messages (dataset, restore states) go through shared memory; here all do."""
    monkeypatch.setattr(parent, "INLINE_BYTES", 0)
    it = iter(zj.Loader(packing_pipeline(), num_workers=2, worker_prefetch=3))
    prefix = it._producer._prefix
    try:
        got = [next(it) for _ in range(6)]
        state = it.get_state()
        assert_same_states([state], [reference[1][5]])
        next(it)
        it.set_state(state)
        got += [next(it) for _ in range(4)]
        assert_same_batches(got, reference[0][:10])
    finally:
        it.close()
    assert not shm_names(prefix)  # every parcel read and removed


def test_process_rows_with_workers_match_global_rows(reference):
    ds = packing_pipeline()
    parts = [
        run(zj.Loader(ds, process_index=i, process_count=2, num_workers=2), 6)[0] for i in range(2)
    ]
    joined = [{k: np.concatenate([p[t][k] for p in parts]) for k in parts[0][t]} for t in range(6)]
    assert_same_batches(joined, reference[0][:6])


def test_state_taken_while_workers_are_ahead_restores_exactly(reference):
    loader = zj.Loader(packing_pipeline(), num_workers=2, worker_prefetch=4)
    it = iter(loader)
    try:
        for _ in range(7):
            next(it)
        time.sleep(0.3)  # let the workers fill their prefetch slots
        state = it.get_state()
        assert_same_states([state], [reference[1][6]])
        rest = [next(it) for _ in range(5)]
        assert_same_batches(rest, reference[0][7:12])
        it.set_state(state)  # rewind the same iterator while its workers are ahead again
        assert_same_batches([next(it) for _ in range(STEPS - 7)], reference[0][7:])
    finally:
        it.close()
    batches, states = run(zj.Loader(packing_pipeline(), num_workers=2), STEPS - 7, state)
    assert_same_batches(batches, reference[0][7:])
    assert_same_states(states, reference[1][7:])


@pytest.mark.parametrize("saved_with, restored_with", [(2, 0), (0, 2), (2, 1)])
def test_restore_into_a_different_worker_count(reference, saved_with, restored_with):
    _, states = run(zj.Loader(packing_pipeline(), num_workers=saved_with), 5)
    batches, _ = run(zj.Loader(packing_pipeline(), num_workers=restored_with), STEPS - 5, states[4])
    assert_same_batches(batches, reference[0][5:])


def test_end_of_finite_input_is_the_same_with_workers():
    ds = zj.Dataset.source(DOCS[:60]).repeat(1).pack(200, "first_fit", 2).batch(4)

    def all_batches(num_workers):
        it = iter(zj.Loader(ds, num_workers=num_workers))
        try:
            return list(it)
        finally:
            it.close()

    expected = all_batches(0)
    assert 0 < len(expected) < 60
    assert_same_batches(all_batches(2), expected)


def to_labelled(record):
    return {"label": f"doc{len(record['tokens'])}", "length": np.int16(len(record["tokens"]))}


def test_string_fields_and_array_rows_match():
    labelled = zj.Dataset.source(DOCS).shuffle(seed=4).map(to_labelled).batch(6, num_lanes=3)
    arrays = zj.Dataset.source([np.arange(3, dtype=np.float32) * i for i in range(50)]).batch(4)
    for ds in (labelled, arrays):
        expected, _ = run(zj.Loader(ds), 8)
        actual, _ = run(zj.Loader(ds, num_workers=2), 8)
        if isinstance(expected[0], dict):
            assert_same_batches(actual, expected)
        else:
            assert all(
                a.dtype == e.dtype and a.tobytes() == e.tobytes() for a, e in zip(actual, expected)
            )


def test_finite_input_ends_together_on_every_process_with_workers():
    ds = zj.Dataset.source(DOCS[:90]).repeat(1).split(64).pack(64, "best_fit", 2).batch(4)

    def process_run(index, num_workers):
        it = iter(zj.Loader(ds, process_index=index, process_count=2, num_workers=num_workers))
        try:
            batches, states = [], []
            for batch in it:
                batches.append(batch)
                states.append(it.get_state())
            return batches, states
        finally:
            it.close()

    for index in range(2):
        expected = process_run(index, 0)
        actual = process_run(index, 2)
        assert len(expected[0]) > 2
        assert_same_batches(actual[0], expected[0])
        assert_same_states(actual[1], expected[1])


def finite_pipeline() -> zj.BatchedDataset:
    return zj.Dataset.source(DOCS[:90]).repeat(1).split(64).pack(64, "best_fit", 2).batch(4)


def agree_on_end_with_others(monkeypatch, others_stop_at: int | None) -> None:
    """Makes loader iterators behave as one of several jax processes agreeing on the end of
    a finite input (one all-gather per step), the others' lanes completing every batch
    before global step ``others_stop_at`` (``None``: every batch)."""

    def processes_with_batch(self, have_batch: bool) -> tuple[bool, bool]:
        others = others_stop_at is None or self.step < others_stop_at
        return have_batch and others, have_batch or others

    monkeypatch.setattr(zj.loader.LoaderIterator, "_gathers_end", lambda self: True)
    monkeypatch.setattr(zj.loader.LoaderIterator, "_processes_with_batch", processes_with_batch)


@pytest.mark.parametrize("num_workers, prefetch", [(0, 1), (1, 1), (2, 1), (3, 4)])
@pytest.mark.parametrize("ends", ["others first", "here first"])
def test_a_batch_other_processes_could_not_complete_leaves_no_trace(
    monkeypatch, num_workers, prefetch, ends
):
    """Without device prefetch, with or without loader workers: after the StopIteration of
    the end the processes agreed on, this process's state, accounting and provenance are
    those of the last batch delivered, whether its own lanes completed the batch that was
    not delivered ("others first") or not ("here first"), also after further next()."""
    ds = finite_pipeline()
    everything = list(zj.Loader(ds))
    delivered = 6 if ends == "others first" else len(everything)
    assert 6 < len(everything)
    expected = iter(zj.Loader(ds))
    for _ in range(delivered):
        next(expected)
    agree_on_end_with_others(monkeypatch, 6 if ends == "others first" else None)
    it = iter(zj.Loader(ds, num_workers=num_workers, worker_prefetch=prefetch))
    try:
        assert_same_batches(list(it), everything[:delivered])
        for _ in range(2):
            assert_same_states([it.get_state()], [expected.get_state()])
            assert it.accounting() == expected.accounting()
            assert it.provenance() == expected.provenance()
            assert next(it, None) is None
    finally:
        it.close()


def test_a_state_the_workers_no_longer_keep_is_refused_at_once(reference):
    """Asked for the snapshots of a batch they dropped, the workers answer (no wait for a
    reply that never comes, no crash): a clear error, and the stream goes on."""
    it = iter(zj.Loader(packing_pipeline(), num_workers=2, worker_prefetch=2))
    try:
        got = [next(it) for _ in range(5)]
        producer = it._producer
        pids = producer.worker_pids()
        at = producer.state_at_last()
        start = time.monotonic()
        with pytest.raises(zj.PipelineError, match=r"loader worker 0 .* no longer keeps .* 1"):
            producer.snapshots_at(StateAt(at.generation, 1))
        assert time.monotonic() - start < 2
        assert producer.worker_pids() == pids and all(
            w.process.is_alive() for w in producer._workers
        )
        got += [next(it) for _ in range(3)]
        assert_same_batches(got, reference[0][:8])
        assert_same_states([it.get_state()], [reference[1][7]])
    finally:
        it.close()


def test_failed_restore_leaves_the_stream_unchanged(reference):
    it = iter(zj.Loader(packing_pipeline(), num_workers=2))
    try:
        for _ in range(3):
            next(it)
        bad = it.get_state()
        bad["lanes"] = dict(bad["lanes"])
        bad["lanes"]["6"] = np.frombuffer(b"\xff\x01junk", dtype=np.uint8)
        with pytest.raises(zj.ZephonError):
            it.set_state(bad)
        assert_same_batches([next(it) for _ in range(3)], reference[0][3:6])
    finally:
        it.close()


# ----- failures ------------------------------------------------------------------------


def test_worker_exception_is_raised_with_its_lane_and_traceback():
    ds = zj.Dataset.source(DOCS).map(failing_map).pack(256, "first_fit", 2).batch(8)
    in_process = iter(zj.Loader(ds))
    with pytest.raises(zj.RecordError) as expected:
        for _ in range(50):
            next(in_process)
    lane = re.search(r"lane (\d+)", str(expected.value)).group(1)
    it = iter(zj.Loader(ds, num_workers=2))
    try:
        start = time.perf_counter()
        with pytest.raises(zj.RecordError, match=rf"lane {lane}\b") as raised:
            for _ in range(50):
                next(it)
        assert time.perf_counter() - start < 30
        assert "loader worker" in "".join(getattr(raised.value, "__notes__", []))
        cause = str(raised.value.__cause__)
        assert "ValueError" in cause and f"length {BAD_LENGTH}" in cause and "failing_map" in cause
        with pytest.raises(WorkerError, match="set_state"):
            next(it)
    finally:
        it.close()


def test_state_of_the_last_batch_survives_a_failure_made_ahead():
    """Workers keep the lanes' snapshots and send them when asked: a worker that already
    failed on a later batch still answers for the batch handed out."""
    docs = [{"tokens": np.full(BAD_LENGTH if i == 1500 else 10, i, np.int32)} for i in range(2000)]
    ds = zj.Dataset.source(docs).map(failing_map).pack(256, "first_fit", 2).batch(4, num_lanes=2)
    in_process = iter(zj.Loader(ds))
    good, states = [], []
    with pytest.raises(zj.RecordError):
        for _ in range(50):
            good.append(next(in_process))
            states.append(in_process.get_state())
    assert len(good) >= 2
    it = iter(zj.Loader(ds, num_workers=2, worker_prefetch=4))
    try:
        assert_same_batches([next(it) for _ in range(len(good) - 1)], good[:-1])
        time.sleep(0.5)  # the workers run ahead into the failing record
        assert_same_states([it.get_state()], [states[-2]])
        with pytest.raises(zj.RecordError):
            for _ in range(50):
                next(it)
    finally:
        it.close()


def test_killed_worker_raises_within_bounded_time_and_restore_restarts_it(reference):
    it = iter(zj.Loader(packing_pipeline(), num_workers=2))
    try:
        next(it)
        state = it.get_state()
        os.kill(it._producer.worker_pids()[1], signal.SIGKILL)
        start = time.perf_counter()
        with pytest.raises(WorkerError, match=r"loader worker 1 \(lanes 4-7.*SIGKILL"):
            for _ in range(STEPS):
                next(it)
        assert time.perf_counter() - start < 2  # seen through the process sentinel, not a poll
        it.set_state(state)
        assert_same_batches([next(it) for _ in range(3)], reference[0][1:4])
    finally:
        it.close()
    if os.path.isdir("/dev/shm"):  # a worker killed while creating a segment leaves none behind
        assert not shm_names(it._producer._prefix)


def test_unpicklable_dataset_names_the_cause_and_the_fix():
    ds = zj.Dataset.source(DOCS).map(lambda r: r).batch(4)
    with pytest.raises(zj.PipelineError, match="module level.*num_workers=0"):
        iter(zj.Loader(ds, num_workers=1))


class RebuildFails:
    """A map function that pickles but cannot be rebuilt in a worker."""

    def __call__(self, record):
        return record

    def __reduce__(self):
        return (fail_to_rebuild, ())


def fail_to_rebuild():
    raise RuntimeError("this function cannot be rebuilt here")


def test_dataset_that_does_not_unpickle_in_the_worker_raises_a_clear_error():
    ds = zj.Dataset.source(DOCS).map(RebuildFails()).batch(4)
    it = iter(zj.Loader(ds, num_workers=1))
    try:
        with pytest.raises(zj.PipelineError, match="could not unpickle the dataset") as raised:
            next(it)
        assert "cannot be rebuilt here" in str(raised.value)
    finally:
        it.close()


# ----- resources ------------------------------------------------------------------------


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm to list segments")
def test_close_stops_workers_and_leaves_no_shared_memory():
    it = iter(zj.Loader(packing_pipeline(), num_workers=2, worker_prefetch=3))
    producer = it._producer
    prefix = producer._prefix
    for _ in range(5):
        next(it)
    time.sleep(0.2)
    processes = [w.process for w in producer._workers]
    os.kill(processes[0].pid, signal.SIGKILL)  # a dead worker's segments are released too
    producer.close()
    producer.close()  # idempotent
    assert not shm_names(prefix)
    assert all(p._closed for p in processes)
    with pytest.raises(WorkerError, match="closed"):
        next(it)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm to list segments")
def test_worker_killed_before_reading_the_dataset_leaves_no_shared_memory():
    it = iter(zj.Loader(packing_pipeline(), num_workers=1))
    producer = it._producer
    prefix = producer._prefix
    assert shm_names(prefix)  # the dataset, waiting for the worker
    os.kill(producer.worker_pids()[0], signal.SIGKILL)
    with pytest.raises(WorkerError, match="while starting.*SIGKILL"):
        next(it)
    it.close()
    assert not shm_names(prefix)


def test_garbage_collection_stops_the_workers():
    it = iter(zj.Loader(packing_pipeline(), num_workers=2))
    next(it)
    pids = it._producer.worker_pids()
    del it
    gc.collect()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# ----- faults: a worker killed mid-batch, a hung worker ---------------------------------


class StallWhenFlagged:
    """A map that returns its record, except in the worker whose pid is written in the
    file ``flag``: there it notes it is inside the map (``flag``.stalled) and waits
    until the file is removed. Deterministic and the same in every worker: the
    stall comes from outside, like a stuck read."""

    def __init__(self, flag: str):
        self.flag = flag

    def __call__(self, record):
        while True:
            try:
                with open(self.flag) as f:
                    pid = int(f.read())
            except (FileNotFoundError, ValueError):
                return record
            if pid != os.getpid():
                return record
            open(self.flag + ".stalled", "w").close()
            time.sleep(0.01)


def stalling_pipeline(flag: str) -> zj.BatchedDataset:
    return (
        zj.Dataset.source(DOCS)
        .shuffle(seed=1)
        .map(StallWhenFlagged(flag))
        .split(64)
        .pack(64, method="first_fit", num_bins=4)
        .batch(8)
    )


def wait_for(path, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.01)


def kill_when(path: str, pid: int) -> None:
    wait_for(path)
    os.kill(pid, signal.SIGKILL)


def run_until_error(it, limit: int) -> tuple[list, list, BaseException | None, float]:
    """Batches and the state after each until an error (or ``limit`` batches), as a
    training loop that saves every step; the error and the seconds the failing call
    (``next`` or ``get_state``) took."""
    batches, states = [], []
    for _ in range(limit):
        for call in (lambda: batches.append(next(it)), lambda: states.append(it.get_state())):
            start = time.monotonic()
            try:
                call()
            except WorkerError as e:
                return batches, states, e, time.monotonic() - start
    return batches, states, None, 0.0


@pytest.mark.parametrize("fault", ["killed", "map hangs", "stopped"])
def test_worker_killed_or_hung_mid_batch_fails_clearly_and_resumes_exactly(tmp_path, fault):
    """A worker killed (SIGKILL, as by the out-of-memory killer) inside a map, or hung in
    one (or stopped with SIGSTOP): the loader raises a WorkerError naming the worker, its
    pid and the cause within a bounded time (at once for a death, ``worker_timeout_s``
    for a hang); the batches delivered before it are the uninterrupted run's, none twice
    or skipped; the state after the last of them resumes exactly."""
    flag = str(tmp_path / "stall")
    reference = run(zj.Loader(stalling_pipeline(flag)), 50)[0]
    timeout = 3.0
    it = iter(
        zj.Loader(
            stalling_pipeline(flag), num_workers=2, worker_prefetch=2, worker_timeout_s=timeout
        )
    )
    try:
        first = next(it)  # both workers are up
        states = [it.get_state()]
        pid = it._producer.worker_pids()[1]
        if fault == "stopped":
            os.kill(pid, signal.SIGSTOP)
        else:
            with open(flag + ".tmp", "w") as f:
                f.write(str(pid))
            os.replace(flag + ".tmp", flag)
        if fault == "killed":  # once worker 1 is inside the map, making a batch
            killer = threading.Thread(target=kill_when, args=(flag + ".stalled", pid))
            killer.start()
        batches, more_states, error, took = run_until_error(it, 40)
        assert error is not None, "the fault went unnoticed"
        message = str(error)
        assert re.search(rf"loader worker 1 \(lanes 4-7, pid {pid}\)", message), message
        assert "set_state" in message
        if fault == "killed":
            killer.join()
            assert "SIGKILL" in message and "out-of-memory" in message and "num_workers" in message
            assert took < 2
        else:
            assert f"sent nothing for {timeout:g} s (worker_timeout_s)" in message
            assert "worker_timeout_s=" in message and "it was killed" in message
            assert timeout - 0.5 < took < timeout + 3
            with pytest.raises(ProcessLookupError):  # the hung worker was killed
                for _ in range(100):
                    os.kill(pid, 0)
                    time.sleep(0.05)
        delivered = [first, *batches]
        assert_same_batches(delivered, reference[: len(delivered)])
        states += more_states  # one per batch, or one fewer if get_state found the fault
        assert len(delivered) - 1 <= len(states) <= len(delivered)
        if os.path.exists(flag):
            os.remove(flag)
        it.set_state(states[-1])  # restarts the worker
        assert it._producer.worker_pids()[1] != pid
        resumed = [next(it) for _ in range(4)]
        assert_same_batches(resumed, reference[len(states) : len(states) + 4])
    finally:
        it.close()


def test_a_worker_that_reads_none_of_its_commands_is_not_waited_for_forever():
    """A stopped worker reads none of the loader's commands: once they fill its pipe, the
    loader waits ``worker_timeout_s`` for room, not for ever; the worker is killed and
    the next call names it."""
    timeout = 1.0
    it = iter(zj.Loader(packing_pipeline(), num_workers=2, worker_prefetch=2))
    worker = None
    try:
        next(it)  # both workers are up
        worker = it._producer._workers[1]
        worker.timeout_s = timeout  # as Loader(worker_timeout_s=1.0), without a slow start
        os.kill(worker.pid, signal.SIGSTOP)
        done = threading.Event()

        def flood():  # far more than a pipe holds
            for _ in range(20_000):
                worker.send(Free(0, 0, 0))
                if not worker.process.is_alive():
                    break
            done.set()

        threading.Thread(target=flood, daemon=True).start()
        assert done.wait(timeout + 10), "a write to a worker that reads nothing never returned"
        with pytest.raises(WorkerError) as raised:
            for _ in range(10):
                next(it)
        message = str(raised.value)
        assert f"loader worker 1 (lanes 4-7, pid {worker.pid})" in message
        assert f"read none of the loader's messages for {timeout:g} s" in message
        assert "it was killed" in message and "set_state" in message
    finally:
        if worker is not None and worker.process.is_alive():
            os.kill(worker.pid, signal.SIGKILL)
        it.close()


@pytest.mark.parametrize("bad", [0, -1.0, "5", True])
def test_worker_timeout_must_be_positive_seconds_or_none(bad):
    with pytest.raises(zj.PipelineError, match="worker_timeout_s needs a number of seconds"):
        zj.Loader(packing_pipeline(), num_workers=1, worker_timeout_s=bad)
    assert zj.Loader(packing_pipeline(), worker_timeout_s=None).worker_timeout_s is None


WORKERS_FROM_ANOTHER_CWD = """
import sys

sys.path.insert(0, {root!r})  # as an installed zephon_jax would be found
import numpy as np

import zephon_jax as zj

if __name__ == "__main__":
    docs = [{{"x": np.arange(3) + i}} for i in range(32)]
    it = iter(zj.Loader(zj.Dataset.source(docs).shuffle(0).batch(4), num_workers=2))
    print(next(it)["x"].shape, zj.__file__)
    it.close()
"""


def test_workers_ignore_a_zephon_jax_folder_in_the_cwd(tmp_path):
    """Spawned workers import the package their parent uses, even when the working
    directory holds a folder named ``zephon_jax`` (the clone, seen from its parent)."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(zj.__file__)))
    (tmp_path / "zephon_jax").mkdir()
    (tmp_path / "zephon_jax" / "__init__.py").write_text("")
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "run.py"
    script.write_text(WORKERS_FROM_ANOTHER_CWD.format(root=root))
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["(4,", "3)", zj.__file__]


BREAK_WARM_UP = """
from zephon_jax.core import compiled_kernels


def fail():
    raise RuntimeError("numba could not be set up here")


compiled_kernels.warm_up = fail  # what the fork server's SERVER_MODULE calls next
"""

WITH_BROKEN_SERVER = """
import multiprocessing as mp

import numpy as np

import zephon_jax as zj

if __name__ == "__main__":
    mp.set_forkserver_preload(["break_warm_up"])  # runs in the server before the package's
    docs = [{"tokens": np.arange(i % 50 + 1, dtype=np.int32)} for i in range(300)]
    ds = zj.Dataset.source(docs).shuffle(seed=0).split(16).pack(32).batch(8)
    expected = [b["tokens"].tobytes() for b, _ in zip(zj.Loader(ds), range(6))]
    got = [b["tokens"].tobytes() for b, _ in zip(zj.Loader(ds, num_workers=2), range(6))]
    assert got == expected
    print("same batches")
"""


def test_workers_start_where_the_fork_server_cannot_set_numba_up(tmp_path):
    """A fork server whose set-up of numba raises still forks the workers (each sets numba
    up itself): the batches are the in-process ones."""
    (tmp_path / "break_warm_up.py").write_text(BREAK_WARM_UP)
    program = tmp_path / "program.py"
    program.write_text(WITH_BROKEN_SERVER)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(root)]))
    done = subprocess.run(
        [sys.executable, str(program)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "same batches" in done.stdout
