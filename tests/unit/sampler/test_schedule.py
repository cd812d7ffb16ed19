"""``StepSchedule``: ``{start_step: value}`` with a first key of 0; the value at step ``t``
is the one of the largest start ``<= t``; bad schedules are refused naming the fix."""

from __future__ import annotations

import sys

import pytest

from zephon_jax.errors import PipelineError
from zephon_jax.sampler.schedule import StepSchedule


def as_int(value, what):
    if not isinstance(value, int):
        raise PipelineError(f"{what} is {value!r}, not an int")
    return value


def test_parse_sorts_the_stages_and_checks_each_value_naming_its_step():
    seen = []

    def check(value, what):
        seen.append(what)
        return value * 10

    schedule = StepSchedule.parse({100: 3, 0: 1, 40: 2}, "batch size", check)
    assert schedule.starts == (0, 40, 100)
    assert schedule.values == (10, 20, 30)
    assert seen == ["batch size at step 0", "batch size at step 40", "batch size at step 100"]


def test_the_value_in_force_is_the_latest_stage_started():
    schedule = StepSchedule.parse({0: 8, 10: 16, 25: 32}, "batch size", as_int)
    assert [schedule.at(t) for t in (0, 9, 10, 24, 25, 10**9)] == [8, 8, 16, 16, 32, 32]
    assert [schedule.index_at(t) for t in (0, 9, 10, 24, 25)] == [0, 0, 1, 1, 2]
    assert not schedule.is_constant
    assert StepSchedule.parse({0: 8}, "batch size", as_int).is_constant


def test_describe_and_repr():
    schedule = StepSchedule.parse({5: "b", 0: "a"}, "weights", lambda v, what: v)
    assert schedule.describe() == {"0": "a", "5": "b"}
    assert repr(schedule) == "{0: 'a', 5: 'b'}"


@pytest.mark.parametrize(
    "schedule, match",
    [
        ({}, r"batch size schedule is empty; give \{0: value, \.\.\.\}"),
        ({0: 8, -1: 4}, r"key -1 is not a step; keys are ints >= 0"),
        ({0: 8, True: 4}, r"key True is not a step"),
        ({0: 8, 2.0: 4}, r"key 2\.0 is not a step"),
        ({"0": 8}, r"key '0' is not a step"),
        ({5: 8, 10: 16}, r"starts at step 5; its first key must be 0"),
        ({0: 8, 3: "16"}, r"batch size at step 3 is '16', not an int"),
    ],
)
def test_bad_schedules_are_refused(schedule, match):
    with pytest.raises(PipelineError, match=match):
        StepSchedule.parse(schedule, "batch size", as_int)


def test_next_start_is_the_first_stage_start_after_the_step():
    schedule = StepSchedule.parse({0: 1, 40: 2, 100: 3}, "batch size", as_int)
    assert [schedule.next_start(s) for s in (0, 39, 40, 99)] == [40, 40, 100, 100]
    assert schedule.next_start(100) == schedule.next_start(10**9) == sys.maxsize
    assert StepSchedule.parse({0: 1}, "batch size", as_int).next_start(0) == sys.maxsize
