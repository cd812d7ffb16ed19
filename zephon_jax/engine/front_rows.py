"""A step's takes of column-wise lanes, for all lanes at once.

A column-wise lane holds its rows made ahead as runs
(:class:`~zephon_jax.engine.token_rows.TokenRowRun`) in its
:class:`~zephon_jax.engine.pending.PendingRows`, and nearly every step takes its rows
from the first of them. Lane by lane, such a take is a few Python calls and a new
object per row, on objects the batch's megabytes pushed out of the caches since the
last step: about a microsecond a lane, a fifth of a batch of the bare pipeline.

:class:`FrontRows` holds, as arrays over a producer's lanes, each lane's first run
(its pieces' address and width, the address of its rows' bounds), the next row of it
and the rows left in it. A step takes the rows of every lane with enough left there by
a few array operations and one kernel call (:func:`~zephon_jax.core.compiled_kernels.row_bounds`),
giving the batch's :class:`~zephon_jax.engine.token_rows.RunRows` directly; the other
lanes take as before (:func:`~zephon_jax.engine.columns.take_column_lanes`), and their
new first runs are noted.

The rows and steps taken that way are *owed* to the lanes: a lane takes them (from its
``PendingRows``, making nothing, and adds the steps) the first time anything reads its
``pending`` or ``step`` (see :meth:`~zephon_jax.engine.lane.Lane.pending`), so every other
reader (the accounting, restores, a lane's own take) sees it exactly as if it had taken
each step itself; its first run is then noted again at its next take. A snapshot (taken
every batch where batches go to devices) reads what the lane owes without settling.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import numpy as np

from zephon_jax.core import compiled_kernels as kc
from zephon_jax.core.kernels import kernels
from zephon_jax.engine.columns import fill_column_lanes, take_column_lanes
from zephon_jax.engine.token_rows import RunRow, RunRows, TokenRowRun

__all__ = ["FrontRows"]


class _Picks:
    """Where a batch size's rows come from: the slot (lane) and row of its take of
    each, its rows by lane, and a getter of each row's slot's item of a list."""

    __slots__ = ("slots", "offsets", "rows_of", "get")

    def __init__(self, slots: list[int], offsets: list[int]):
        self.slots = np.array(slots, np.int64)
        self.offsets = np.array(offsets, np.int64)
        self.rows_of: dict[int, list[tuple[int, int]]] = {}
        for r, (k, i) in enumerate(zip(slots, offsets)):
            self.rows_of.setdefault(k, []).append((r, i))
        get: Callable[[list], Any] = operator.itemgetter(*slots) if slots else lambda _: ()
        self.get = (lambda items: [get(items)]) if len(slots) == 1 else get


class FrontRows:
    """The first runs of ``lanes`` (column-wise lanes of one plan, by number, in the
    producer's order) as a table over them, and the rows taken from them not yet taken
    from the lanes (see the module's docstring). Made for one dict of lanes: a restore
    makes new lanes, and a new FrontRows with them."""

    def __init__(self, lanes: dict[int, Any]):
        self.lanes = lanes
        self._order = list(lanes.values())
        self._slot = {l: k for k, l in enumerate(lanes)}
        size = len(self._order)
        self._runs: list[TokenRowRun | None] = [None] * size
        # Per slot, see compiled_kernels.take_front (0 rows left where none is noted).
        self._table = np.zeros((kc.FRONT_TABLE, size), np.int64)
        self._slow = np.zeros(size, np.int64)
        self._all = np.arange(size, dtype=np.int64)  # every slot
        self._picks: dict[int, _Picks] = {}

    def settle(self, k: int) -> None:
        """Has slot ``k``'s lane take the rows and steps it owes (it owes nothing
        after); forgets its first run."""
        self._runs[k] = None
        table = self._table
        owed, steps = self.owed(k)
        table[kc.LEFT, k] = table[kc.OWED, k] = table[kc.OWED_STEPS, k] = 0  # (the rest: _note)
        self._order[k].take_owed(owed, steps)

    def owed(self, k: int) -> tuple[int, int]:
        """The rows and steps slot ``k``'s lane owes."""
        table = self._table
        return int(table[kc.OWED, k]), int(table[kc.OWED_STEPS, k])

    def _note(self, k: int) -> None:
        """Notes slot ``k``'s lane's first run, where it is a run of rows (a lane that
        owes nothing), to take its rows from it (the lane then owes them)."""
        lane = self._order[k]
        run, row = lane.pending.front()
        if type(run) is TokenRowRun and row < len(run):
            self._runs[k] = run
            table = self._table
            table[kc.NEXT, k], table[kc.LEFT, k] = row, len(run) - row
            table[kc.ADDRESS, k], table[kc.WIDTH, k] = run.address, run.width
            table[kc.BOUNDS, k] = run.bounds_address()
            lane.owe_to(self, k)

    def take(self, n: int, picks: list[tuple[int, int]]) -> tuple[Any, dict[int, int] | None]:
        """Every lane's take of its ``n`` rows of the next step: the rows ``picks``
        (``(lane, row of its take)`` each, in order) as
        :class:`~zephon_jax.engine.token_rows.RunRows` (or as elements, where a lane
        gives other rows), or, once a lane's finite input ended, None and how many rows
        each lane took."""
        chosen = self._picks.get(id(picks))
        if chosen is None:
            slot = self._slot
            chosen = _Picks([slot[l] for l, _ in picks], [i for _, i in picks])
            self._picks[id(picks)] = chosen
        out = np.empty((5, len(chosen.slots)), np.int64)
        take_front = kernels().take_front
        count = take_front(n, self._table, self._all, chosen.slots, chosen.offsets, out, self._slow)
        if count:
            count = self._fill_and_take(n, chosen, count, out)
        runs = list(chosen.get(self._runs))
        rows = RunRows(runs, out[0], out[1], out[2], True, out[3], out[4])
        if not count:
            return rows, None
        order = self._order
        slow = self._slow[:count].tolist()
        taken = take_column_lanes({order[k].lane: order[k] for k in slow}, n)
        for k in slow:
            self._note(k)
        if None in taken.values():
            counts = dict.fromkeys(self.lanes, n)
            counts.update({l: len(elements or ()) for l, elements in taken.items()})
            return None, counts
        return self._with_slow(rows, chosen, slow, taken), None

    def _fill_and_take(self, n: int, chosen: _Picks, count: int, out: np.ndarray) -> int:
        """Has the ``count`` lanes that lacked ``n`` rows in their first runs make their
        rows (as their takes would), notes their new first runs, and takes from those
        (the rows into their columns of ``out``); returns how many still lack the rows
        there (their columns in ``_slow``: a run ends within the take, or their first
        item is not a run of rows) or, where a lane's input ended, all ``count``."""
        slow = self._slow[:count].tolist()
        if not fill_column_lanes([self._order[k] for k in slow], n):
            return count
        for k in slow:
            self._note(k)
        rows = [r for k in slow for r, _ in chosen.rows_of.get(k, ())]
        again = np.empty((5, len(rows)), np.int64)
        count = kernels().take_front(
            n, self._table, np.array(slow, np.int64), chosen.slots[rows],
            chosen.offsets[rows], again, self._slow,
        )  # fmt: skip
        out[:, rows] = again
        return count

    def _with_slow(
        self, rows: RunRows, chosen: _Picks, slow: list[int], taken: dict[int, list | None]
    ) -> Any:
        """``rows`` with those of the ``slow`` lanes' takes ``taken`` in their places;
        as elements where a lane's rows are not all rows of runs."""
        order = self._order
        runs = rows.runs
        for k in slow:
            elements = taken[order[k].lane]
            assert elements is not None
            for r, i in chosen.rows_of.get(k, ()):
                element = elements[i]
                if type(element) is not RunRow:
                    return self._elements(rows, chosen, slow, taken)
                run = element.run
                runs[r] = run
                rows.indices[r], rows.begins[r], rows.ends[r] = (
                    element.index,
                    element.begin,
                    element.end,
                )
                rows.addresses[r], rows.widths[r] = run.address, run.width  # type: ignore[index]
        return rows

    def _elements(
        self, rows: RunRows, chosen: _Picks, slow: list[int], taken: dict[int, list | None]
    ) -> list:
        """The batch's rows as elements (see :meth:`_with_slow`)."""
        elements: list = rows.elements()  # (those of the slow lanes replaced below)
        order = self._order
        for k in slow:
            lane_rows = taken[order[k].lane]
            assert lane_rows is not None
            for r, i in chosen.rows_of.get(k, ()):
                elements[r] = lane_rows[i]
        return elements
