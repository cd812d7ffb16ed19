"""Batches through shared memory: a ring of slots written by a worker, read by the loader.

Each slot is one shared-memory segment holding the arrays of one batch. The
writer (:class:`SlotWriter`, in the worker) creates a slot's segment the first
time, and a larger one when a batch outgrows it; it then sends the segment's
name once with the batch's :class:`Layout`. The reader (:class:`SlotReader`, in
the loader) maps the segment and removes its name at once, so that no segment
outlives the two processes that map it.

A slot's layout is sent only when it changes (a new segment, other fields or
shapes, or arrays sent inline): batches of one shape cost the reader no
decoding, and it keeps the views of each slot's arrays from one batch to the next.
"""

from __future__ import annotations

import importlib
from multiprocessing import resource_tracker, shared_memory
from typing import Any, NamedTuple

import numpy as np

_ALIGN = 64


class Field(NamedTuple):
    """Where one field of a batch lies in a slot (``dtype is None``: sent inline)."""

    key: str | None  # None: the batch is one array, not a dict
    dtype: Any
    shape: tuple[int, ...]  # () when sent inline
    offset: int  # 0 when sent inline


class Layout(NamedTuple):
    """A batch written into a slot: its fields, the arrays too odd for shared memory."""

    fields: tuple[Field, ...]
    inline: dict  # key -> array of objects (e.g. strings), pickled with the message
    segment: str | None  # the slot's new segment to map, if it changed


class SlotWriter:
    """The worker's side: writes batches into its ring of ``count`` slots."""

    def __init__(self, prefix: str, count: int):
        self.prefix = prefix
        self.segments: list[shared_memory.SharedMemory | None] = [None] * count
        self.generations = [-1] * count
        self.fields: list[tuple[Field, ...] | None] = [None] * count  # the last layout sent

    def write(self, slot: int, batch: Any) -> Layout | None:
        """Writes ``batch`` (a dict of arrays, or an array) into ``slot``; returns its
        layout, or ``None`` if it is the slot's last one (send it to the reader)."""
        items = batch.items() if isinstance(batch, dict) else [(None, batch)]
        fields, inline, arrays, size = [], {}, [], 0
        for key, value in items:
            array = np.asarray(value)
            if array.dtype.hasobject:  # not plain memory: goes through the pipe
                inline[key] = array
                fields.append(Field(key, None, (), 0))
                continue
            fields.append(Field(key, array.dtype, array.shape, size))
            arrays.append((array, size))
            size += -(-array.nbytes // _ALIGN) * _ALIGN
        name = None
        segment = self.segments[slot]
        if segment is None or segment.size < size:
            close_quietly(segment)
            self.generations[slot] += 1
            name = segment_name(self.prefix, slot, self.generations[slot])
            grown = max(size, 1 if segment is None else 2 * segment.size)
            segment = shared_memory.SharedMemory(name=name, create=True, size=grown)
            self.segments[slot] = segment
        for array, offset in arrays:
            view = np.ndarray(array.shape, dtype=array.dtype, buffer=segment.buf, offset=offset)
            view[...] = array
            del view
        layout = Layout(tuple(fields), inline, name)
        if name is None and not inline and layout.fields == self.fields[slot]:
            return None
        self.fields[slot] = None if inline else layout.fields
        return layout

    def close(self) -> None:
        for segment in self.segments:
            close_quietly(segment)


class SlotReader:
    """The loader's side: maps a worker's slots and reads batches out of them."""

    def __init__(self, prefix: str, count: int):
        self.prefix = prefix
        self.segments: list[shared_memory.SharedMemory | None] = [None] * count
        self.generations = [-1] * count
        self.layouts: list[Layout | None] = [None] * count
        self._views: list[dict | None] = [None] * count

    def attach(self, slot: int, layout: Layout | None) -> None:
        """Takes note of a batch written into ``slot`` (``layout`` None: the slot's last
        one); maps the slot's new segment if the layout announces one.

        Call it on every receipt, in order, whether or not the batch is used.
        """
        if layout is None:
            return
        self._views[slot] = None
        self.layouts[slot] = layout
        if layout.segment is None:
            return
        close_quietly(self.segments[slot])
        segment = shared_memory.SharedMemory(name=layout.segment)
        segment.unlink()  # the mappings keep it alive; the name is not needed any more
        self.segments[slot] = segment
        self.generations[slot] = int(layout.segment.rsplit("_", 1)[1])

    def views(self, slot: int) -> dict:
        """``{key: array}`` of the batch in ``slot``: views valid until the slot is reused."""
        views = self._views[slot]
        if views is None:
            layout, segment = self.layouts[slot], self.segments[slot]
            assert layout is not None and segment is not None, f"slot {slot} holds no batch"
            buffer = segment.buf
            views = self._views[slot] = {
                f.key: layout.inline[f.key]
                if f.dtype is None
                else np.ndarray(f.shape, dtype=f.dtype, buffer=buffer, offset=f.offset)
                for f in layout.fields
            }
        return views

    def close(self) -> None:
        """Unmaps every slot, and removes a segment created but never announced."""
        self._views = [None] * len(self._views)  # views would keep the segments mapped
        for slot, segment in enumerate(self.segments):
            close_quietly(segment)
            # the next segment of each slot, if the worker died (or we closed) before sending it
            unlink_quietly(segment_name(self.prefix, slot, self.generations[slot] + 1))
        self.segments = [None] * len(self.segments)


def segment_name(prefix: str, slot: int, generation: int) -> str:
    return f"{prefix}{slot}_{generation}"


def close_quietly(segment: shared_memory.SharedMemory | None) -> None:
    if segment is None:
        return
    try:
        segment.close()
    except BufferError:  # a view is still alive (an exception's frame); the GC unmaps it
        pass


def unlink_quietly(name: str) -> None:
    """Removes segment ``name`` if it exists, even one left empty by a worker killed mid-create."""
    try:
        # POSIX only; importlib, as the module has no type stubs
        shm_unlink = importlib.import_module("_posixshmem").shm_unlink
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
