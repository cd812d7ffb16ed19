"""Checks repeated across the package: positive ints, timeouts, Grain objects, failed user
calls."""

from __future__ import annotations

from typing import Any, Callable, overload

import numpy as np

from zephon_jax.errors import PipelineError, RecordError


@overload
def positive_int(value: Any, what: str) -> int: ...


@overload
def positive_int(value: Any, what: str, allow_none: bool) -> int | None: ...


def positive_int(value: Any, what: str, allow_none: bool = False) -> int | None:
    """``value`` as an int >= 1 (``None`` passes if ``allow_none``); else a PipelineError."""
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise PipelineError(
            f"{what} needs a positive int{' or None' if allow_none else ''}; got {value!r}"
        )
    return int(value)


def timeout_seconds(value: Any, what: str) -> float | None:
    """``value`` as a number of seconds > 0, or ``None`` (no limit); else a PipelineError."""
    if value is None:
        return None
    number = isinstance(value, (int, float, np.integer, np.floating))
    if isinstance(value, (bool, np.bool_)) or not number or not value > 0:
        raise PipelineError(
            f"{what} needs a number of seconds > 0, or None to wait forever; got {value!r}"
        )
    return float(value)


def unwrap_grain(fn: Any, method: str, what: str) -> Callable:
    """A callable, or the ``method`` of a Grain transform object (``map``, ``filter``, ...)."""
    bound = getattr(fn, method, None)
    out = bound if callable(bound) and not callable(fn) else fn
    if not callable(out):
        raise TypeError(f"{what} needs a callable or a grain object with .{method}(); got {fn!r}")
    return out


class TransformFailed(Exception):
    """A user transform raised; ``name`` says which (the cause is chained)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def user_error(what: str, where: str, e: BaseException) -> RecordError:
    """A RecordError for a failed user function, chaining the original exception."""
    cause = e.__cause__ if isinstance(e, TransformFailed) else e
    error = RecordError(
        f"{what} raised {cause!r} on {where}. The original traceback is chained above "
        "(__cause__); fix the function or the record, then restore the state taken "
        "before the failure to continue"
    )
    error.__cause__ = cause
    return error
