"""Framed messages over one pipe, written in one system call and read in bulk.

The loader and its workers exchange a few small messages per batch. Sent through
``multiprocessing.Connection``, each costs a ``poll`` and two reads on the
receiving side; here a frame (a 4-byte length, then the payload) goes out in one
``write``, and the reader takes everything waiting in the pipe in one ``read``
and splits it into frames itself: messages that queued while the reader was busy
cost one system call together. The reading end is non-blocking, so a reader
that finds nothing learns it without waiting and decides itself how to wait
(for the pipe, and the other side's death: :class:`Readable`). A writing end made
non-blocking waits for room at most a given time (:func:`write_frame`).
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import select
import struct
import time

_HEADER = struct.Struct("<I")
_CHUNK = 1 << 16  # bytes read at once (a pipe's usual capacity)


def write_frame(fd: int, payload: bytes, timeout_s: float | None = None) -> None:
    """Writes ``payload`` as one frame (all of it, even past the pipe's capacity).

    On a non-blocking ``fd`` whose pipe is full, waits for room at most ``timeout_s``
    seconds in all (``None``: for ever), then raises ``TimeoutError`` (the frame may be
    cut: the reader is then unusable). Raises ``BrokenPipeError`` if the reading end is
    closed.
    """
    data = memoryview(_HEADER.pack(len(payload)) + payload)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while data:
        try:
            data = data[os.write(fd, data) :]
        except BlockingIOError:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"no room in the pipe for {timeout_s:g} s") from None
            wait_writable(fd, left)


def wait_writable(fd: int, timeout_s: float | None) -> None:
    """Waits until ``fd`` can be written (or its reader is gone), at most ``timeout_s``."""
    if hasattr(select, "poll"):
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        poll.poll(None if timeout_s is None else timeout_s * 1000)
    else:
        select.select([], [fd], [fd], timeout_s)


class FrameReader:
    """The reading end of a pipe of frames (made non-blocking)."""

    def __init__(self, fd: int):
        self.fd = fd
        os.set_blocking(fd, False)
        self._buffer = bytearray()
        self._start = 0  # where the first unread frame begins in the buffer

    def next(self, read: bool = True) -> bytes | None:
        """The next frame's payload; ``None`` if no whole frame is waiting (``read``
        False: none among the bytes read before).

        Raises ``EOFError`` once the writer closed its end and every whole frame was read.
        """
        frame = self._take()
        while frame is None and read:
            try:
                chunk = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                return None
            if not chunk:
                raise EOFError("the writing end of the pipe is closed")
            if self._start:
                del self._buffer[: self._start]
                self._start = 0
            self._buffer += chunk
            frame = self._take()
        return frame

    def _take(self) -> bytes | None:
        buffer, start = self._buffer, self._start
        if len(buffer) - start < _HEADER.size:
            return None
        (size,) = _HEADER.unpack_from(buffer, start)
        end = start + _HEADER.size + size
        if len(buffer) < end:
            return None
        frame = bytes(buffer[start + _HEADER.size : end])
        if end == len(buffer):
            buffer.clear()
            self._start = 0
        else:
            self._start = end
        return frame


class Readable:
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
