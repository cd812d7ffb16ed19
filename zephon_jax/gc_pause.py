"""Pausing Python's cyclic garbage collector while zephon_jax builds many objects.

Producing a batch (or restoring lanes) makes and frees many small acyclic
objects (elements, lineage tuples, row pointers). Each collection they trigger
walks the young objects, and every few collections all live objects of the
process; with many lanes that costs as much as the work itself. Reference
counting frees these objects without the collector, so zephon_jax pauses it
while it works and restores it afterwards: collections then run between
batches, in the caller's code.

The pause is process-wide (as :func:`gc.disable` is), nests, and is shared by
threads (a device-prefetch thread and the main thread): the collector is
enabled again when the last pause ends, and only if it was enabled when the
first began. A program that disabled the collector itself is left as it is.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

__all__ = ["paused_gc"]

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pauses the cyclic garbage collector (if on) for the ``with`` block."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            if _was_enabled:
                gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
