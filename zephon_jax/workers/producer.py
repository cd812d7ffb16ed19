"""Loader worker processes: lanes split across processes, batches through shared memory.

:class:`WorkerRowProducer` is a :class:`~zephon_jax.engine.rows.Producer`. Worker
``k`` runs a :class:`~zephon_jax.engine.rows.RowProducer` over a contiguous block
of the needed lanes, produces up to ``prefetch`` batches ahead into its ring of
shared-memory slots (:mod:`zephon_jax.workers.shared_slots`) and announces each with a
:class:`Batch` message. The loader copies each worker's rows into their places
in the batch.

Lanes, not data, are split, and every lane runs the same code as in-process, so
batches and states are byte-identical for every worker count, including 0.
A worker keeps its lanes' snapshots after every batch it made that the loader
may still ask about, and sends them only when asked (:meth:`lane_snapshots`,
i.e. ``get_state``): batches carry no state.

Parent and workers talk in the named messages below, one per class, through
one pipe each way per worker. Both sides write their messages themselves (no
feeder threads: a worker busy in Python would delay them by the interpreter's
switch interval), each in one system call, and read everything waiting at once
(:mod:`zephon_jax.workers.pipes`); the two messages of every batch (:class:`Batch`,
:class:`Free`) are packed by hand rather than pickled, and a worker reads its
commands once per batch. The loader's writes are small and never block: it sends the
dataset and restore states, which may be large, as a :class:`Parcel` in shared
memory. A worker's death is seen at once through its process sentinel.
"""

from __future__ import annotations

import collections
import functools
import gc
import itertools
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import secrets
import select
import signal
import struct
import threading
import time
import traceback
import weakref
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from zephon_jax.core.checks import timeout_seconds
from zephon_jax.core.gc_pause import paused_gc
from zephon_jax.core.packed import OutputPool
from zephon_jax.engine.rows import (
    RowProducer,
    RowsOfSize,
    encode_snapshots,
    lanes_to_run,
    rows_by_size,
    stack_rows,
)
from zephon_jax.errors import PipelineError, WorkerError, add_note
from zephon_jax.state.global_state import EXCLUDE, exclusion_of, lane_bytes
from zephon_jax.workers.pipes import FrameReader, write_frame
from zephon_jax.workers.shared_slots import Layout, SlotReader, SlotWriter, unlink_quietly

DEFAULT_START_METHOD = "spawn"
_PARENT_POLL_S = 0.5  # how often an idle worker checks that the loader is alive
_STOP_S = 2.0  # how long close() waits for a worker to exit before terminating it
DEFAULT_TIMEOUT_S = 300.0  # how long the loader waits for a worker's next message
_INLINE_BYTES = 4096  # larger loader -> worker messages go as a Parcel (smaller: atomic writes)

Snapshots = dict[int, tuple]  # lane -> Lane.snapshot()


# ----- messages: loader -> worker --------------------------------------------------------


class LoadDataset(NamedTuple):
    payload: bytes  # the pickled BatchedDataset


class Free(NamedTuple):
    """The loader is done with ``slot``; it asks for no snapshot before batch ``keep_from``
    of ``generation`` any more."""

    generation: int
    slot: int
    keep_from: int


@dataclass(frozen=True)
class AskStates:
    """Send the lanes' snapshots taken right after batch ``index``."""

    generation: int
    index: int


class Restore(NamedTuple):
    generation: int
    state: dict  # {"lanes": {str(lane): uint8 array}, "exclude": [...]} for its lanes


class Stop(NamedTuple):
    pass


class Parcel(NamedTuple):
    """A large message from the loader, pickled into shared-memory segment ``name``.

    The worker reads and removes it; the loader removes what a dead worker left.
    """

    name: str
    size: int

    def open(self) -> Any:
        segment = shared_memory.SharedMemory(name=self.name)
        try:
            assert segment.buf is not None  # an open segment has a buffer
            with segment.buf[: self.size] as view:
                return pickle.loads(view)
        finally:
            segment.close()
            segment.unlink()


# The messages of every batch (a worker's Batch of a known layout, the loader's Free) are
# packed by hand: a kind byte and fixed fields. Any other message is pickled.
_BATCH = struct.Struct("<cqqq?")
_FREE = struct.Struct("<cqqq")


def _encode(message) -> bytes:
    if type(message) is Batch and message.layout is None:
        m = message
        return _BATCH.pack(b"B", m.generation, m.index, m.slot, m.rows)
    if type(message) is Free:
        return _FREE.pack(b"F", *message)
    return b"P" + pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def _decode(frame: bytes) -> Any:
    kind = frame[:1]
    if kind == b"B":
        _, generation, index, slot, rows = _BATCH.unpack(frame)
        return Batch(generation, index, slot, rows, None)
    if kind == b"F":
        return Free(*_FREE.unpack(frame)[1:])
    message = pickle.loads(memoryview(frame)[1:])
    return message.open() if isinstance(message, Parcel) else message


def _send(conn, message) -> None:
    """Writes ``message`` into pipe end ``conn`` (one system call for a small one)."""
    write_frame(conn.fileno(), _encode(message))


class _Readable:
    """Waits until one of ``handles`` (connections, process sentinels) can be read.

    One ``poll`` object for the life of the connections (``mp.connection.wait``
    builds a selector per call, which costs more than a small message).
    """

    def __init__(self, *handles):
        self.handles = handles
        self.fds = [h if isinstance(h, int) else h.fileno() for h in handles]
        self._poll = None
        if hasattr(select, "poll"):
            self._poll = select.poll()
            for fd in self.fds:
                self._poll.register(fd, select.POLLIN)

    def wait(self, timeout_s: float | None = None) -> list[int]:
        """The indices of the readable handles (closed ones too); empty after ``timeout_s``."""
        if self._poll is None:
            ready = mp.connection.wait(self.handles, timeout_s)
            return [i for i, h in enumerate(self.handles) if h in ready]
        events = self._poll.poll(None if timeout_s is None else timeout_s * 1000)
        return sorted(self.fds.index(fd) for fd, _ in events)


# ----- messages: worker -> loader --------------------------------------------------------


class ErrorReport(NamedTuple):
    summary: str
    traceback: str
    pickled: bytes | None  # the exception, if it survives a pickle round trip

    @staticmethod
    def of(e: BaseException) -> ErrorReport:
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        try:
            blob = pickle.dumps(e)
            pickle.loads(blob)  # exceptions whose __init__ needs more than args do not round-trip
        except Exception:
            blob = None
        return ErrorReport(f"{type(e).__name__}: {e}", text, blob)


class Ready(NamedTuple):
    snapshots: Snapshots  # the lanes before the first batch


@dataclass(frozen=True)
class Batch:
    generation: int
    # 1 for the first batch of a generation
    index: int
    slot: int
    rows: bool  # False: this worker has no rows here (its lanes run for the end)
    layout: Layout | None  # None: the slot's last layout


@dataclass(frozen=True)
class States:
    generation: int
    index: int
    snapshots: Snapshots


class End(NamedTuple):
    generation: int
    snapshots: Snapshots  # after the take that found the end, as in-process


class Restored(NamedTuple):
    generation: int
    snapshots: Snapshots


class Failed(NamedTuple):
    generation: int | None  # None: while starting (fails every generation)
    error: ErrorReport


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker, chained as ``__cause__``."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\nin the loader worker:\n{self.text}"


def describe_lanes(lanes: Sequence[int]) -> str:
    """``"lanes 0-3"`` / ``"lane 5"`` / ``"lanes 0, 2, 4"`` for messages."""
    lanes = list(lanes)
    if len(lanes) == 1:
        return f"lane {lanes[0]}"
    if lanes == list(range(lanes[0], lanes[-1] + 1)):
        return f"lanes {lanes[0]}-{lanes[-1]}"
    return "lanes " + ", ".join(map(str, lanes))


# ----- worker side ----------------------------------------------------------------------


class _Inbox:
    """The worker's end of the loader's commands."""

    def __init__(self, commands):
        self.commands = commands
        self.reader = FrameReader(commands.fileno())
        self.readable = _Readable(commands)
        self.parent = mp.parent_process()

    def next(self, block: bool, read: bool = True):
        """The next loader command; ``None`` if none is waiting and ``block`` is False.

        Commands sent together are read together (one system call); ``read`` False
        looks only at those already read, unless it must block.
        """
        while True:
            try:
                frame = self.reader.next(read or block)
            except (EOFError, OSError):  # the loader closed its end
                return Stop()
            if frame is not None:
                return _decode(frame)
            if not block:
                return None
            if not self.readable.wait(_PARENT_POLL_S):
                if self.parent is not None and not self.parent.is_alive():
                    return Stop()


def _load_dataset(command) -> Any:
    try:
        return pickle.loads(command.payload)
    except Exception as e:
        raise PipelineError(
            f"a loader worker could not unpickle the dataset: {type(e).__name__}: {e}. "
            "Spawned workers import the functions of the pipeline by name; those "
            "defined in a notebook or an interactive session (the __main__ module) "
            "cannot be found: define them in an importable module, or use "
            "num_workers=0"
        ) from e


class _WorkerLoop:
    """One worker: makes batches ahead into free slots, answers the loader's commands."""

    def __init__(self, producer: RowProducer, prefetch: int, prefix: str, results):
        self.producer = producer
        self.slots = SlotWriter(prefix, prefetch)
        self.free = list(range(prefetch))
        self.results = results
        self.generation = 0
        self.index = 0
        self.idle = False  # ended or failed; waits for a restore
        # Snapshots after each batch the loader may still ask about (from the one before the
        # last freed on).
        self.snapshots: dict[int, Snapshots] = {0: producer.lane_snapshots()}

    def make_batch(self) -> None:
        # One pause of the collector for the rows, their stacking and the snapshots (as
        # RowProducer.next_batch): it then runs once between batches, not within them.
        with paused_gc():
            self._make_batch()

    def _make_batch(self) -> None:
        try:
            data = self.producer.next_rows()
            if data is None:
                self.idle = True
                _send(self.results, End(self.generation, self.producer.lane_snapshots()))
                return
            layout = None
            slot = self.free.pop()
            if data:
                layout = self.slots.write(slot, stack_rows(data, self.producer.pool))
            self.index += 1
            self.snapshots[self.index] = self.producer.lane_snapshots()
            _send(self.results, Batch(self.generation, self.index, slot, bool(data), layout))
        except Exception as e:
            self.idle = True
            _send(self.results, Failed(self.generation, ErrorReport.of(e)))

    def handle(self, command) -> bool:
        """Carries out ``command``; False to stop."""
        if isinstance(command, Free):
            self.free.append(command.slot)
            if command.generation == self.generation:
                for index in [i for i in self.snapshots if i < command.keep_from]:
                    del self.snapshots[index]
        elif isinstance(command, AskStates):
            if command.generation == self.generation:
                snapshots = self.snapshots[command.index]
                _send(self.results, States(self.generation, command.index, snapshots))
        elif isinstance(command, Restore):
            self.generation = command.generation
            try:
                self.producer.restore(command.state)
            except Exception as e:  # the producer is unchanged; the loader rolls back
                self.idle = True
                _send(self.results, Failed(self.generation, ErrorReport.of(e)))
                return True
            self.idle, self.index = False, 0
            self.snapshots = {0: self.producer.lane_snapshots()}
            _send(self.results, Restored(self.generation, self.snapshots[0]))
        elif isinstance(command, Stop):
            return False
        return True

    def run(self, inbox: _Inbox) -> None:
        _send(self.results, Ready(self.snapshots[0]))
        read = True  # once per batch: the commands that came while it was made
        while True:
            command = inbox.next(block=self.idle or not self.free, read=read)
            read = command is None
            if command is None:
                self.make_batch()
            elif not self.handle(command):
                return


def _worker_main(rows, lanes, prefetch, prefix, commands, results) -> None:
    """Produces batches of ``rows`` (lanes ``lanes``) until told to stop.

    The first command is the pickled dataset (a :class:`Parcel`). It comes as a
    message rather than as a process argument so that the parent never blocks
    writing it to a child that died while starting.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    loop = None
    inbox = _Inbox(commands)
    try:
        try:
            command = inbox.next(block=True)
            if isinstance(command, Stop):
                return
            producer = RowProducer(_load_dataset(command), rows, lanes)
            # The dataset (e.g. an in-memory corpus) lives as long as the worker: keep the
            # collector from walking it again at every full collection.
            gc.collect()
            gc.freeze()
            loop = _WorkerLoop(producer, prefetch, prefix, results)
        except Exception as e:
            _send(results, Failed(None, ErrorReport.of(e)))
            return
        loop.run(inbox)
    except (BrokenPipeError, EOFError):  # the loader is gone
        pass
    finally:
        if loop is not None:
            loop.slots.close()


# ----- parent side ----------------------------------------------------------------------


class _Worker:
    """The parent's handle on one worker process, its slots and its early messages."""

    def __init__(
        self, ctx, index, incarnation, prefix, payload, rows, lanes, prefetch, timeout_s=None
    ):
        self.index = index
        self.timeout_s = timeout_s
        self.lanes = lanes
        self.prefix = f"{prefix}{index}_{incarnation}_"
        self.slots = SlotReader(self.prefix, prefetch)
        self.parcels: list[str] = []  # segments sent that the worker may not have read yet
        self._parcel_ids = itertools.count()
        self.pending: collections.deque = collections.deque()  # read ahead of their turn
        self.ready = False
        commands_in, self.commands = ctx.Pipe(duplex=False)
        self.results, results_out = ctx.Pipe(duplex=False)
        self.process = process = ctx.Process(
            target=_worker_main,
            args=(rows, lanes, prefetch, self.prefix, commands_in, results_out),
            name=f"zephon_jax-worker-{index}",
            daemon=True,
        )
        try:
            process.start()
        finally:  # the worker's ends: only the worker may hold them (its death closes them)
            commands_in.close()
            results_out.close()
        self.pid = process.pid
        self._reader = FrameReader(self.results.fileno())
        self._readable = _Readable(self.results, process.sentinel)
        self.send(LoadDataset(payload))

    def send(self, command) -> None:
        """Sends ``command`` without blocking (large ones as a :class:`Parcel`).

        A dead worker's end is closed; its death is reported by the next :meth:`receive`.
        """
        blob = _encode(command)
        if len(blob) > _INLINE_BYTES:
            pickled = pickle.dumps(command, protocol=pickle.HIGHEST_PROTOCOL)
            name = f"{self.prefix}p{next(self._parcel_ids)}"
            segment = shared_memory.SharedMemory(name=name, create=True, size=len(pickled))
            assert segment.buf is not None  # an open segment has a buffer
            segment.buf[: len(pickled)] = pickled
            segment.close()
            self.parcels.append(name)
            blob = _encode(Parcel(name, len(pickled)))
        try:
            write_frame(self.commands.fileno(), blob)
        except OSError:  # BrokenPipeError: the worker died
            pass

    def describe(self) -> str:
        return f"loader worker {self.index} ({describe_lanes(self.lanes)}, pid {self.pid})"

    def receive(self):
        """The worker's next message; raises :class:`WorkerError` if it died first, or if
        none came within ``timeout_s`` (the worker is then killed: a restore restarts it)."""
        process = self.process
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            try:
                frame = self._reader.next()
            except EOFError:  # the worker exited; what it sent before was read
                process.join(_STOP_S)
                raise WorkerError(self._death_message()) from None
            if frame is not None:
                message = _decode(frame)
                if isinstance(message, (Ready, Restored)):  # it read every parcel sent before
                    self.parcels.clear()
                return message
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready = self._readable.wait(left)  # a message, or the worker's exit
            if ready and ready[0] != 0 and not process.is_alive():
                # exited, its pipe kept open by a process it started
                raise WorkerError(self._death_message())
            if not ready and deadline is not None and time.monotonic() >= deadline:
                raise WorkerError(self._hung())

    def _hung(self) -> str:
        """Kills the worker that sent nothing for ``timeout_s``; the error's message."""
        stopped = self.process.is_alive()
        if stopped:
            self.process.kill()  # also ends a stopped (SIGSTOP) process
            self.process.join(_STOP_S)
        doing = "starting" if not self.ready else "making a batch or answering the loader"
        return (
            f"{self.describe()} sent nothing for {self.timeout_s:g} s (worker_timeout_s) while "
            f"{doing}: it is hung (e.g. a map waiting on a lock, a network read or a stopped "
            f"process){'; it was killed' if stopped else ''}. Restore the last state with "
            "set_state(...) to restart the workers; if its batches legitimately take longer, "
            "raise Loader(worker_timeout_s=...) (None: wait forever); run with num_workers=0 "
            "to debug in-process"
        )

    def _death_message(self) -> str:
        code = self.process.exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            try:
                how = f"signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"signal {-code}"
            if -code == signal.SIGKILL:
                how += (
                    " (killed, possibly by the out-of-memory killer: check the kernel log or "
                    "the job's memory limit; fewer num_workers or a smaller worker_prefetch "
                    "use less memory)"
                )
        hint = ""
        if not self.ready:
            hint = (
                " while starting (its traceback, if any, is printed above: a spawned worker "
                "imports the main module again, so the script must be a file whose top-level "
                "code is guarded by `if __name__ == '__main__':`)"
            )
        return (
            f"{self.describe()} died unexpectedly{hint} ({how}) without reporting an error. "
            "Restore the last state with set_state(...) to restart the workers, or run "
            "with num_workers=0 to debug in-process"
        )

    def free(self, batch: Batch, keep_from: int = 0) -> None:
        self.send(Free(batch.generation, batch.slot, keep_from))

    def drop_pending(self) -> None:
        """Forgets the messages read ahead (a new generation starts), freeing their slots."""
        while self.pending:
            message = self.pending.popleft()
            if isinstance(message, Batch):
                self.free(message)

    def shutdown(self) -> None:
        """Stops the process (politely, then by force) and releases all shared memory."""
        if self.commands is None:
            return
        process = self.process
        if process.is_alive():
            self.send(Stop())
            process.join(_STOP_S)
        if process.is_alive():
            process.terminate()
            process.join(_STOP_S)
        if process.is_alive():
            process.kill()
            process.join()
        self.commands.close()
        self.results.close()
        self.commands = self.results = None
        self.pending.clear()
        self.slots.close()
        for name in self.parcels:  # left unread by a worker that died
            unlink_quietly(name)
        self.parcels.clear()
        process.close()


def _shutdown_all(workers: list[_Worker]) -> None:
    for worker in workers:
        try:
            worker.shutdown()
        except Exception:  # best effort at exit; keep releasing the others
            pass


def _raise_worker_error(worker: _Worker, report: ErrorReport) -> None:
    remote = RemoteTraceback(report.traceback)
    error: BaseException | None = None
    if report.pickled is not None:
        try:
            error = pickle.loads(report.pickled)
        except Exception:
            error = None
    if isinstance(error, Exception):
        add_note(error, f"(raised in {worker.describe()}; its traceback is the cause above)")
        raise error from remote
    raise WorkerError(f"{worker.describe()} failed: {report.summary}") from remote


def _pickle_dataset(batched, start_method: str) -> bytes:
    try:
        return pickle.dumps(batched, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise PipelineError(
            f"num_workers > 0 runs the pipeline in worker processes (start method "
            f"{start_method!r}), which receive the dataset pickled, but it cannot be pickled: "
            f"{type(e).__name__}: {e}. Usually a lambda or a nested function is passed to "
            "map/filter/flat_map or a source holds an open handle: define the functions at "
            "module level (or use functools.partial of one), or use num_workers=0"
        ) from e


@dataclass(frozen=True)
class StateAt:
    """The lanes' state right after batch ``index`` (1: the first) since restore
    ``generation``: the workers keep it until told otherwise."""

    generation: int
    index: int


def _locked(method):
    """Runs ``method`` holding the producer's lock (a device-prefetch thread makes the
    batches while ``get_state`` asks for states)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return run


class WorkerRowProducer:
    """A :class:`~zephon_jax.engine.rows.Producer` whose lanes run in worker processes.

    Args:
      batched: the :class:`~zephon_jax.dataset.BatchedDataset`; must pickle.
      rows: the global rows to produce, in this order, or a function from a batch size to
        them (as for :class:`~zephon_jax.engine.rows.RowProducer`).
      num_workers: worker processes (at most one per needed lane).
      prefetch: batches each worker may produce ahead of the caller (>= 1).
      start_method: ``"spawn"`` (default; safe with JAX's threads) or
        ``"forkserver"``; ``"fork"`` only where the process has no threads.
      timeout_s: how long to wait for a worker's next message (its start, a batch, a
        state) before it counts as hung: it is killed and :class:`WorkerError` names it
        (``None``: wait forever).

    Output and :meth:`lane_states` are byte-identical to ``RowProducer``'s.
    Call :meth:`close` when done; it also runs on garbage collection and at
    interpreter exit.
    """

    def __init__(
        self,
        batched,
        rows: Sequence[int] | RowsOfSize,
        num_workers: int,
        prefetch: int = 8,
        start_method: str = DEFAULT_START_METHOD,
        agree_on_end: bool = True,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
    ):
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise PipelineError(f"WorkerRowProducer needs num_workers >= 1; got {num_workers!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise PipelineError(f"worker_prefetch must be an int >= 1; got {prefetch!r}")
        self.timeout_s = timeout_seconds(timeout_s, "worker_timeout_s")
        self.batched = batched
        self._rows = rows_by_size(batched, rows)
        if not any(self._rows.values()):
            raise PipelineError("WorkerRowProducer needs at least one row to produce")
        running: set[int] = set()
        for size, size_rows in self._rows.items():
            running.update(lanes_to_run(batched, size_rows, agree_on_end, size))
        self.lane_ids = sorted(running)
        self.step = 0  # the global step produced next
        self.prefetch = prefetch
        # Arrays of dropped batches, written again (see OutputPool: never one still in use).
        self.pool = OutputPool()
        self._ctx = mp.get_context(start_method)
        # One tracker for the parent and all workers (a forked child would start its own,
        # which would remove segments the parent still maps when that child exits).
        resource_tracker.ensure_running()
        self._payload = _pickle_dataset(batched, start_method)
        self._prefix = f"zj{os.getpid():x}{secrets.token_hex(3)}_"
        blocks = [
            b.tolist() for b in np.array_split(self.lane_ids, min(num_workers, len(self.lane_ids)))
        ]
        # Per worker: (lanes, per batch size its rows in request order, and their output places).
        self._plan = []
        for lanes in blocks:
            owned = set(lanes)
            rows_of, places_of = {}, {}
            for size, size_rows in self._rows.items():
                per_lane = size // batched.num_lanes
                places = [i for i, r in enumerate(size_rows) if r // per_lane in owned]
                rows_of[size] = [size_rows[i] for i in places]
                places_of[size] = _as_index(places)
            self._plan.append((lanes, rows_of, places_of))
        self._incarnations = [0] * len(blocks)
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _shutdown_all, self._workers)
        for k in range(len(blocks)):
            self._workers.append(self._start(k))
        self._generation = 0
        self._index = 0  # batches handed out in this generation
        # Lane snapshots after the last batch handed out; None until asked for.
        self._states: Snapshots | None = {}
        self._ended = False
        self._failure: str | None = None
        self._exclude: tuple = ()  # the documents the last restored state excludes
        self._keep_from: int | None = None  # see keep_states_from
        self._lock = threading.RLock()

    @property
    def rows(self) -> list[int]:
        """The rows of the next step's batch."""
        return self.rows_at(self.step)

    def rows_at(self, step: int) -> list[int]:
        """The global rows this producer makes at global step ``step``, in order."""
        return self._rows[self.batched.batch_size_at(step)]

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    def worker_pids(self) -> list[int]:
        """The process ids of the workers (for monitoring)."""
        return [w.pid for w in self._workers]

    def _start(self, k: int) -> _Worker:
        lanes, rows, _ = self._plan[k]
        incarnation = self._incarnations[k]
        self._incarnations[k] += 1
        return _Worker(
            self._ctx,
            k,
            incarnation,
            self._prefix,
            self._payload,
            rows,
            lanes,
            self.prefetch,
            self.timeout_s,
        )

    # ----- receiving ------------------------------------------------------------------
    def _receive(self, worker: _Worker, kinds: tuple[type, ...]):
        """The worker's next current-generation message of one of ``kinds``.

        Batches, ends and failures that arrive while states are awaited (made
        ahead of the batch asked about) wait in ``worker.pending`` for their turn.
        """
        in_turn = (Batch, End, Failed)
        if worker.pending and any(k in in_turn for k in kinds):
            message = worker.pending.popleft()
            if isinstance(message, Failed):
                self._fail(worker, message)
            if not isinstance(message, kinds):
                raise WorkerError(f"{worker.describe()} sent {message!r:.80} out of turn")
            return message
        while True:
            message = worker.receive()
            if isinstance(message, Batch):
                worker.slots.attach(message.slot, message.layout)
            if isinstance(message, Ready):  # always the first message; the initial states
                worker.ready = True
                if self._generation == 0 and self._states is not None:
                    self._states.update(message.snapshots)
                if Ready in kinds:
                    return message
                continue
            if message.generation is not None and message.generation != self._generation:
                if isinstance(message, Batch):  # made before a restore: not part of the stream
                    worker.free(message)
                continue
            if States in kinds and isinstance(message, in_turn):  # made ahead: not yet
                worker.pending.append(message)
                continue
            if isinstance(message, Failed):
                self._fail(worker, message)
            if isinstance(message, kinds):
                return message
            raise WorkerError(
                f"{worker.describe()} sent {message!r:.80} where {kinds} was expected"
            )

    def _fail(self, worker: _Worker, message: Failed) -> None:
        self._failure = f"{worker.describe()} failed"
        _raise_worker_error(worker, message.error)

    def _ensure_ready(self) -> None:
        for worker in self._workers:
            if not worker.ready:
                try:
                    self._receive(worker, (Ready,))
                except WorkerError:
                    self._failure = f"{worker.describe()} failed to start"
                    raise

    def _check_usable(self) -> None:
        if not self._finalizer.alive:
            raise WorkerError("this producer is closed; create a new loader iterator")
        if self._failure is not None:
            raise WorkerError(
                f"the loader workers stopped: {self._failure} (see the earlier error). Restore "
                "a state with set_state(...) to restart them"
            )

    def _ask_states(self, worker: _Worker, index: int) -> Snapshots:
        worker.send(AskStates(self._generation, index))
        return self._receive(worker, (States,)).snapshots

    # ----- the Producer interface -----------------------------------------------------
    @_locked
    def next_batch(self) -> Any:
        """The next batch of this producer's rows, or ``None`` at the end of a finite input."""
        self._check_usable()
        if self._ended:
            return None
        self._ensure_ready()
        messages = []
        try:
            for worker in self._workers:
                messages.append(self._receive(worker, (Batch, End)))
        except BaseException:
            self._failure = self._failure or "a worker failed"
            for worker, message in zip(self._workers, messages):
                if isinstance(message, Batch):
                    worker.free(message)
            raise
        size = self.batched.batch_size_at(self.step)
        self.step += 1
        if any(isinstance(m, End) for m in messages):
            # Like RowProducer: the lanes' states after the take that found the end.
            self._ended = True
            states: Snapshots = {}
            for worker, message in zip(self._workers, messages):
                if isinstance(message, End):
                    states.update(message.snapshots)
                else:
                    states.update(self._ask_states(worker, message.index))
                    worker.free(message)
            self._states = states
            return None
        try:
            batch = self._assemble(messages, size)
        except BaseException as e:  # like RowProducer: no state for a half-made batch
            self._failure = f"the rows of a batch could not be assembled ({e!r})"
            raise
        finally:
            # The loader may still ask for the state before this batch (provenance).
            keep_from = messages[0].index - 1
            if self._keep_from is not None:
                keep_from = min(keep_from, self._keep_from)
            for worker, message in zip(self._workers, messages):
                worker.free(message, keep_from)
        self._index = messages[0].index
        self._states = None
        return batch

    @_locked
    def lane_snapshots(self) -> Snapshots:
        """Each lane's snapshot right after the last batch handed out (encode on demand).

        Asks the workers the first time after each batch (they keep the snapshots
        of the batches they made ahead).
        """
        self._check_usable()
        self._ensure_ready()
        if self._states is None:
            states: Snapshots = {}
            try:
                for worker in self._workers:
                    states.update(self._ask_states(worker, self._index))
            except BaseException:
                self._failure = self._failure or "a worker failed"
                raise
            self._states = states
        return dict(sorted(self._states.items()))

    @_locked
    def snapshots_before_last(self) -> Snapshots:
        """Each lane's snapshot right before the last batch handed out (for provenance)."""
        self._check_usable()
        if self._index < 1:
            raise PipelineError("no batch was handed out since the start or the last restore")
        states: Snapshots = {}
        for worker in self._workers:
            states.update(self._ask_states(worker, self._index - 1))
        return dict(sorted(states.items()))

    def state_at_last(self) -> StateAt:
        """Where the state right after the last batch handed out is kept (no messages).

        A device-prefetch thread notes it after each batch; :meth:`snapshots_at`
        fetches the snapshots only when a state is asked for.
        """
        return StateAt(self._generation, self._index)

    @_locked
    def snapshots_at(self, at: StateAt) -> Snapshots:
        """Each lane's snapshot at ``at`` (see :meth:`keep_states_from`), from the workers.

        Also after a failure the workers made ahead, as long as they are alive.
        """
        if not self._finalizer.alive:
            raise WorkerError("this producer is closed; create a new loader iterator")
        if at.generation != self._generation:
            raise PipelineError(f"{at} was taken before the last restore")
        self._ensure_ready()
        states: Snapshots = {}
        for worker in self._workers:
            states.update(self._ask_states(worker, at.index))
        return dict(sorted(states.items()))

    def keep_states_from(self, index: int | None) -> None:
        """Keeps the snapshots from batch ``index`` on in the workers, for :meth:`snapshots_at`
        (``None``: only those of the last batch handed out and the one before it)."""
        self._keep_from = index

    def lane_states(self) -> dict[int, bytes]:
        """Each lane's state right after the last batch handed out (not the workers' own).

        Like ``RowProducer``, raises after a failed batch until :meth:`restore`.
        """
        return encode_snapshots(self.lane_snapshots())

    @_locked
    def restore(self, state: Mapping[str, Any]) -> None:
        """Resets every worker to ``state``; on an error the stream is unchanged."""
        blobs = {l: lane_bytes(state, l) for l in self.lane_ids}
        exclude, before = exclusion_of(state), self._exclude
        if not self._finalizer.alive:
            raise WorkerError("this producer is closed; create a new loader iterator")
        previous = None  # where to roll back to, if the workers are healthy
        if self._failure is None and all(w.process.is_alive() for w in self._workers):
            previous = encode_snapshots(self.lane_snapshots())
        for k, worker in enumerate(self._workers):
            if not worker.process.is_alive():
                worker.shutdown()
                self._workers[k] = self._start(k)
        try:
            self._ensure_ready()
        except BaseException:
            self._failure = self._failure or "a worker failed to start"
            raise
        error = self._send_restore(blobs, exclude)
        if error is not None:
            if previous is not None and self._send_restore(previous, before) is None:
                self._failure = None  # back at the last batch handed out
            else:
                self._failure = "restoring the previous state failed too"
            raise error[1]
        self._ended = False
        self._failure = None
        self._exclude = exclude
        self.step = int(state["step"])

    def _send_restore(self, blobs: Mapping[int, bytes], exclude: tuple = ()):
        """Sends ``blobs`` (and the documents excluded) to every worker; returns ``None``
        or (worker, first error)."""
        self._generation += 1
        for (lanes, _, _), worker in zip(self._plan, self._workers):
            worker.drop_pending()
            lanes_state = {str(l): np.frombuffer(blobs[l], dtype=np.uint8) for l in lanes}
            listed = [list(pair) for pair in exclude]
            worker.send(Restore(self._generation, {"lanes": lanes_state, EXCLUDE: listed}))
        first, states = None, {}
        for worker in self._workers:
            try:
                states.update(self._receive(worker, (Restored,)).snapshots)
            except Exception as e:
                first = first or (worker, e)
        if first is None:
            self._states, self._index, self._keep_from = states, 0, None
        return first

    def close(self) -> None:
        """Stops the workers and releases their shared memory; idempotent."""
        self._finalizer()

    def __enter__(self) -> WorkerRowProducer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----- assembling -----------------------------------------------------------------
    def _assemble(self, messages: list[Batch], size: int) -> Any:
        """The batch (of a global batch of ``size`` rows) in request order, from each
        worker's stacked rows."""
        count = len(self._rows[size])
        parts, places = [], []  # per worker with rows: {field: view or inline array}, places
        for worker, message, plan in zip(self._workers, messages, self._plan):
            if not message.rows:
                continue
            places.append(plan[2][size])
            parts.append(worker.slots.views(message.slot))
        try:
            keys = [tuple(p) for p in parts]
            if any(k != keys[0] for k in keys):
                raise PipelineError(
                    f"rows of one batch have different fields: {list(keys[0])} and "
                    f"{list(next(k for k in keys if k != keys[0]))}; make every record carry "
                    "the same fields (e.g. with a map)"
                )
            out = {
                key: self._gather(key, [p[key] for p in parts], places, count) for key in keys[0]
            }
        finally:
            del parts  # only the slot readers keep views
        return out[None] if None in out else out

    def _gather(self, key, values: list[np.ndarray], places: list, count: int) -> np.ndarray:
        shapes = {v.shape[1:] for v in values}
        if len(shapes) == 1 and not any(v.dtype.hasobject for v in values):
            dtype = np.result_type(*values) if len(values) > 1 else values[0].dtype
            out = self.pool.empty(str(key), (count, *values[0].shape[1:]), dtype)
            for value, where in zip(values, places):
                out[where] = value
            return out
        try:  # what np.stack would do with these rows
            joined = np.concatenate(values)
        except ValueError as e:
            raise PipelineError(
                f"cannot batch field {'row' if key is None else key!r}: rows have different "
                f"shapes {sorted(shapes)[:4]}; batching needs equal shapes: add .pack(seq_len) "
                "for token sequences, or a map that pads or crops to a fixed length"
            ) from e
        order = np.empty(count, dtype=np.int64)
        order[np.concatenate([np.arange(count)[w] for w in places])] = np.arange(count)
        return joined[order]


def _as_index(places: list[int]):
    """A slice when the places are contiguous (cheap assignment), else an index array."""
    if places and places == list(range(places[0], places[-1] + 1)):
        return slice(places[0], places[-1] + 1)
    return np.asarray(places, dtype=np.int64)
