"""The messages between the loader and its workers, and their encoding.

One class per message. Loader -> worker: :class:`LoadDataset`, :class:`Restore`,
:class:`AskStates`, :class:`Free`, :class:`Stop` (and :class:`Parcel`, which carries a
large one in shared memory). Worker -> loader: :class:`Ready`, :class:`Batch`,
:class:`States` (or :class:`NotKept`), :class:`End`, :class:`Restored`, :class:`Failed`
(with an :class:`ErrorReport`). :func:`encode` packs the two messages of every batch
(:class:`Batch`, :class:`Free`) by hand and pickles any other; :func:`decode` reverses it;
:func:`send` writes one message as a frame (:mod:`zephon_jax.workers.pipes`).
"""

from __future__ import annotations

import pickle
import struct
import traceback
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any, NamedTuple

from zephon_jax.workers.pipes import write_frame
from zephon_jax.workers.shared_slots import Layout

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


def encode(message) -> bytes:
    """``message`` as one frame's payload: :class:`Batch` (of a known layout) and :class:`Free`
    packed by hand, any other message pickled; :func:`decode` reverses it."""
    if type(message) is Batch and message.layout is None:
        m = message
        return _BATCH.pack(b"B", m.generation, m.index, m.slot, m.rows)
    if type(message) is Free:
        return _FREE.pack(b"F", *message)
    return b"P" + pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode(frame: bytes) -> Any:
    """The message in ``frame`` (from :func:`encode`); a :class:`Parcel` is opened (and its
    segment removed), so the large message it carries is returned."""
    kind = frame[:1]
    if kind == b"B":
        _, generation, index, slot, rows = _BATCH.unpack(frame)
        return Batch(generation, index, slot, rows, None)
    if kind == b"F":
        return Free(*_FREE.unpack(frame)[1:])
    message = pickle.loads(memoryview(frame)[1:])
    return message.open() if isinstance(message, Parcel) else message


def send(conn, message) -> None:
    """Writes ``message`` into pipe end ``conn`` (one system call for a small one)."""
    write_frame(conn.fileno(), encode(message))


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


@dataclass(frozen=True)
class NotKept:
    """The answer to :class:`AskStates` for a batch whose snapshots the worker no longer
    keeps (``kept``: the batches whose snapshots it keeps)."""

    generation: int
    index: int
    kept: tuple[int, ...]


class End(NamedTuple):
    generation: int
    snapshots: Snapshots  # after the take that found the end, as in-process


class Restored(NamedTuple):
    generation: int
    snapshots: Snapshots


class Failed(NamedTuple):
    generation: int | None  # None: while starting (fails every generation)
    error: ErrorReport
