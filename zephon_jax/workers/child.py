"""The worker process: its loop that makes batches ahead and answers the loader.

:func:`worker_main` is the process's target. It loads the dataset from the first
command, runs a :class:`~zephon_jax.engine.rows.RowProducer` over its lanes, writes each
batch's rows into a free shared-memory slot (:mod:`zephon_jax.workers.shared_slots`) and
announces it with a :class:`~zephon_jax.workers.protocol.Batch`. It keeps its lanes'
snapshots after every batch the loader may still ask about and reads the loader's commands
once per batch.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import pickle
import signal
from typing import Any

from zephon_jax.core.gc_pause import paused_gc
from zephon_jax.core.kernels import set_compiled
from zephon_jax.engine.rows import RowProducer, stack_rows
from zephon_jax.errors import PipelineError
from zephon_jax.workers.pipes import FrameReader, Readable
from zephon_jax.workers.protocol import (
    AskStates,
    Batch,
    End,
    ErrorReport,
    Failed,
    Free,
    NotKept,
    Ready,
    Restore,
    Restored,
    Snapshots,
    States,
    Stop,
    decode,
    send,
)
from zephon_jax.workers.shared_slots import SlotWriter

_PARENT_POLL_S = 0.5  # how often an idle worker checks that the loader is alive


class _Inbox:
    """The worker's end of the loader's commands."""

    def __init__(self, commands):
        self.commands = commands
        self.reader = FrameReader(commands.fileno())
        self.readable = Readable(commands)
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
                return decode(frame)
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
                send(self.results, End(self.generation, self.producer.lane_snapshots()))
                return
            layout = None
            slot = self.free.pop()
            if data:
                layout = self.slots.write(slot, stack_rows(data, self.producer.pool))
            self.index += 1
            self.snapshots[self.index] = self.producer.lane_snapshots()
            send(self.results, Batch(self.generation, self.index, slot, bool(data), layout))
        except Exception as e:
            self.idle = True
            send(self.results, Failed(self.generation, ErrorReport.of(e)))

    def send_states(self, index: int) -> None:
        """Sends the snapshots after batch ``index``, or :class:`NotKept` (the loader
        raises a clear error rather than wait for an answer that never comes)."""
        snapshots = self.snapshots.get(index)
        if snapshots is None:
            send(self.results, NotKept(self.generation, index, tuple(sorted(self.snapshots))))
        else:
            send(self.results, States(self.generation, index, snapshots))

    def handle(self, command) -> bool:
        """Carries out ``command``; False to stop."""
        if isinstance(command, Free):
            self.free.append(command.slot)
            if command.generation == self.generation:
                for index in [i for i in self.snapshots if i < command.keep_from]:
                    del self.snapshots[index]
        elif isinstance(command, AskStates):
            if command.generation == self.generation:
                self.send_states(command.index)
        elif isinstance(command, Restore):
            self.generation = command.generation
            try:
                self.producer.restore(command.state)
            except Exception as e:  # the producer is unchanged; the loader rolls back
                self.idle = True
                send(self.results, Failed(self.generation, ErrorReport.of(e)))
                return True
            self.idle, self.index = False, 0
            self.snapshots = {0: self.producer.lane_snapshots()}
            send(self.results, Restored(self.generation, self.snapshots[0]))
        elif isinstance(command, Stop):
            return False
        return True

    def run(self, inbox: _Inbox) -> None:
        send(self.results, Ready(self.snapshots[0]))
        read = True  # once per batch: the commands that came while it was made
        while True:
            command = inbox.next(block=self.idle or not self.free, read=read)
            read = command is None
            if command is None:
                self.make_batch()
            elif not self.handle(command):
                return


def worker_main(rows, lanes, prefetch, prefix, commands, results, compiled=None) -> None:
    """Produces batches of ``rows`` (lanes ``lanes``) until told to stop.

    The first command is the pickled dataset (a :class:`Parcel`). It comes as a
    message rather than as a process argument so that the parent never blocks
    writing it to a child that died while starting. ``compiled``: the loader's
    :func:`~zephon_jax.core.kernels.set_compiled` choice, made here too before the
    lanes are planned.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    loop = None
    inbox = _Inbox(commands)
    try:
        try:
            command = inbox.next(block=True)
            if isinstance(command, Stop):
                return
            set_compiled(compiled)
            producer = RowProducer(_load_dataset(command), rows, lanes)
            # The dataset (e.g. an in-memory corpus) lives as long as the worker: keep the
            # collector from walking it again at every full collection.
            gc.collect()
            gc.freeze()
            loop = _WorkerLoop(producer, prefetch, prefix, results)
        except Exception as e:
            send(results, Failed(None, ErrorReport.of(e)))
            return
        loop.run(inbox)
    except (BrokenPipeError, EOFError):  # the loader is gone
        pass
    finally:
        if loop is not None:
            loop.slots.close()
