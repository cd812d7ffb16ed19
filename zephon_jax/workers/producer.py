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

Parent and workers talk in named messages (:mod:`zephon_jax.workers.protocol`), one
per class, through one pipe each way per worker. Both sides write their messages
themselves (no feeder threads: a worker busy in Python would delay them by the
interpreter's switch interval), each in one system call, and read everything waiting
at once (:mod:`zephon_jax.workers.pipes`); the two messages of every batch (:class:`Batch`,
:class:`Free`) are packed by hand rather than pickled, and a worker reads its commands
once per batch. The loader's writes are small and never block: it sends the dataset and
restore states, which may be large, as a :class:`~zephon_jax.workers.protocol.Parcel` in
shared memory. A worker's death is seen at once through its process sentinel.

The parts: :mod:`~zephon_jax.workers.protocol` (the messages and their encoding),
:mod:`~zephon_jax.workers.child` (the worker process's loop),
:mod:`~zephon_jax.workers.parent` (starting, talking to and supervising a worker),
:mod:`~zephon_jax.workers.assembly` (the batch from the workers' rows) and this module
(the producer the loader uses).
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import secrets
import threading
import time
import weakref
from dataclasses import dataclass
from multiprocessing import resource_tracker
from typing import Any, Mapping, Sequence

import numpy as np

from zephon_jax.core.checks import timeout_seconds
from zephon_jax.core.packed import OutputPool
from zephon_jax.engine.rows import RowsOfSize, encode_snapshots, lanes_to_run, rows_by_size
from zephon_jax.errors import PipelineError, WorkerError
from zephon_jax.state.global_state import EXCLUDE, exclusion_of, lane_bytes
from zephon_jax.state.lane_format import with_tally
from zephon_jax.workers.assembly import assemble, plan_workers
from zephon_jax.workers.parent import Worker, pickle_dataset, raise_worker_error, shutdown_all
from zephon_jax.workers.protocol import (
    AskStates,
    Batch,
    End,
    Failed,
    NotKept,
    Ready,
    Restore,
    Restored,
    Snapshots,
    States,
)

# Workers forked from a server that has loaded the package and numba (see
# zephon_jax.workers.server) where the platform has one; new interpreters elsewhere.
DEFAULT_START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
SERVER_MODULE = "zephon_jax.workers.server"
DEFAULT_TIMEOUT_S = 300.0  # how long the loader waits for a worker's next message


@dataclass(frozen=True)
class StateAt:
    """The lanes' state right after batch ``index`` (1: the first) since restore
    ``generation``: the workers keep it until told otherwise."""

    generation: int
    index: int


def start_method_of(name: str | None) -> str:
    """The start method ``name`` (None: :data:`DEFAULT_START_METHOD`), checked against
    the platform's; a PipelineError naming the choices otherwise."""
    if name is None:
        return DEFAULT_START_METHOD
    methods = mp.get_all_start_methods()
    if name not in methods:
        raise PipelineError(
            f"worker_start_method must be one of {methods} (this platform's) or None (the "
            f"default, {DEFAULT_START_METHOD!r}); got {name!r}"
        )
    return name


def worker_context(start_method: str) -> Any:
    """The multiprocessing context that starts the workers by ``start_method``.

    With ``"forkserver"``, the process's fork server (started by Python the first time a
    worker starts, and kept until the process exits) also imports :data:`SERVER_MODULE`
    before it forks any worker: the workers then start with the package imported and
    numba set up, without the 1-1.5 s a spawned interpreter spends on both (see
    :mod:`zephon_jax.workers.server`). Modules the program asked the
    fork server to load are kept. A fork server already running (started by the
    program before) is used as it is. The server is started here, so that it loads while
    the loader pickles the dataset. Workers forked from it see the environment
    variables the process had when the server started (its first workers); each
    worker takes the program's ``sys.path`` and current directory of when it starts,
    as a spawned one does."""
    context = mp.get_context(start_method)
    if start_method == "forkserver":
        from multiprocessing import forkserver

        asked = list(getattr(getattr(forkserver, "_forkserver", None), "_preload_modules", ()))
        if SERVER_MODULE not in asked:
            context.set_forkserver_preload([*asked, SERVER_MODULE])
        forkserver.ensure_running()  # it loads while this process pickles the dataset
    return context


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
      start_method: ``"forkserver"`` (the default where the platform has it: Linux,
        macOS) or ``"spawn"`` (the default elsewhere), both safe with JAX's threads;
        ``"fork"`` only where the process has no threads. See :func:`worker_context`.
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
        # Seconds spent waiting for the workers' rows and assembling them, for metrics().
        self.stage_seconds = {"workers": 0.0, "assemble": 0.0}
        self.prefetch = prefetch
        # Arrays of dropped batches, written again (see OutputPool: never one still in use).
        self.pool = OutputPool()
        self._ctx = worker_context(start_method_of(start_method))
        # One tracker for the parent and all workers (a forked child would start its own,
        # which would remove segments the parent still maps when that child exits).
        resource_tracker.ensure_running()
        self._payload = pickle_dataset(batched, start_method)
        self._prefix = f"zj{os.getpid():x}{secrets.token_hex(3)}_"
        blocks = [
            b.tolist() for b in np.array_split(self.lane_ids, min(num_workers, len(self.lane_ids)))
        ]
        # Per worker: its lanes, per batch size its rows in request order and their places.
        self._plan = plan_workers(self._rows, batched.num_lanes, blocks)
        self._incarnations = [0] * len(blocks)
        self._workers: list[Worker] = []
        self._finalizer = weakref.finalize(self, shutdown_all, self._workers)
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

    def _start(self, k: int) -> Worker:
        lanes, rows, _ = self._plan[k]
        incarnation = self._incarnations[k]
        self._incarnations[k] += 1
        return Worker(
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
    def _receive(self, worker: Worker, kinds: tuple[type, ...]):
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

    def _fail(self, worker: Worker, message: Failed) -> None:
        self._failure = f"{worker.describe()} failed"
        raise_worker_error(worker, message.error)

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

    def _ask_states(self, worker: Worker, index: int) -> Snapshots:
        """The snapshots ``worker`` keeps after batch ``index`` of this generation.

        Raises :class:`PipelineError` if it no longer keeps them.
        """
        worker.send(AskStates(self._generation, index))
        answer = self._receive(worker, (States, NotKept))
        if isinstance(answer, NotKept):
            raise PipelineError(
                f"{worker.describe()} no longer keeps the lanes' state after batch {index} "
                f"since the last restore (it keeps batches {list(answer.kept)}): the loader "
                "asked for a state it had let go; this is a bug in zephon_jax, please report "
                "it. Restore a saved state with set_state(...) to go on"
            )
        return answer.snapshots

    def _undelivered_states(self, worker: Worker, index: int) -> Snapshots:
        """The snapshots of ``worker``'s lanes after batch ``index``, which they completed
        but which is not delivered (another worker's lanes found the end of the input):
        their counters stay those before it, as :class:`RowProducer` leaves them."""
        after = self._ask_states(worker, index)
        before = self._ask_states(worker, index - 1)
        return {l: with_tally(s, before[l][-1]) for l, s in after.items()}

    # ----- the Producer interface -----------------------------------------------------
    @_locked
    def next_batch(self) -> Any:
        """The next batch of this producer's rows, or ``None`` at the end of a finite input."""
        self._check_usable()
        if self._ended:
            return None
        self._ensure_ready()
        messages = []
        started = time.perf_counter()
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
                    states.update(self._undelivered_states(worker, message.index))
                    worker.free(message)
            self._states = states
            return None
        received = time.perf_counter()
        self.stage_seconds["workers"] += received - started
        try:
            batch = self._assemble(messages, size)
            self.stage_seconds["assemble"] += time.perf_counter() - received
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
        """Sends ``blobs`` to every worker; returns ``None`` or (worker, first error)."""
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
        parts, places = [], []  # per worker with rows: {field: view or inline array}, places
        for worker, message, plan in zip(self._workers, messages, self._plan):
            if message.rows:
                places.append(plan.places[size])
                parts.append(worker.slots.views(message.slot))
        try:
            return assemble(parts, places, len(self._rows[size]), self.pool)
        finally:
            parts.clear()  # only the slot readers keep views
