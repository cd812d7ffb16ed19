"""The rows one placement of a column-wise lane emits, as one run, and a batch of them.

The placement kernel writes a run's pieces into one int64 array of four rows
(codes, starts, lengths, leaves), which nothing writes to afterwards, and gives
each row's end in it. :class:`TokenRowRun` holds that array and the ends; a lane
holds its rows made ahead as such runs (see :mod:`zephon_jax.engine.pending`), and a
take hands out :class:`RunRow` elements, one small object per row, whose row (a
:class:`~zephon_jax.operators.token_bins.TokenRow`) and lineage are made only when
read. A batch of them (:class:`RunRows`) gives the gather its pieces straight from
the runs' arrays, by one kernel (no row objects, no per-row array views).

A row's lineage is ``(its pieces' lineages, their lengths)``. A piece's code is its
lineage (a record position) or, in a mixture lane, the index of its draw among the
lane's drawn roots as of the placement (:func:`lineages_of_draws`): the run keeps
the roots' array of that moment, whose columns up to then are never written again.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Sequence, overload

import numpy as np

from zephon_jax.core.compiled_kernels import data_address
from zephon_jax.core.kernels import kernels
from zephon_jax.core.lineage import Element, decode_piece, piece
from zephon_jax.engine.drawn_roots import RootsView
from zephon_jax.operators.token_bins import TokenRow

__all__ = ["RunRow", "RunRows", "TokenRowRun", "lineages_of_draws", "row_lineage"]


def lineages_of_draws(roots: RootsView, cut: int, codes: Sequence[int]) -> tuple:
    """The lineages of pieces coded by indices into ``roots``: ``((root,), piece)`` with
    a cut, else the root (as the general path holds them)."""
    if cut:
        parts = list(map(decode_piece, codes))
        drawn = roots.tuples([at for at, _ in parts])
        return tuple(piece(root, j) for root, (_, j) in zip(drawn, parts))
    return tuple(roots.tuples(codes))


def row_lineage(
    array: np.ndarray, base: int, cut: int, pieces: np.ndarray, begin: int, end: int
) -> tuple:
    """The lineage of the row of pieces ``[begin, end)`` of ``pieces``, its pieces
    coded by indices into the drawn roots ``RootsView(array, base)``."""
    codes = pieces[0, begin:end].tolist()
    held = tuple(pieces[2, begin:end].tolist())
    return lineages_of_draws(RootsView(array, base), cut, codes), held


def coded_lineage(pieces: np.ndarray, begin: int, end: int) -> tuple:
    """The lineage of the row of pieces ``[begin, end)`` whose codes are their lineages."""
    return tuple(pieces[0, begin:end].tolist()), tuple(pieces[2, begin:end].tolist())


class TokenRowRun:
    """Rows ``0 .. len - 1`` of one placement: row ``i`` holds pieces
    ``[ends[i - 1], ends[i])`` of ``pieces`` (``ends[-1]``: 0).

    ``kind``: ``(spec, fields, tokens, training)`` of
    :class:`~zephon_jax.operators.token_bins.TokenRow`, whose block is ``pieces``' rows
    of starts, lengths and (with ``several`` token arrays) leaves. ``roots``: ``(array,
    base, cut)`` of the drawn roots the codes index (a mixture lane's, as of the
    placement), or None where the codes are the pieces' lineages. ``lineages``: the
    rows' lineages where they are known (a restore's rows). ``bounds``: ``0`` and the
    ends as an int64 array, which may be given instead of ``ends`` (``None``). A
    lineage, once made by :meth:`lineages`, is kept and given out again."""

    __slots__ = (
        "kind", "pieces", "block", "address", "width", "_ends", "roots", "_lineages", "_bounds",
        "_rows",
    )  # fmt: skip

    def __init__(
        self,
        kind: tuple,
        pieces: np.ndarray,
        several: bool,
        ends: list[int] | None,
        roots: Any,
        lineages: list | None = None,
        bounds: np.ndarray | None = None,
    ):
        pieces = np.ascontiguousarray(pieces)  # (as collect_pieces reads it)
        self.kind = kind
        self.pieces = pieces
        self.block = pieces[1:] if several else pieces[1:3]
        self.address = data_address(pieces) if pieces.size else 0
        self.width = pieces.shape[1]
        self._ends = ends  # (None: made from bounds when asked for)
        self.roots = roots
        self._lineages = lineages  # made so far (None: none), or given
        self._bounds = bounds  # (None: made from ends when asked for, see bounds_address)
        self._rows = len(bounds) - 1 if ends is None else len(ends)  # type: ignore[arg-type]

    @property
    def ends(self) -> list[int]:
        """Each row's end in :attr:`pieces` (given, or made once from the bounds)."""
        ends = self._ends
        if ends is None:
            assert self._bounds is not None
            ends = self._ends = self._bounds[1:].tolist()
        return ends

    def __len__(self) -> int:
        return self._rows

    def elements(self, begin: int, end: int) -> list[Element]:
        """Elements of rows ``[begin, end)``."""
        ends = self.ends
        start = ends[begin - 1] if begin else 0
        if end == begin + 1:  # (one row: most takes of a lane that owns one row)
            return [RunRow(self, begin, start, ends[begin])]
        out: list[Element] = []
        for i in range(begin, end):
            stop = ends[i]
            out.append(RunRow(self, i, start, stop))
            start = stop
        return out

    def bounds_address(self) -> int:
        """The address of the rows' bounds, an int64 array of 0 and :attr:`ends` (given,
        or made once, on the first call, and kept: see
        :func:`~zephon_jax.core.compiled_kernels.row_bounds`)."""
        bounds = self._bounds
        if bounds is None:
            bounds = self._bounds = np.array([0, *self.ends], np.int64)
        return data_address(bounds)

    def row(self, begin: int, end: int) -> TokenRow:
        """The row of pieces ``[begin, end)``."""
        spec, fields, tokens, training = self.kind
        return TokenRow(spec, fields, tokens, self.block, begin, end, training)

    def recipe(self, i: int, begin: int, end: int) -> tuple[Callable[..., Any] | None, Any]:
        """``(make, args)`` making row ``i``'s lineage (pieces ``[begin, end)``) later
        from plain data (see :class:`~zephon_jax.engine.rows.Picks`), or ``(None,
        lineage)`` where it is made already."""
        made = self._lineages
        if made is not None and made[i] is not None:
            return None, made[i]
        if self.roots is None:
            return coded_lineage, (self.pieces, begin, end)
        array, base, cut = self.roots
        return row_lineage, (array, base, cut, self.pieces, begin, end)

    def lineage_of(self, i: int, begin: int, end: int) -> Any:
        """The lineage of row ``i`` (pieces ``[begin, end)``)."""
        make, args = self.recipe(i, begin, end)
        return args if make is None else make(*args)

    def lineage_at(self, i: int) -> Any:
        """The lineage of row ``i``."""
        return self.lineage_of(i, self.ends[i - 1] if i else 0, self.ends[i])

    def lineages(self, begin: int) -> list:
        """The lineages of rows ``begin`` on, made once and kept."""
        made = self._lineages
        if made is None:
            made = self._lineages = [None] * len(self.ends)
        for i in range(begin, len(made)):
            if made[i] is None:
                made[i] = self.lineage_at(i)
        return made[begin:]


class RunRow(Element):
    """Row ``index`` of ``run``, its pieces ``[begin, end)``: an element whose row and
    lineage are made each time they are read."""

    __slots__ = ("run", "index", "begin", "end")

    def __init__(self, run: TokenRowRun, index: int, begin: int, end: int):
        self.run = run
        self.index = index
        self.begin = begin
        self.end = end

    @property
    def data(self) -> TokenRow:
        return self.run.row(self.begin, self.end)

    @property
    def lineage(self) -> Any:
        return self.run.lineage_of(self.index, self.begin, self.end)

    def recipe(self) -> tuple[Callable[..., Any] | None, Any]:
        """See :meth:`TokenRowRun.recipe`."""
        return self.run.recipe(self.index, self.begin, self.end)

    def __repr__(self) -> str:
        return f"RunRow(lineage={self.lineage!r})"


_RUN = operator.attrgetter("run")
_INDEX = operator.attrgetter("index")
_KIND = operator.attrgetter("kind")
_ADDRESS = operator.attrgetter("address")
_WIDTH = operator.attrgetter("width")
_BEGIN = operator.attrgetter("begin")
_END = operator.attrgetter("end")


class RunRows(Sequence[TokenRow]):
    """The rows of a batch of column-wise lanes, kept as their runs and arrays of where
    they are in them (no object per row): row ``r`` is row ``indices[r]`` of
    ``runs[r]``, its pieces ``[begins[r], ends[r])`` of the run's. Each item a new
    :class:`~zephon_jax.operators.token_bins.TokenRow`, and, for the gather of
    :meth:`TokenRow.gather_batch <zephon_jax.operators.token_bins.TokenRow.gather_batch>`,
    :meth:`one_kind` and :meth:`pieces` read from the runs in passes. ``one_plan``: the
    runs are all of one lane plan's (their ``kind`` is one object); ``addresses`` and
    ``widths``: the runs' (None: read from the runs when needed)."""

    __slots__ = ("runs", "indices", "begins", "ends", "one_plan", "addresses", "widths")

    def __init__(
        self,
        runs: list[TokenRowRun],
        indices: np.ndarray,
        begins: np.ndarray,
        ends: np.ndarray,
        one_plan: bool = False,
        addresses: np.ndarray | None = None,
        widths: np.ndarray | None = None,
    ):
        self.runs = runs
        self.indices = indices
        self.begins = begins
        self.ends = ends
        self.one_plan = one_plan
        self.addresses = addresses
        self.widths = widths

    @staticmethod
    def of(elements: list[Element]) -> RunRows | None:
        """The rows of ``elements`` where all are :class:`RunRow`, else None."""
        if not elements or set(map(type, elements)) != {RunRow}:
            return None
        n = len(elements)
        return RunRows(
            list(map(_RUN, elements)),
            np.fromiter(map(_INDEX, elements), np.int64, n),
            np.fromiter(map(_BEGIN, elements), np.int64, n),
            np.fromiter(map(_END, elements), np.int64, n),
        )

    def elements(self) -> list[RunRow]:
        """The rows as :class:`RunRow` elements."""
        return self._each(RunRow)

    def _each(self, function: Callable[[TokenRowRun, int, int, int], Any]) -> list:
        """``function(run, index, begin, end)`` of each row."""
        lists = (self.indices.tolist(), self.begins.tolist(), self.ends.tolist())
        return list(map(function, self.runs, *lists))

    def __len__(self) -> int:
        return len(self.runs)

    @overload
    def __getitem__(self, i: int) -> TokenRow: ...

    @overload
    def __getitem__(self, i: slice) -> list[TokenRow]: ...

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(len(self))[i]]
        return self.runs[i].row(int(self.begins[i]), int(self.ends[i]))

    def lineages(self) -> list:
        """The rows' lineages, made now."""
        return self._each(TokenRowRun.lineage_of)

    def one_kind(self) -> bool:
        """Whether the rows have one spec, one set of token arrays and one
        ``to_training`` (the same objects)."""
        if self.one_plan:
            return True
        if len(set(map(id, map(_KIND, self.runs)))) == 1:  # (the common case: one plan's)
            return True
        kinds = {id(kind): kind for kind in map(_KIND, self.runs)}
        return all(len({id(kind[k]) for kind in kinds.values()}) == 1 for k in (0, 2, 3))

    def pieces(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows' pieces one after the other, as one int64 array of their starts,
        lengths and (where there are several token arrays) leaves, and each row's end
        in it; by one kernel over the runs' arrays (compiled kernels only)."""
        runs, n = self.runs, len(self.runs)
        addresses, widths = self.addresses, self.widths
        if addresses is None or widths is None:
            addresses = np.fromiter(map(_ADDRESS, runs), np.int64, n)
            widths = np.fromiter(map(_WIDTH, runs), np.int64, n)
        ends = (self.ends - self.begins).cumsum()
        out = np.empty((runs[0].block.shape[0], int(ends[-1]) if n else 0), np.int64)
        kernels().collect_pieces(addresses, widths, self.begins, self.ends, out)
        return out, ends
