"""Framed messages over a pipe: whole frames in order, however the bytes arrive."""

import os
import select
import threading
import time

import pytest

from zephon_jax.workers import protocol
from zephon_jax.workers.pipes import FrameReader, write_frame
from zephon_jax.workers.shared_slots import Layout


@pytest.fixture
def pipe():
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def test_frames_sent_together_are_read_in_order_then_none(pipe):
    r, w = pipe
    reader = FrameReader(r)
    assert reader.next() is None  # nothing written: no wait
    payloads = [b"", b"a", bytes(range(256)) * 3, b"last"]
    for p in payloads:
        write_frame(w, p)
    assert [reader.next() for _ in payloads] == payloads
    assert reader.next() is None


def test_a_frame_split_across_writes_is_returned_only_when_whole(pipe):
    r, w = pipe
    reader = FrameReader(r)
    frame = len(b"hello").to_bytes(4, "little") + b"hello"
    for i in range(len(frame)):
        os.write(w, frame[i : i + 1])
        expected = b"hello" if i == len(frame) - 1 else None
        assert reader.next() == expected


def test_read_false_looks_only_at_bytes_already_read(pipe):
    r, w = pipe
    reader = FrameReader(r)
    write_frame(w, b"one")
    write_frame(w, b"two")
    assert reader.next() == b"one"  # reads both frames at once
    write_frame(w, b"three")
    assert reader.next(read=False) == b"two"
    assert reader.next(read=False) is None  # "three" is still in the pipe
    assert reader.next() == b"three"


def test_frames_larger_than_the_pipe_arrive_whole(pipe):
    r, w = pipe
    reader = FrameReader(r)
    big = [os.urandom(300_000), b"small", os.urandom(70_000)]

    def send():
        for p in big:
            write_frame(w, p)  # blocks until the reader makes room

    sender = threading.Thread(target=send)
    sender.start()
    got = []
    while len(got) < len(big):
        frame = reader.next()
        if frame is None:  # nothing whole yet: wait for more bytes
            select.select([r], [], [], 1.0)
            continue
        got.append(frame)
    sender.join()
    assert got == big


def test_a_write_to_a_full_pipe_nobody_reads_gives_up_after_its_timeout(pipe):
    r, w = pipe
    os.set_blocking(w, False)
    reader = FrameReader(r)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="no room in the pipe for 0.2 s"):
        for _ in range(100_000):  # far past a pipe's capacity
            write_frame(w, b"x" * 1000, timeout_s=0.2)
    assert 0.2 <= time.monotonic() - start < 2
    assert reader.next() == b"x" * 1000  # the frames written before are whole


def test_a_write_waits_for_room_the_reader_makes(pipe):
    r, w = pipe
    os.set_blocking(w, False)
    reader = FrameReader(r)
    big = os.urandom(300_000)
    sender = threading.Thread(target=write_frame, args=(w, big, 10.0))
    sender.start()
    frame = None
    while frame is None:
        frame = reader.next()
        if frame is None:
            select.select([r], [], [], 1.0)
    sender.join()
    assert frame == big


def test_end_of_pipe_after_the_last_whole_frame(pipe):
    r, w = pipe
    reader = FrameReader(r)
    write_frame(w, b"x")
    os.write(w, b"\x05\x00")  # half a header: the writer died mid-frame
    os.close(w)
    assert reader.next() == b"x"
    with pytest.raises(EOFError):
        reader.next()


@pytest.mark.parametrize(
    "message",
    [
        protocol.Batch(3, 17, 2, True, None),
        protocol.Batch(0, 1, 0, False, None),
        protocol.Free(2, 3, 15),
        protocol.AskStates(1, 9),
        protocol.End(4, {0: ("snapshot",)}),
        protocol.Batch(1, 2, 0, True, Layout((), {}, "segment_1")),
    ],
)
def test_messages_round_trip(message):
    assert protocol.decode(protocol.encode(message)) == message
