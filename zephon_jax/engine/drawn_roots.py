"""The roots a column-wise mixture lane drew, by index, as one int64 array.

A lane whose documents a mixture draws (see :mod:`zephon_jax.engine.columns`)
numbers its draws: the placement kernel
(:func:`~zephon_jax.core.compiled_kernels.draw_place`) writes each draw into
:attr:`DrawnRoots.array` and codes each piece by its draw's index (with the piece's
number where ``split`` cuts). The draws from :attr:`~DrawnRoots.base` on are the
columns ``(position, component, component draw)`` of that ``(3, capacity)`` array:
no Python object per draw, so nothing for the garbage collector to walk, and 24
bytes a draw. The lane drops the draws that neither its open rows nor the rows its
accounting has not counted yet point to (:meth:`~DrawnRoots.keep_only`), renumbering
the pieces that point to those it keeps.

Columns below :attr:`~DrawnRoots.size` are never written again: growing and keeping
make a new array. So a :meth:`~DrawnRoots.view` taken for a snapshot stays valid.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

_FIRST_CAPACITY = 64


class RootsView(NamedTuple):
    """Draws ``base`` to ``base + array.shape[1] - 1`` as of one moment (see
    :meth:`DrawnRoots.view`)."""

    array: np.ndarray
    base: int

    def columns(self, indices: np.ndarray) -> np.ndarray:
        """The draws at ``indices`` as a ``(3, n)`` array."""
        return self.array[:, indices - self.base]

    def tuples(self, indices: Sequence[int]) -> list[tuple]:
        """The draws at ``indices`` as ``(position, component, component draw)`` tuples,
        the form a piece's lineage holds."""
        at = np.asarray(indices, np.int64) - self.base
        return list(map(tuple, self.array[:, at].T.tolist()))


class DrawnRoots:
    """Draws ``base .. base + size - 1`` of one lane: ``array[:, i - base]`` is draw
    ``i`` as ``(position, component, component draw)``; the kernel appends at
    ``array[:, size]``."""

    __slots__ = ("array", "base", "size", "limit")

    def __init__(self) -> None:
        self.array = np.empty((3, _FIRST_CAPACITY), np.int64)
        self.base = 0
        self.size = 0
        self.limit = 0  # twice the draws the last keep_only kept

    def __len__(self) -> int:
        return self.size

    @property
    def end(self) -> int:
        """The index the next draw gets."""
        return self.base + self.size

    def grow(self, room: int = 1) -> None:
        """Makes room for at least ``room`` more draws (a new array, at least twice as
        large, holding the same draws)."""
        grown = np.empty((3, max(2 * self.array.shape[1], self.size + room)), np.int64)
        grown[:, : self.size] = self.array[:, : self.size]
        self.array = grown

    def extend(self, roots: np.ndarray) -> None:
        """Appends roots given as the rows ``(position, component, component draw)`` of
        an ``(n, 3)`` int64 array."""
        n = len(roots)
        if not n:
            return
        if self.size + n > self.array.shape[1]:
            self.grow(n)
        self.array[:, self.size : self.size + n] = roots.T
        self.size += n

    def view(self) -> RootsView:
        """The draws held now; later draws and drops leave it as it is."""
        return RootsView(self.array[:, : self.size], self.base)

    def tuples(self, indices: Sequence[int]) -> list[tuple]:
        """The draws at ``indices`` as tuples (see :meth:`RootsView.tuples`)."""
        return self.view().tuples(indices)

    def keep_only(self, kept: np.ndarray, capacity: int = 0) -> int:
        """Keeps only the draws at the sorted, distinct indices ``kept`` (each in
        ``base .. end - 1``), in a new array with room for ``capacity`` draws (at
        least twice as many as kept), where they take the indices ``end - len(kept)``
        to ``end - 1`` in order (the next draw's index does not change); returns the
        first of them. Whoever holds a kept draw's index must renumber it (to ``first``
        plus its place in ``kept``); views taken before keep their own array. The next
        pass is due once twice as many are held."""
        n = len(kept)
        array = np.empty((3, max(_FIRST_CAPACITY, 2 * n, capacity)), np.int64)
        array[:, :n] = self.array[:, kept - self.base]
        first = self.end - n
        self.array, self.size, self.base = array, n, first
        self.limit = 2 * n
        return first
