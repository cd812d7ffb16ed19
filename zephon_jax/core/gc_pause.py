"""Pausing Python's cyclic garbage collector while zephon_jax builds many objects.

Producing a batch (or restoring lanes) makes and frees many small acyclic
objects (elements, lineage tuples, row pointers). Each collection they trigger
walks the young objects, and every few collections all live objects of the
process; with many lanes that costs as much as the work itself. Reference
counting frees these objects without the collector, so zephon_jax pauses it
while it works and restores it afterwards: collections then run between
batches, in the caller's code.

A restore builds objects that stay alive (the lanes' carries and rows), hundreds
of thousands with many lanes; the first young collection after the pause would
walk them all, and a later one again, only to keep them. A pause marked
``long_lived`` moves the young objects to the oldest generation instead when it
ends (``gc.freeze()`` then ``gc.unfreeze()``, no walk): they are looked at in
the next full collection, like any long-lived object.

The pause is process-wide (as :func:`gc.disable` is), nests, and is shared by
threads (a device-prefetch thread and the main thread): the collector is
enabled again when the last pause ends, and only if it was enabled when the
first began. A program that disabled the collector itself is left as it is, and
one that froze objects itself (``gc.get_freeze_count() > 0``) keeps them frozen:
nothing is moved then.
"""

from __future__ import annotations

import gc
import threading

__all__ = ["paused_gc"]

_lock = threading.Lock()
_depth = 0
_was_enabled = False
_long_lived = False


def paused_gc(long_lived: bool = False) -> _Pause:
    """Pauses the cyclic garbage collector (if on) for the ``with`` block.

    ``long_lived``: the block builds objects that stay alive; when the last pause
    ends, the process's young objects move to the oldest generation unwalked (see
    the module docstring). Garbage cycles among them are freed by the next full
    collection instead of a young one.
    """
    return _Pause(long_lived)


class _Pause:
    """The context manager of :func:`paused_gc` (a class: entered once or more per batch,
    where a generator-based one costs microseconds)."""

    __slots__ = ("long_lived",)

    def __init__(self, long_lived: bool):
        self.long_lived = long_lived

    def __enter__(self) -> None:
        global _depth, _was_enabled, _long_lived
        with _lock:
            if _depth == 0:
                _was_enabled = gc.isenabled()
                if _was_enabled:
                    gc.disable()
            _depth += 1
            _long_lived = _long_lived or self.long_lived

    def __exit__(self, *exc_info: object) -> None:
        global _depth, _long_lived
        with _lock:
            _depth -= 1
            if _depth == 0:
                if _was_enabled:
                    if _long_lived and gc.get_freeze_count() == 0:
                        _promote_young()
                    gc.enable()
                _long_lived = False


def _promote_young() -> None:
    """Moves every tracked object to the oldest generation without walking them (and
    resets the young generation's count); nothing was frozen before."""
    gc.freeze()
    gc.unfreeze()
