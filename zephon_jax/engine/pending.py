"""A lane's finished rows waiting to be taken.

A lane makes rows ahead of the steps that take them (a block's worth, or a mixture
lane's draws for the next steps of its stage, see :mod:`zephon_jax.engine.blocks`).
Held as one element (and row, and lineage recipe) each, those are thousands of
objects with many lanes that outlive the batch that made them: the garbage
collector's young generation then fills with them every batch, and the collections
they trigger walk them, then all long-lived objects of the process each time enough
of them have moved there (about 1.5 ms a batch at 1024 lanes, a tenth of its time).

:class:`PendingRows` holds them as runs instead: lists of elements, or a
placement's run of rows (:class:`RowRun`, one object for all its rows) whose
elements are made only when taken, within the batch that frees them.
"""

from __future__ import annotations

import collections
from typing import Any, Iterable, Iterator, Protocol, Sequence

from zephon_jax.core.lineage import Element

__all__ = ["PendingRows", "RowRun"]


class RowRun(Protocol):
    """Rows made together, in order, whose elements are made when asked for."""

    def __len__(self) -> int: ...

    def elements(self, begin: int, end: int) -> list[Element]:
        """New elements of rows ``[begin, end)``."""
        ...

    def lineages(self, begin: int) -> list[Any]:
        """The lineages of rows ``begin`` on (made once and kept by the run)."""
        ...


def _elements(run: Any, begin: int, end: int) -> list[Element]:
    return run[begin:end] if type(run) is list else run.elements(begin, end)


class PendingRows:
    """Finished rows in the order they were made, taken from the front.

    Holds runs: lists of :class:`~zephon_jax.core.lineage.Element`, or :class:`RowRun`
    objects, whose elements are new each time they are read (taken, iterated); the
    rows and lineages are the same. Nothing but :meth:`extend`, :meth:`take`
    and :meth:`drop` changes it."""

    __slots__ = ("_runs", "_first", "_size")

    def __init__(self, rows: Iterable[Element] = ()):
        self._runs: collections.deque[Any] = collections.deque()
        self._first = 0  # rows of the first run already taken
        self._size = 0
        self.extend(list(rows))

    def __len__(self) -> int:
        return self._size

    def extend(self, rows: Sequence[Element] | RowRun) -> None:
        """Appends ``rows``: elements (a list is kept as it is: do not change it) or a
        :class:`RowRun`."""
        if type(rows) is not list and not hasattr(rows, "elements"):
            rows = list(rows)
        n = len(rows)
        if n:
            self._runs.append(rows)
            self._size += n

    def take(self, n: int) -> list[Element]:
        """Removes the first ``n`` rows (``n <= len(self)``) and returns their elements."""
        runs = self._runs
        if runs and n > 0:  # the common case: the rows are in the first run
            run, first = runs[0], self._first
            end = first + n
            size = len(run)
            if end <= size:
                if end == size:
                    runs.popleft()
                    self._first = 0
                else:
                    self._first = end
                self._size -= n
                return run[first:end] if type(run) is list else run.elements(first, end)
        return self._take_across(n)

    def drop(self, n: int) -> None:
        """Removes the first ``n`` rows (``n <= len(self)``) without making their elements
        (rows already handed out otherwise, see :mod:`zephon_jax.engine.front_rows`)."""
        if n > self._size:
            raise IndexError(f"drop({n}) of {self._size} pending rows")
        runs = self._runs
        first = self._first + n
        while runs and first >= len(runs[0]):
            first -= len(runs.popleft())
        self._first = first
        self._size -= n

    def front(self) -> tuple[Any, int]:
        """``(run, row)``: the first run and its first row not taken (``(None, 0)``:
        none)."""
        return (self._runs[0], self._first) if self._runs else (None, 0)

    def _take_across(self, n: int) -> list[Element]:
        """:meth:`take` of rows of several runs (or of none)."""
        if n > self._size:
            raise IndexError(f"take({n}) of {self._size} pending rows")
        taken: list[Element] = []
        while len(taken) < n:
            taken += self.take(min(n - len(taken), len(self._runs[0]) - self._first))
        return taken

    def __iter__(self) -> Iterator[Element]:
        """The rows' elements, first to last (new ones for a :class:`RowRun`'s rows)."""
        first = self._first
        for run in self._runs:
            yield from _elements(run, first, len(run))
            first = 0

    def lineages(self) -> tuple:
        """The rows' lineages, first to last, each made once (a state saves them)."""
        out: list[Any] = []
        first = self._first
        for run in self._runs:
            if type(run) is list:
                out += [element.lineage for element in run[first:]]
            else:
                out += run.lineages(first)
            first = 0
        return tuple(out)
