"""The messages between the loader and its workers: the hand-packed batch messages, every
other message pickled, parcels in shared memory, frames over a pipe, error reports."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
from multiprocessing import shared_memory

import numpy as np
import pytest

from zephon_jax.workers.pipes import FrameReader
from zephon_jax.workers.protocol import (
    AskStates,
    Batch,
    End,
    ErrorReport,
    Failed,
    Free,
    LoadDataset,
    Parcel,
    Ready,
    Restore,
    Restored,
    States,
    Stop,
    decode,
    encode,
    send,
)
from zephon_jax.workers.shared_slots import Field, Layout


def test_a_batch_of_a_known_layout_is_packed_by_hand():
    frame = encode(Batch(3, 17, 1, True, None))
    assert (
        frame
        == b"B"
        + (3).to_bytes(8, "little")
        + (17).to_bytes(8, "little")
        + (1).to_bytes(8, "little")
        + b"\x01"
    )
    assert decode(frame) == Batch(3, 17, 1, True, None)
    no_rows = decode(encode(Batch(0, 1, 0, False, None)))
    assert no_rows == Batch(0, 1, 0, False, None) and no_rows.rows is False


def test_free_is_packed_by_hand_with_signed_fields():
    frame = encode(Free(2, 5, -1))
    assert len(frame) == 1 + 3 * 8 and frame[:1] == b"F"
    assert frame[17:] == (-1).to_bytes(8, "little", signed=True)
    decoded = decode(frame)
    assert type(decoded) is Free and decoded == Free(2, 5, -1)


def test_a_batch_with_a_new_layout_is_pickled_with_its_inline_arrays():
    labels = np.array(["a", "bc"], dtype=object)
    layout = Layout(
        (Field("x", np.dtype(np.int32), (2, 3), 0), Field("label", None, (), 0)),
        {"label": labels},
        "prefix0_0_1_0",
    )
    frame = encode(Batch(1, 2, 0, True, layout))
    assert frame[:1] == b"P"
    decoded = decode(frame)
    assert (decoded.generation, decoded.index, decoded.slot, decoded.rows) == (1, 2, 0, True)
    assert decoded.layout.fields == layout.fields
    assert decoded.layout.segment == "prefix0_0_1_0"
    assert decoded.layout.inline["label"].tolist() == ["a", "bc"]


MESSAGES = [
    LoadDataset(b"\x00pickled dataset"),
    AskStates(4, 9),
    Stop(),
    Ready({0: (1, "a"), 3: ()}),
    States(2, 7, {1: (b"x", 5)}),
    End(1, {0: (2,)}),
    Restored(6, {5: ("s",)}),
    Failed(None, ErrorReport("ValueError: bad", "Traceback ...", None)),
    Failed(3, ErrorReport("KeyError: 1", "tb", pickle.dumps(KeyError(1)))),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_other_message_round_trips_pickled(message):
    frame = encode(message)
    assert frame[:1] == b"P"
    decoded = decode(frame)
    assert type(decoded) is type(message) and decoded == message


def test_restore_carries_its_lane_arrays():
    state = {"lanes": {"0": np.frombuffer(b"\x01\x02\x03", np.uint8)}, "exclude": [["a", 4]]}
    decoded = decode(encode(Restore(5, state)))
    assert type(decoded) is Restore and decoded.generation == 5
    assert decoded.state["lanes"]["0"].tobytes() == b"\x01\x02\x03"
    assert decoded.state["exclude"] == [["a", 4]]


def test_a_parcel_is_opened_and_its_segment_removed():
    message = Restore(2, {"lanes": {"1": np.arange(5000, dtype=np.uint8)}})
    pickled = pickle.dumps(message)
    name = f"zjtest{os.getpid()}_parcel"
    segment = shared_memory.SharedMemory(name=name, create=True, size=len(pickled) + 100)
    segment.buf[: len(pickled)] = pickled
    segment.close()
    frame = encode(Parcel(name, len(pickled)))
    assert len(frame) < 100  # only the name and size go through the pipe
    decoded = decode(frame)
    assert type(decoded) is Restore and decoded.generation == 2
    assert decoded.state["lanes"]["1"].tolist() == np.arange(5000, dtype=np.uint8).tolist()
    with pytest.raises(FileNotFoundError):  # the reader removed it
        shared_memory.SharedMemory(name=name)


def test_messages_sent_over_a_pipe_arrive_in_order():
    receiving, sending = mp.Pipe(duplex=False)
    try:
        messages = [Batch(0, 1, 1, True, None), Free(0, 1, 0), *MESSAGES[:5]]
        for message in messages:
            send(sending, message)
        reader = FrameReader(receiving.fileno())
        received = [decode(reader.next()) for _ in messages]
        assert received == messages
        assert [type(m) for m in received] == [type(m) for m in messages]
        assert reader.next() is None
    finally:
        receiving.close()
        sending.close()


def raise_value_error():
    raise ValueError("record 7 is broken")


def test_error_report_of_a_picklable_exception():
    try:
        raise_value_error()
    except ValueError as e:
        report = ErrorReport.of(e)
    assert report.summary == "ValueError: record 7 is broken"
    assert report.traceback.startswith("Traceback (most recent call last)")
    assert "raise_value_error" in report.traceback
    assert report.traceback.rstrip().endswith("ValueError: record 7 is broken")
    error = pickle.loads(report.pickled)
    assert type(error) is ValueError and error.args == ("record 7 is broken",)


class NeedsTwoArguments(Exception):
    def __init__(self, what, where):
        super().__init__(f"{what} at {where}")


def test_error_report_of_an_exception_that_does_not_unpickle():
    report = ErrorReport.of(NeedsTwoArguments("bad", 3))
    assert report.summary == "NeedsTwoArguments: bad at 3"
    assert report.pickled is None
    assert "NeedsTwoArguments: bad at 3" in report.traceback
