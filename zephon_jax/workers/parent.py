"""The loader's side of its workers: starting them, talking to them, supervising them.

A :class:`Worker` starts one worker process (:func:`~zephon_jax.workers.child.worker_main`)
with a pipe each way, sends it commands without blocking (large ones as a
:class:`~zephon_jax.workers.protocol.Parcel` in shared memory), and reads its messages,
seeing its death at once through its process sentinel and its silence past ``timeout_s``
(it is then killed), as it is if it reads none of its commands for that long while they
fill its pipe. :func:`raise_worker_error` raises a worker's reported error in the
loader; :meth:`Worker.shutdown` stops a worker and releases its shared memory.
"""

from __future__ import annotations

import collections
import itertools
import os
import pickle
import signal
import time
from multiprocessing import shared_memory
from typing import Sequence

from zephon_jax.core.kernels import compiled_setting
from zephon_jax.errors import PipelineError, WorkerError, add_note
from zephon_jax.workers.child import worker_main
from zephon_jax.workers.pipes import FrameReader, Readable, write_frame
from zephon_jax.workers.protocol import (
    Batch,
    ErrorReport,
    Free,
    LoadDataset,
    Parcel,
    Ready,
    Restored,
    Stop,
    decode,
    encode,
)
from zephon_jax.workers.shared_slots import SlotReader, unlink_quietly

STOP_S = 2.0  # how long a shutdown waits for a worker to exit before terminating it
INLINE_BYTES = 4096  # larger loader -> worker messages go as a Parcel (smaller: atomic writes)


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


class Worker:
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
        self.hung: str | None = None  # why it was killed while the loader wrote to it
        commands_in, self.commands = ctx.Pipe(duplex=False)
        self.results, results_out = ctx.Pipe(duplex=False)
        self.process = process = ctx.Process(
            target=worker_main,
            args=(rows, lanes, prefetch, self.prefix, commands_in, results_out, compiled_setting()),
            name=f"zephon_jax-worker-{index}",
            daemon=True,
        )
        try:
            process.start()
        finally:  # the worker's ends: only the worker may hold them (its death closes them)
            commands_in.close()
            results_out.close()
        self.pid = process.pid
        os.set_blocking(self.commands.fileno(), False)  # see send
        self._reader = FrameReader(self.results.fileno())
        self._readable = Readable(self.results, process.sentinel)
        self.send(LoadDataset(payload))

    def send(self, command) -> None:
        """Sends ``command`` (large ones as a :class:`Parcel`, so that it normally finds
        room in the pipe at once).

        A dead worker's end is closed; its death is reported by the next :meth:`receive`.
        A worker that reads none of its commands while they fill its pipe for
        ``timeout_s`` is hung: it is killed and the next :meth:`receive` says so.
        """
        self._send(command, self.timeout_s)

    def _send(self, command, timeout_s: float | None) -> None:
        """:meth:`send`, waiting at most ``timeout_s`` for room (``None``: for ever)."""
        blob = encode(command)
        if len(blob) > INLINE_BYTES:
            pickled = pickle.dumps(command, protocol=pickle.HIGHEST_PROTOCOL)
            name = f"{self.prefix}p{next(self._parcel_ids)}"
            segment = shared_memory.SharedMemory(name=name, create=True, size=len(pickled))
            assert segment.buf is not None  # an open segment has a buffer
            segment.buf[: len(pickled)] = pickled
            segment.close()
            self.parcels.append(name)
            blob = encode(Parcel(name, len(pickled)))
        try:
            write_frame(self.commands.fileno(), blob, timeout_s)
        except TimeoutError:
            self.hung = self._hung(f"read none of the loader's messages for {timeout_s:g} s")
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
                process.join(STOP_S)
                raise WorkerError(self.hung or self._death_message()) from None
            if frame is not None:
                message = decode(frame)
                if isinstance(message, (Ready, Restored)):  # it read every parcel sent before
                    self.parcels.clear()
                return message
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready = self._readable.wait(left)  # a message, or the worker's exit
            if ready and ready[0] != 0 and not process.is_alive():
                # exited, its pipe kept open by a process it started
                raise WorkerError(self.hung or self._death_message())
            if not ready and deadline is not None and time.monotonic() >= deadline:
                raise WorkerError(self._hung(f"sent nothing for {self.timeout_s:g} s"))

    def _hung(self, silence: str) -> str:
        """Kills the worker that was silent (``silence`` says how) for ``timeout_s``; the
        error's message."""
        stopped = self.process.is_alive()
        if stopped:
            self.process.kill()  # also ends a stopped (SIGSTOP) process
            self.process.join(STOP_S)
        doing = "starting" if not self.ready else "making a batch or answering the loader"
        return (
            f"{self.describe()} {silence} (worker_timeout_s) while "
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
                " while starting (its traceback, if any, is printed above: a worker, forked "
                "from the fork server or spawned, imports the main module again, so the script "
                "must be a file whose top-level code is guarded by `if __name__ == '__main__':`)"
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
            self._send(Stop(), STOP_S)
            process.join(STOP_S)
        if process.is_alive():
            process.terminate()
            process.join(STOP_S)
        if process.is_alive():
            process.kill()
            process.join(STOP_S)  # a process in an uninterruptible wait may outlive it
        self.commands.close()
        self.results.close()
        self.commands = self.results = None
        self.pending.clear()
        self.slots.close()
        for name in self.parcels:  # left unread by a worker that died
            unlink_quietly(name)
        self.parcels.clear()
        if not process.is_alive():
            process.close()


def shutdown_all(workers: list[Worker]) -> None:
    """Shuts every worker down (best effort: one that fails does not keep the others)."""
    for worker in workers:
        try:
            worker.shutdown()
        except Exception:  # best effort at exit; keep releasing the others
            pass


def raise_worker_error(worker: Worker, report: ErrorReport) -> None:
    """Raises the worker's exception (if it unpickles) or a :class:`WorkerError`, chained to
    the worker's traceback."""
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


def pickle_dataset(batched, start_method: str) -> bytes:
    """``batched`` pickled for the workers; a :class:`PipelineError` says why it cannot be."""
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
