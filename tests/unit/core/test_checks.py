"""The shared checks: positive ints, timeouts, Grain objects' methods, and the RecordError
for a failed user function (the cause chained)."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_jax.core.checks import (
    TransformFailed,
    positive_int,
    timeout_seconds,
    unwrap_grain,
    user_error,
)
from zephon_jax.errors import PipelineError, RecordError


@pytest.mark.parametrize("value", [1, 7, np.int64(3), np.uint8(1)])
def test_positive_int_accepts_ints_from_one(value):
    out = positive_int(value, "batch_size")
    assert out == int(value) and type(out) is int


@pytest.mark.parametrize("value", [0, -1, 1.0, "2", True, np.bool_(True), None, np.int32(0)])
def test_positive_int_rejects_others_naming_the_argument(value):
    with pytest.raises(PipelineError, match=r"batch_size needs a positive int; got"):
        positive_int(value, "batch_size")


def test_positive_int_allows_none_when_asked():
    assert positive_int(None, "limit", allow_none=True) is None
    with pytest.raises(PipelineError, match="limit needs a positive int or None; got 0"):
        positive_int(0, "limit", allow_none=True)


@pytest.mark.parametrize("value, seconds", [(None, None), (1, 1.0), (0.5, 0.5), (np.int32(2), 2.0)])
def test_timeout_seconds_accepts_positive_numbers_and_none(value, seconds):
    out = timeout_seconds(value, "timeout")
    assert out == seconds and (out is None or type(out) is float)


@pytest.mark.parametrize("value", [0, -1.5, True, "3", float("nan")])
def test_timeout_seconds_rejects_others(value):
    with pytest.raises(PipelineError, match=r"timeout needs a number of seconds > 0, or None"):
        timeout_seconds(value, "timeout")


class GrainLike:
    def map(self, x):
        return x + 1


def test_unwrap_grain_takes_a_callable_or_the_objects_method():
    def f(x):
        return x

    assert unwrap_grain(f, "map", "map()") is f
    bound = unwrap_grain(GrainLike(), "map", "map()")
    assert bound(1) == 2


def test_unwrap_grain_rejects_what_it_cannot_call():
    with pytest.raises(TypeError, match=r"filter\(\) needs a callable or a grain object with"):
        unwrap_grain(GrainLike(), "filter", "filter()")
    with pytest.raises(TypeError, match=r"\.map\(\)"):
        unwrap_grain(3, "map", "map()")


def test_user_error_chains_the_cause_and_names_the_fix():
    cause = ValueError("bad")
    error = user_error("map(f)", "record 4", cause)
    assert isinstance(error, RecordError)
    assert error.__cause__ is cause
    assert "map(f) raised ValueError('bad') on record 4" in str(error)
    assert "restore the state" in str(error)


def test_user_error_unwraps_transform_failed():
    cause = KeyError("k")
    wrapped = TransformFailed("tokenize")
    wrapped.__cause__ = cause
    assert wrapped.name == "tokenize"
    error = user_error("tokenize", "record 0", wrapped)
    assert error.__cause__ is cause
    assert "raised KeyError('k')" in str(error)
