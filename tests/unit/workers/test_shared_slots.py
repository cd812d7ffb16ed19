"""Batches through shared memory: fields laid out at 64-byte offsets, the layout sent only
when it changes, segments grown by doubling, names removed once mapped."""

from __future__ import annotations

import os
from multiprocessing import shared_memory

import numpy as np
import pytest

from zephon_jax.workers.shared_slots import Field, SlotReader, SlotWriter, segment_name


@pytest.fixture
def ring():
    prefix = f"zjtest{os.getpid()}_"
    writer, reader = SlotWriter(prefix, 2), SlotReader(prefix, 2)
    yield prefix, writer, reader
    reader.close()
    writer.close()


def exists(name: str) -> bool:
    try:
        segment = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return False
    segment.close()
    return True


def test_segment_names():
    assert segment_name("p_", 3, 0) == "p_3_0"
    assert segment_name("p_", 0, 12) == "p_0_12"


def test_fields_lie_at_64_byte_offsets_and_read_back(ring):
    prefix, writer, reader = ring
    batch = {"a": np.arange(3, dtype=np.int64), "b": np.ones((2, 3), np.float32)}
    layout = writer.write(0, batch)
    assert layout.fields == (
        Field("a", np.dtype(np.int64), (3,), 0),  # 24 bytes, rounded up to 64
        Field("b", np.dtype(np.float32), (2, 3), 64),
    )
    assert layout.segment == f"{prefix}0_0" and layout.inline == {}
    reader.attach(0, layout)
    assert not exists(layout.segment)  # the reader removed the name once mapped
    views = reader.views(0)
    np.testing.assert_array_equal(views["a"], batch["a"])
    np.testing.assert_array_equal(views["b"], batch["b"])


def test_a_batch_of_the_same_layout_sends_none_and_reuses_the_views(ring):
    _, writer, reader = ring
    reader.attach(0, writer.write(0, {"a": np.zeros(4, np.int32)}))
    first = reader.views(0)
    assert writer.write(0, {"a": np.arange(4, dtype=np.int32)}) is None
    reader.attach(0, None)
    assert reader.views(0) is first
    np.testing.assert_array_equal(first["a"], [0, 1, 2, 3])


def test_a_larger_batch_gets_a_new_segment_at_least_twice_as_large(ring):
    prefix, writer, reader = ring
    reader.attach(1, writer.write(1, {"a": np.zeros(8, np.int64)}))  # 64 bytes
    bigger = {"a": np.arange(10, dtype=np.int64)}  # 80 bytes, 128 with the alignment
    layout = writer.write(1, bigger)
    assert layout.segment == f"{prefix}1_1"
    assert writer.segments[1].size >= 128
    reader.attach(1, layout)
    assert reader.generations[1] == 1
    np.testing.assert_array_equal(reader.views(1)["a"], bigger["a"])
    smaller = writer.write(1, {"a": np.arange(3, dtype=np.int64)})
    assert smaller is not None and smaller.segment is None  # other shape, same segment


def test_object_arrays_go_inline_and_their_layout_is_always_sent(ring):
    _, writer, reader = ring
    batch = {"text": np.array(["x", None], dtype=object), "n": np.arange(2)}
    layout = writer.write(0, batch)
    assert layout.fields[0] == Field("text", None, (), 0)
    assert layout.fields[1].offset == 0  # the inline field takes no room
    assert writer.write(0, batch) is not None  # inline arrays travel with every message
    reader.attach(0, layout)
    assert reader.views(0)["text"] is batch["text"]


def test_a_batch_of_one_array_has_no_key(ring):
    _, writer, reader = ring
    layout = writer.write(0, np.arange(6, dtype=np.uint8).reshape(2, 3))
    assert layout.fields == (Field(None, np.dtype(np.uint8), (2, 3), 0),)
    reader.attach(0, layout)
    np.testing.assert_array_equal(reader.views(0)[None], [[0, 1, 2], [3, 4, 5]])


def test_close_removes_a_segment_created_but_never_announced(ring):
    prefix, writer, reader = ring
    layout = writer.write(1, {"a": np.zeros(3)})
    assert exists(layout.segment)  # the reader never attached it (the worker died, say)
    reader.close()
    assert not exists(layout.segment)
