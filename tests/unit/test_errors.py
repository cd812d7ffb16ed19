"""The exception classes' contract: one base, the builtin each also is (so callers can
catch ``ValueError``/``RuntimeError``), ``StateMismatchError``'s fields and message, and
``add_note`` on every Python version."""

from __future__ import annotations

import pickle

import pytest

import zephon_jax as zj
from zephon_jax import errors
from zephon_jax.errors import (
    PipelineError,
    RecordError,
    StateError,
    StateMismatchError,
    WorkerError,
    ZephonError,
    add_note,
)


@pytest.mark.parametrize(
    "cls, builtin",
    [
        (PipelineError, ValueError),
        (RecordError, RuntimeError),
        (WorkerError, RuntimeError),
        (StateError, ValueError),
        (StateMismatchError, StateError),
    ],
)
def test_each_error_is_a_zephon_error_and_its_builtin(cls, builtin):
    assert issubclass(cls, ZephonError) and issubclass(cls, builtin)
    assert issubclass(ZephonError, Exception) and not issubclass(ZephonError, ValueError)


def test_the_package_exports_the_errors():
    for name in ("ZephonError", "PipelineError", "RecordError", "WorkerError", "StateError"):
        assert getattr(zj, name) is getattr(errors, name)


def test_state_mismatch_names_the_field_both_values_and_the_fix():
    error = StateMismatchError("batch_size", 8, 16)
    assert (error.field, error.saved, error.current) == ("batch_size", 8, 16)
    assert str(error) == (
        "cannot restore: the state's pipeline 'batch_size' differs from this pipeline's.\n"
        "  state:    8\n  pipeline: 16\n"
        "Restore into the pipeline the state was taken from (same batch_size), "
        "or start a fresh run without restoring."
    )


def test_state_mismatch_can_show_other_values_than_it_keeps():
    error = StateMismatchError(
        "seeds", (123,), (456,), shown=("shuffle(seed=1)", "shuffle(seed=2)")
    )
    assert error.saved == (123,) and error.current == (456,)
    assert "state:    shuffle(seed=1)\n  pipeline: shuffle(seed=2)" in str(error)
    assert "123" not in str(error)


def test_add_note_keeps_notes_in_order():
    error = RecordError("x")
    add_note(error, "first")
    add_note(error, "second")
    assert error.__notes__ == ["first", "second"]


def test_add_note_without_base_exception_add_note():
    class Old(Exception):
        add_note = None  # as on Python 3.10: no callable add_note

    error = Old("x")
    add_note(error, "one")
    add_note(error, "two")
    assert error.__notes__ == ["one", "two"]


def test_errors_pickle_with_their_message():
    again = pickle.loads(pickle.dumps(PipelineError("bad argument")))
    assert type(again) is PipelineError and str(again) == "bad argument"
