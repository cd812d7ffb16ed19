"""Errors raised by zephon_jax. Each message names the cause and the fix."""

from __future__ import annotations


class ZephonError(Exception):
    """Base class of every error zephon_jax raises on purpose."""


class PipelineError(ZephonError, ValueError):
    """The pipeline definition is invalid (bad argument, operator order, weights)."""


class RecordError(ZephonError, RuntimeError):
    """A record could not be produced: a source or a user function failed on it.

    The message names the lane, the lane-local position, the source and the
    record index, and the original exception is chained as ``__cause__``.
    """


class WorkerError(ZephonError, RuntimeError):
    """A loader worker process died, or its work cannot continue."""


class StateError(ZephonError, ValueError):
    """A loader state cannot be used: malformed, from another version, or incomplete."""


class StateMismatchError(StateError):
    """A state was taken from a pipeline that differs from the one restoring it.

    ``field`` names the differing part of the pipeline fingerprint; ``saved`` and
    ``current`` are its two values. ``shown``: what the message shows instead of them
    (for 'seeds', the seeds given to ``shuffle``).
    """

    def __init__(self, field: str, saved: object, current: object, shown: tuple | None = None):
        self.field = field
        self.saved = saved
        self.current = current
        # What the message shows (the seeds as written, where the fingerprint holds values
        # derived from them); ``saved`` and ``current`` keep the fingerprint's values.
        state, pipeline = shown if shown is not None else (repr(saved), repr(current))
        super().__init__(
            f"cannot restore: the state's pipeline {field!r} differs from this pipeline's.\n"
            f"  state:    {state}\n  pipeline: {pipeline}\n"
            f"Restore into the pipeline the state was taken from (same {field}), "
            "or start a fresh run without restoring."
        )


def add_note(error: BaseException, note: str) -> None:
    """Adds ``note`` to ``error`` (``BaseException.add_note`` from Python 3.11).

    On Python 3.10 the note is kept in ``error.__notes__``, as 3.11 would keep it;
    3.10's traceback printing does not show it.
    """
    adder = getattr(error, "add_note", None)
    if callable(adder):
        adder(note)
        return
    notes = getattr(error, "__notes__", None)
    if not isinstance(notes, list):
        notes = []
        vars(error)["__notes__"] = notes  # 3.10's BaseException declares no __notes__
    notes.append(note)
