"""``Envelope``: every saved form names its format and version, and one check reads them."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_jax.errors import StateError
from zephon_jax.state.envelope import CHECKPOINT, LANE, STATE, STATE_FILE, Envelope, is_int

FORM = Envelope("zephon_jax.example", 3)


def test_header_starts_a_saved_dict_and_passes_the_check():
    assert FORM.header() == {"format": "zephon_jax.example", "version": 3}
    FORM.check({**FORM.header(), "more": 1}, "the example")
    FORM.check({"format": "zephon_jax.example", "version": np.int64(3)}, "the example")


@pytest.mark.parametrize(
    "saved, match",
    [
        ([("format", "zephon_jax.example")], r"the example is a dict; got list"),
        ({"version": 3}, r"the example has no 'format' entry; it is not a zephon_jax\.example"),
        ({"format": "zephon_jax.example"}, r"has no 'version' entry; .*truncated"),
        ({"format": "other", "version": 3}, r"format is 'other', not 'zephon_jax\.example'"),
        ({"format": "zephon_jax.example", "version": 2}, r"has version 2; this zephon_jax reads"),
        ({"format": "zephon_jax.example", "version": "3"}, r"'version' is '3' \(str\)"),
        ({"format": "zephon_jax.example", "version": True}, r"'version' is True \(bool\)"),
    ],
)
def test_check_names_what_it_found_and_what_it_reads(saved, match):
    with pytest.raises(StateError, match=match):
        FORM.check(saved, "the example")


def test_another_version_says_which_release_restores_it():
    with pytest.raises(StateError) as info:
        FORM.check_version(4, "the item")
    assert str(info.value) == (
        "the item has version 4; this zephon_jax reads version 3: restore it with the "
        "zephon_jax release that wrote it"
    )


@pytest.mark.parametrize("value", [0, 3, -1, np.int8(3), np.uint64(3)])
def test_is_int_takes_python_and_numpy_integers(value):
    assert is_int(value)


@pytest.mark.parametrize("value", [True, np.bool_(False), 3.0, "3", None, np.float32(3)])
def test_is_int_refuses_bools_floats_and_text(value):
    assert not is_int(value)


def test_the_saved_forms_have_distinct_formats():
    forms = [STATE, LANE, CHECKPOINT, STATE_FILE]
    assert len({f.format for f in forms}) == 4
    assert all(f.format.startswith("zephon_jax.") and f.version >= 1 for f in forms)
    assert STATE.header() == {"format": "zephon_jax.state.global_state", "version": 1}
