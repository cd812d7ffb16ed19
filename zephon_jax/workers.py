"""Loader worker processes: lanes split across processes, arrays through shared memory.

:class:`WorkerRowProducer` has the interface of
:class:`~zephon_jax.rows.RowProducer`. Worker ``k`` runs a ``RowProducer``
over a contiguous block of the needed lanes, produces up to ``prefetch``
batches ahead, writes their arrays into a ring of ``prefetch`` shared-memory
slots and sends, with every batch, its lanes' states taken right after it. The
parent copies each worker's rows into their places in the batch.

Lanes, not data, are split, and every lane runs the same code as in-process, so
batches and states are byte-identical for every worker count, including 0;
:meth:`WorkerRowProducer.lane_states` always describes the last batch handed
out, however far ahead the workers are.

Shared memory never outlives its use: a worker creates a slot's segment, the
parent maps it and removes its name at once, and both keep only the mapping.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import secrets
import signal
import traceback
import weakref
from multiprocessing import resource_tracker, shared_memory
from typing import Any, Mapping, Sequence

import numpy as np

from zephon_jax.errors import PipelineError, WorkerError
from zephon_jax.rows import (
    RowProducer,
    encode_snapshots,
    lanes_to_run,
    rows_by_size,
    stack_rows,
)
from zephon_jax.state import lane_bytes

DEFAULT_START_METHOD = "spawn"
_POLL_S = 0.05  # how often a blocked parent checks that its workers are alive
_LAST_WORDS_S = 0.5  # how long to wait for the messages of a worker that just died
_STOP_S = 2.0  # how long close() waits for a worker to exit before terminating it
_ALIGN = 64


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


def _error_payload(e: BaseException) -> tuple[str, str, bytes | None]:
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    try:
        blob = pickle.dumps(e)
        pickle.loads(blob)  # exceptions whose __init__ needs more than args do not round-trip
    except Exception:
        blob = None
    return f"{type(e).__name__}: {e}", text, blob


class _SlotWriter:
    """The worker's side of its ring of shared-memory slots."""

    def __init__(self, prefix: str, count: int):
        self.prefix = prefix
        self.segments: list[shared_memory.SharedMemory | None] = [None] * count
        self.generations = [-1] * count

    def write(self, slot: int, batch: Any) -> tuple[str | None, tuple, dict]:
        """Writes ``batch``'s arrays into ``slot``; returns (new segment name, layout, inline)."""
        if batch is None:  # a worker running lanes with no rows here (finite inputs)
            return None, None, {}
        fields = batch.items() if isinstance(batch, dict) else [(None, batch)]
        layout, inline, arrays, offset = [], {}, [], 0
        for key, value in fields:
            array = np.asarray(value)
            if array.dtype.hasobject:
                inline[key] = array  # not plain memory: goes through the pipe
                layout.append((key, None, None, None))
                continue
            layout.append((key, array.dtype, array.shape, offset))
            arrays.append((array, offset))
            offset += -(-array.nbytes // _ALIGN) * _ALIGN
        name = None
        segment = self.segments[slot]
        if segment is None or segment.size < offset:
            _close_quietly(segment)
            self.generations[slot] += 1
            name = f"{self.prefix}{slot}_{self.generations[slot]}"
            size = max(offset, 1 if segment is None else 2 * segment.size)
            segment = shared_memory.SharedMemory(name=name, create=True, size=size)
            self.segments[slot] = segment
        for array, start in arrays:
            view = np.ndarray(array.shape, dtype=array.dtype, buffer=segment.buf, offset=start)
            view[...] = array
            del view
        return name, tuple(layout), inline

    def close(self) -> None:
        for segment in self.segments:
            _close_quietly(segment)


def _next_command(commands, block: bool):
    """The next parent command; ``None`` if none is waiting and ``block`` is False."""
    parent = mp.parent_process()
    while True:
        try:
            return commands.get(timeout=0.5) if block else commands.get_nowait()
        except queue.Empty:
            if not block:
                return None
            if parent is not None and not parent.is_alive():
                return ("stop",)


def _worker_main(rows, lanes, prefetch, prefix, commands, results) -> None:
    """Produces batches of ``rows`` (lanes ``lanes``) until told to stop.

    The first command is the pickled dataset. It comes through the queue rather
    than as a process argument so that the parent never blocks writing it to a
    child that died while starting.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    slots = _SlotWriter(prefix, prefetch)
    free = list(range(prefetch))
    generation, idle = 0, False  # idle: ended or failed; waits for a restore
    try:
        try:
            payload = _next_command(commands, block=True)
            if payload[0] == "stop":
                return
            try:
                batched = pickle.loads(payload[1])
            except Exception as e:
                raise PipelineError(
                    f"a loader worker could not unpickle the dataset: {type(e).__name__}: {e}. "
                    "Spawned workers import the functions of the pipeline by name; those "
                    "defined in a notebook or an interactive session (the __main__ module) "
                    "cannot be found: define them in an importable module, or use "
                    "num_workers=0"
                ) from e
            producer = RowProducer(batched, rows, lanes)
        except Exception as e:
            results.put(("error", None, _error_payload(e)))  # None: fails any generation
            results.close()
            results.join_thread()  # deliver it before exiting
            return
        results.put(("ready", 0, producer.lane_snapshots()))
        while True:
            command = _next_command(commands, block=idle or not free)
            if command is None:
                try:
                    data = producer.next_rows()
                    if data is None:
                        idle = True
                        results.put(("end", generation, producer.lane_snapshots()))
                        continue
                    batch = stack_rows(data) if data else None
                    states = producer.lane_snapshots()
                    slot = free.pop()
                    name, layout, inline = slots.write(slot, batch)
                    results.put(("batch", generation, slot, name, layout, inline, states))
                except Exception as e:
                    idle = True
                    results.put(("error", generation, _error_payload(e)))
                continue
            kind = command[0]
            if kind == "free":
                free.append(command[1])
            elif kind == "restore":
                generation = command[1]
                try:
                    producer.restore(command[2])
                except Exception as e:  # the producer is unchanged; the parent rolls back
                    idle = True
                    results.put(("error", generation, _error_payload(e)))
                    continue
                idle = False
                results.put(("restored", generation, producer.lane_snapshots()))
            elif kind == "stop":
                return
    finally:
        slots.close()
        results.cancel_join_thread()  # never hang on exit if the parent is gone


# ----- parent side ----------------------------------------------------------------------


class _Worker:
    """The parent's handle on one worker process and its ring of slots."""

    def __init__(
        self,
        ctx,
        index: int,
        incarnation: int,
        prefix: str,
        payload: bytes,
        rows: list[int],
        lanes: list[int],
        prefetch: int,
    ):
        self.index = index
        self.lanes = lanes
        self.prefix = f"{prefix}{index}_{incarnation}_"
        self.prefetch = prefetch
        self.segments: list[shared_memory.SharedMemory | None] = [None] * prefetch
        self.generations = [-1] * prefetch
        self.commands = ctx.Queue()
        self.results = ctx.Queue()
        self.ready = False
        self.process = process = ctx.Process(
            target=_worker_main,
            args=(rows, lanes, prefetch, self.prefix, self.commands, self.results),
            name=f"zephon_jax-worker-{index}",
            daemon=True,
        )
        process.start()
        self.pid = process.pid
        self.commands.put(("dataset", payload))

    def describe(self) -> str:
        return f"loader worker {self.index} ({describe_lanes(self.lanes)}, pid {self.pid})"

    def receive(self) -> tuple:
        """The worker's next message; raises :class:`WorkerError` if it died first."""
        while True:
            try:
                return self.results.get(timeout=_POLL_S)
            except queue.Empty:
                pass
            if not self.process.is_alive():
                try:  # what it sent just before dying
                    return self.results.get(timeout=_LAST_WORDS_S)
                except queue.Empty:
                    raise WorkerError(self._death_message()) from None

    def _death_message(self) -> str:
        code = self.process.exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            try:
                how = f"signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"signal {-code}"
            if -code == signal.SIGKILL:
                how += " (killed, possibly by the out-of-memory killer)"
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

    def attach(self, slot: int, name: str) -> None:
        """Maps a slot's new segment and removes its name (the mappings keep it alive)."""
        _close_quietly(self.segments[slot])
        segment = shared_memory.SharedMemory(name=name)
        segment.unlink()
        self.segments[slot] = segment
        self.generations[slot] = int(name.rsplit("_", 1)[1])

    def free(self, slot: int) -> None:
        self.commands.put(("free", slot))

    def shutdown(self) -> None:
        """Stops the process (politely, then by force) and releases all shared memory."""
        if self.commands is None:
            return
        process = self.process
        if process.is_alive():
            try:
                self.commands.put(("stop",))
            except (OSError, ValueError):
                pass
            process.join(_STOP_S)
        if process.is_alive():
            process.terminate()
            process.join(_STOP_S)
        if process.is_alive():
            process.kill()
            process.join()
        for q in (self.commands, self.results):
            q.cancel_join_thread()
            q.close()
        self.commands = self.results = None  # frees their semaphores now, not at exit
        for i, segment in enumerate(self.segments):
            _close_quietly(segment)
            # a segment the worker created but never announced (it died or we closed first)
            _unlink_quietly(f"{self.prefix}{i}_{self.generations[i] + 1}")
        self.segments = [None] * self.prefetch
        process.close()


def _close_quietly(segment: shared_memory.SharedMemory | None) -> None:
    if segment is None:
        return
    try:
        segment.close()
    except BufferError:  # a view is still alive (an exception's frame); the GC unmaps it
        pass


def _unlink_quietly(name: str) -> None:
    """Removes segment ``name`` if it exists, even one left empty by a worker killed mid-create."""
    try:
        from _posixshmem import shm_unlink  # what SharedMemory.unlink uses on POSIX
    except ImportError:  # Windows: a segment disappears with its last handle
        return
    path = "/" + name
    # Register first so that the unregister below always matches one registration.
    resource_tracker.register(path, "shared_memory")
    try:
        shm_unlink(path)
    except OSError:
        pass
    resource_tracker.unregister(path, "shared_memory")


def _shutdown_all(workers: list[_Worker]) -> None:
    for worker in workers:
        try:
            worker.shutdown()
        except Exception:  # best effort at exit; keep releasing the others
            pass


def _raise_worker_error(worker: _Worker, payload: tuple[str, str, bytes | None]) -> None:
    summary, text, blob = payload
    remote = RemoteTraceback(text)
    error: BaseException | None = None
    if blob is not None:
        try:
            error = pickle.loads(blob)
        except Exception:
            error = None
    if isinstance(error, Exception):
        error.add_note(f"(raised in {worker.describe()}; its traceback is the cause above)")
        raise error from remote
    raise WorkerError(f"{worker.describe()} failed: {summary}") from remote


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


class WorkerRowProducer:
    """A :class:`~zephon_jax.rows.RowProducer` whose lanes run in worker processes.

    Args:
      batched: the :class:`~zephon_jax.dataset.BatchedDataset`; must pickle.
      rows: the global rows to produce, in this order.
      num_workers: worker processes (at most one per needed lane).
      prefetch: batches each worker may produce ahead of the caller (>= 1).
      start_method: ``"spawn"`` (default; safe with JAX's threads) or
        ``"forkserver"``; ``"fork"`` only where the process has no threads.

    Output and :meth:`lane_states` are byte-identical to ``RowProducer``'s.
    Call :meth:`close` when done; it also runs on garbage collection and at
    interpreter exit.
    """

    def __init__(
        self,
        batched,
        rows: Sequence[int],
        num_workers: int,
        prefetch: int = 2,
        start_method: str = DEFAULT_START_METHOD,
        agree_on_end: bool = True,
    ):
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise PipelineError(f"WorkerRowProducer needs num_workers >= 1; got {num_workers!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise PipelineError(f"worker_prefetch must be an int >= 1; got {prefetch!r}")
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
        self._states: dict[int, tuple] = {}  # lane snapshots after the last batch handed out
        self._ended = False
        self._failure: str | None = None

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
            self._ctx, k, incarnation, self._prefix, self._payload, rows, lanes, self.prefetch
        )

    # ----- receiving ------------------------------------------------------------------
    def _receive(self, worker: _Worker, kinds: tuple[str, ...]) -> tuple:
        """The worker's next current-generation message of one of ``kinds``."""
        while True:
            message = worker.receive()
            kind, generation = message[0], message[1]
            if kind == "batch" and message[3] is not None:
                worker.attach(message[2], message[3])
            if kind == "ready":  # always the first message; the initial lane states
                worker.ready = True
                if self._generation == 0:
                    self._states.update(message[2])
                if "ready" in kinds:
                    return message
                continue
            if generation is not None and generation != self._generation:
                if kind == "batch":
                    worker.free(message[2])  # made before a restore: not part of the stream
                continue
            if kind == "error":
                self._failure = f"{worker.describe()} failed"
                _raise_worker_error(worker, message[2])
            if kind in kinds:
                return message
            raise WorkerError(f"{worker.describe()} sent {kind!r} where {kinds} was expected")

    def _ensure_ready(self) -> None:
        for worker in self._workers:
            if not worker.ready:
                try:
                    self._receive(worker, ("ready",))
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

    # ----- the RowProducer interface --------------------------------------------------
    def next_batch(self) -> Any:
        """The next batch of this producer's rows, or ``None`` at the end of a finite input."""
        self._check_usable()
        if self._ended:
            return None
        self._ensure_ready()
        messages = []
        try:
            for worker in self._workers:
                messages.append(self._receive(worker, ("batch", "end")))
        except BaseException:
            self._failure = self._failure or "a worker failed"
            for worker, message in zip(self._workers, messages):
                if message[0] == "batch":
                    worker.free(message[2])
            raise
        size = self.batched.batch_size_at(self.step)
        self.step += 1
        if any(m[0] == "end" for m in messages):
            # Like RowProducer: the lanes' states after the failed take.
            self._ended = True
            for worker, message in zip(self._workers, messages):
                if message[0] == "end":
                    self._states.update(message[2])
                else:
                    self._states.update(message[6])
                    worker.free(message[2])
            return None
        try:
            batch = self._assemble(messages, size)
        except BaseException as e:  # like RowProducer: no state for a half-made batch
            self._failure = f"the rows of a batch could not be assembled ({e!r})"
            raise
        finally:
            for worker, message in zip(self._workers, messages):
                worker.free(message[2])
        for message in messages:
            self._states.update(message[6])
        return batch

    def next_rows(self) -> list[Any] | None:
        """The rows of the next batch (views into it), or ``None`` at the end."""
        batch = self.next_batch()
        if batch is None:
            return None
        if isinstance(batch, dict):
            n = len(next(iter(batch.values())))
            return [{k: v[i] for k, v in batch.items()} for i in range(n)]
        return [batch[i] for i in range(len(batch))]

    def lane_snapshots(self) -> dict[int, tuple]:
        """Each lane's snapshot right after the last batch handed out (encode on demand)."""
        self._check_usable()
        self._ensure_ready()
        return dict(sorted(self._states.items()))

    def lane_states(self) -> dict[int, bytes]:
        """Each lane's state right after the last batch handed out (not the workers' own).

        Like ``RowProducer``, raises after a failed batch until :meth:`restore`.
        """
        return encode_snapshots(self.lane_snapshots())

    def restore(self, state: Mapping[str, Any]) -> None:
        """Resets every worker to ``state``; on an error the stream is unchanged."""
        blobs = {l: lane_bytes(state, l) for l in self.lane_ids}
        if not self._finalizer.alive:
            raise WorkerError("this producer is closed; create a new loader iterator")
        for k, worker in enumerate(self._workers):
            if not worker.process.is_alive():
                worker.shutdown()
                self._workers[k] = self._start(k)
        try:
            self._ensure_ready()
        except BaseException:
            self._failure = self._failure or "a worker failed to start"
            raise
        previous = encode_snapshots(self._states)
        error = self._send_restore(blobs)
        if error is not None:
            if self._send_restore(previous) is None:
                self._failure = None  # back at the last batch handed out
            else:
                self._failure = "restoring the previous state failed too"
            raise error[1]
        self._ended = False
        self._failure = None
        self.step = int(state["step"])

    def _send_restore(self, blobs: Mapping[int, bytes]):
        """Sends ``blobs`` to every worker; returns ``None`` or (worker, first error)."""
        self._generation += 1
        for (lanes, _, _), worker in zip(self._plan, self._workers):
            lanes_state = {str(l): np.frombuffer(blobs[l], dtype=np.uint8) for l in lanes}
            worker.commands.put(("restore", self._generation, {"lanes": lanes_state}))
        first, states = None, {}
        for worker in self._workers:
            try:
                states.update(self._receive(worker, ("restored",))[2])
            except Exception as e:
                first = first or (worker, e)
        if first is None:
            self._states = states
        return first

    def close(self) -> None:
        """Stops the workers and releases their shared memory; idempotent."""
        self._finalizer()

    def __enter__(self) -> WorkerRowProducer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----- assembling -----------------------------------------------------------------
    def _assemble(self, messages: list[tuple], size: int) -> Any:
        """The batch (of a global batch of ``size`` rows) in request order, from each worker's
        stacked rows."""
        count = len(self._rows[size])
        parts, places = [], []  # per worker with rows: {field: view or inline array}, places
        for worker, message, plan in zip(self._workers, messages, self._plan):
            _, _, slot, _, layout, inline, _ = message
            if layout is None:
                continue
            places.append(plan[2][size])
            buffer = worker.segments[slot].buf
            parts.append(
                {
                    key: inline[key]
                    if dtype is None
                    else np.ndarray(shape, dtype=dtype, buffer=buffer, offset=offset)
                    for key, dtype, shape, offset in layout
                }
            )
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
            del parts  # drop the views before the slots are reused
        return out[None] if None in out else out

    def _gather(self, key, values: list[np.ndarray], places: list, count: int) -> np.ndarray:
        shapes = {v.shape[1:] for v in values}
        if len(shapes) == 1 and not any(v.dtype.hasobject for v in values):
            dtype = np.result_type(*values) if len(values) > 1 else values[0].dtype
            out = np.empty((count, *values[0].shape[1:]), dtype=dtype)
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
