"""Step schedules: values that change at given global steps (batch sizes, mixture stages).

A schedule is a dict ``{start_step: value, ...}`` whose first key is 0; the
value in force at step ``t`` is the one of the largest start step ``<= t``.
"""

from __future__ import annotations

import bisect
import sys
from typing import Any, Callable, Generic, Mapping, TypeVar

from zephon_jax.errors import PipelineError

T = TypeVar("T")


class StepSchedule(Generic[T]):
    """An immutable, validated ``{start_step: value}`` schedule."""

    def __init__(self, starts: tuple[int, ...], values: tuple[T, ...]):
        self.starts = starts
        self.values = values

    @classmethod
    def parse(
        cls, schedule: Mapping[Any, Any], what: str, check: Callable[[Any, str], T]
    ) -> StepSchedule[T]:
        """Validates ``schedule`` (``what`` names it in errors; ``check`` each value)."""
        if not schedule:
            raise PipelineError(f"{what} schedule is empty; give {{0: value, ...}}")
        items = []
        for start, value in schedule.items():
            if isinstance(start, bool) or not isinstance(start, int) or start < 0:
                raise PipelineError(
                    f"{what} schedule key {start!r} is not a step; keys are ints >= 0 "
                    "(the global step at which the value starts)"
                )
            items.append((int(start), value))
        items.sort(key=lambda kv: kv[0])
        if items[0][0] != 0:
            raise PipelineError(
                f"{what} schedule starts at step {items[0][0]}; its first key must be 0 "
                "(the value in force from the first step)"
            )
        values = tuple(check(v, f"{what} at step {s}") for s, v in items)
        return cls(tuple(s for s, _ in items), values)

    def index_at(self, step: int) -> int:
        """The index of the stage holding ``step``."""
        return bisect.bisect_right(self.starts, step) - 1

    def at(self, step: int) -> T:
        """The value in force at ``step``."""
        return self.values[self.index_at(step)]

    def next_start(self, step: int) -> int:
        """The first step after ``step`` at which another stage starts (``sys.maxsize``
        where none does)."""
        k = bisect.bisect_right(self.starts, step)
        return self.starts[k] if k < len(self.starts) else sys.maxsize

    @property
    def is_constant(self) -> bool:
        return len(self.values) == 1

    def describe(self) -> dict[str, Any]:
        return {str(s): v for s, v in zip(self.starts, self.values)}

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{s}: {v!r}" for s, v in zip(self.starts, self.values)) + "}"
