"""``pack``: bin packing of variable-length records into fixed-length rows.

``first_fit`` and ``best_fit`` keep ``num_bins`` open rows per lane. A record
goes into the first row it fits (``first_fit``: rows in the order they opened)
or the fullest one (``best_fit``: the lowest of equals); when it fits none, the
fullest row (the lowest of equals) is emitted and the record starts a new one.
A row is emitted as soon as it is full or holds ``max_segments`` records.
``best_fit`` starts the new row where the emitted one was; ``first_fit`` keeps
its rows in opening order (an emitted row's place goes to the end), which
leaves the rows that opened first the least room: on lengths uniform in
``1..seq_len`` it fills 0.95 of 32 rows where reusing the emitted row's place
fills 0.91. Records are never cut, so a record longer than ``seq_len`` raises
(put ``split(seq_len)`` before ``pack``); empty records are dropped.

Open rows hold pointers only: the arrays of their records (views, never
copies) and the records' lineages. Rows are assembled once, straight into the
batch (see :mod:`zephon_jax.core.packed` for the output fields and dtypes).

``pack`` right after ``split`` runs fused with it (:meth:`BinPackOperator.place_split`):
one loop cuts and places each record, with exactly the rows and carries of the
two operators one after the other.

``pack`` is made through the operator contract
(:class:`~zephon_jax.operators.contract.ContractOperator`), as a user's operator is.
Its carry (:class:`Bins`) is never changed once returned: ``step``, ``step_block``,
``place_split`` and ``flush`` copy the carry they are given (its small arrays and
its two dicts of held records, once per block) and return the copy, so a carry
can be saved, or stepped again, at any time (the copies cost about 2 % of the
rate of ``shuffle -> split(2048) -> pack(2048) -> batch(64)`` over a list of dicts,
compiled kernels or not). The saved form is cached in the carry and dropped only
by the carry's own methods that change its rows.
"""

from __future__ import annotations

from itertools import accumulate, chain
from typing import Any, Mapping, Sequence

import numpy as np

from zephon_jax.core.checks import positive_int
from zephon_jax.core.compiled_kernels import COMPILED, DONE, OUT_FULL, place
from zephon_jax.core.lineage import (
    Element,
    HeldLineages,
    can_code,
    derived,
    held_lineage,
    is_position,
    piece,
    piece_code,
    plain_parents,
)
from zephon_jax.core.packed import PackedRow, PackSpec
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.operators.base import BinPacking, Saved, StepFailed
from zephon_jax.operators.contract import ContractOperator, Made
from zephon_jax.state.envelope import is_int

DEFAULT_NUM_BINS = 32
METHODS = ("first_fit", "best_fit")
_FIRST_CAPACITY = 8  # pieces per open row before the arrays grow
_BASES = np.zeros(1, np.int64)  # records' pieces are documents of one leaf


def _row_array(num_bins: int, value: int | None) -> Any:
    """``num_bins`` times ``value`` (None: ``0, 1, ...``) as int64, or as a list where
    the kernels run interpreted."""
    if COMPILED:
        return (
            np.zeros(num_bins, np.int64)
            if value is not None
            else np.arange(num_bins, dtype=np.int64)
        )
    return [value] * num_bins if value is not None else list(range(num_bins))


class OpenRows:
    """Open rows as the arrays :func:`~zephon_jax.core.compiled_kernels.place` updates.

    ``fill[i]``, ``count[i]``: tokens and pieces in row ``i`` (int64 arrays, or lists
    where the kernel runs interpreted: it reads them faster); ``piece_array[:, i, m]``:
    piece ``m`` of row ``i`` as (lineage code, token start, length, leaf); ``slots``:
    the rows in bin order (first_fit moves an emitted row to the end; best_fit never
    reorders); ``out`` and ``row_end`` receive emitted rows. What a code, start and
    leaf stand for is the subclass's: :class:`Bins` (records) or
    :class:`~zephon_jax.operators.token_bins.TokenBins` (token arrays).
    """

    __slots__ = ("fill", "count", "piece_array", "slots", "out", "row_end", "_form")

    def __init__(self, num_bins: int):
        self.fill: Any = _row_array(num_bins, 0)
        self.count: Any = _row_array(num_bins, 0)
        self.piece_array = np.zeros((4, num_bins, _FIRST_CAPACITY), np.int64)
        self.slots: Any = _row_array(num_bins, None)
        self.out = np.empty((4, 4 * _FIRST_CAPACITY), np.int64)
        self.row_end = np.empty(4 * _FIRST_CAPACITY, np.int64)
        self._form: tuple[HeldLineages, tuple] | None = None  # see lineage_form

    def _changed(self) -> None:
        """Drops what is cached of the saved form. Every method that changes the rows
        calls it first, so nothing else ever clears the cache (nor may)."""
        self._form = None

    def grow_rows(self) -> None:
        """Doubles the pieces an open row can hold."""
        pieces = np.zeros((4, self.piece_array.shape[1], 2 * self.piece_array.shape[2]), np.int64)
        pieces[:, :, : self.piece_array.shape[2]] = self.piece_array
        self.piece_array = pieces

    def grow_out(self) -> None:
        """Doubles the emitted pieces and rows one kernel call can hold."""
        self.out = np.empty((4, 2 * self.out.shape[1]), np.int64)
        self.row_end = np.empty(2 * self.row_end.shape[0], np.int64)

    def place(
        self, documents: tuple, cut: int, spec: PackSpec, best: bool, log: Any = None
    ) -> tuple[np.ndarray, list]:
        """Places ``documents`` = ``(offsets, bases, leaves, records, positions)`` (see
        :func:`~zephon_jax.core.compiled_kernels.place`) with ``spec``'s row length and
        segment bound, growing the arrays as the kernel asks. Returns the emitted
        rows: their pieces as a new int64 array of four rows (codes, starts, lengths,
        leaves) and each row's end in it.

        ``log``, given, receives the emitted rows instead of this object's scratch
        arrays: an :class:`EmittedRows` (its ``out`` and ``row_end`` arrays, appended to
        after its first ``size`` pieces and ``rows`` rows, grown by its ``grow()``),
        which keeps them (the accounting's record of the rows a lane made)."""
        self._changed()
        offsets, bases, leaves, records, positions = documents
        seq_len, max_segments = spec.seq_len, spec.max_segments or -1
        parts: list[np.ndarray] = []
        ends: list[int] = []
        sink = self if log is None else log
        k = j = done = 0  # (done: the pieces emitted by the calls before)
        while True:
            out, row_end = sink.out, sink.row_end
            size, rows = (0, 0) if log is None else (log.size, log.rows)
            k, j, n_out, n_rows, stop = place(
                self.fill, self.count, self.piece_array, self.slots, offsets, bases, leaves, records,
                positions, k, j, cut, seq_len, max_segments, best, out, row_end, size, rows,
            )  # fmt: skip
            if n_rows > rows:
                parts.append(out[:, size:n_out].copy())
                ends += (row_end[rows:n_rows] + (done - size)).tolist()
                done += n_out - size
                if log is not None:
                    log.size, log.rows = n_out, n_rows
            if stop == DONE:
                if len(parts) == 1:
                    return parts[0], ends
                return (
                    np.concatenate(parts, axis=1) if parts else np.zeros((4, 0), np.int64)
                ), ends
            if stop == OUT_FULL:
                sink.grow_out()
            else:
                self.grow_rows()

    def place_draws(
        self,
        kernel: Any,
        draws: tuple,
        cut: int,
        spec: PackSpec,
        best: bool,
        log: EmittedRows,
        run: tuple,
    ) -> tuple[int, int, int, int]:
        """Draws documents of a mixture and places them with ``kernel`` (the compiled
        :func:`~zephon_jax.core.compiled_kernels.draw_place`): ``draws`` are its
        arguments from the mixture's weights to the documents' offsets and bases,
        ``run`` those from the rows wanted on. The emitted rows go into ``log``'s
        ``out`` and ``row_end`` after the pieces and rows the kernel's state says are
        there. Returns ``(stop, pieces in out, rows in row_end, draws logged)``; the
        caller grows what the stop asks and calls again."""
        self._changed()
        return kernel(
            *draws, self.fill, self.count, self.piece_array, self.slots, cut, spec.seq_len,
            spec.max_segments or -1, best, log.out, log.row_end, *run,
        )  # fmt: skip

    def put(self, a: int, code: int, n: int) -> None:
        """Puts a piece of length ``n`` with ``code`` (start and leaf 0) into bin ``a``."""
        self._changed()
        i = int(self.slots[a])
        m = int(self.count[i])
        while m == self.piece_array.shape[2]:
            self.grow_rows()
        self.piece_array[:, i, m] = (code, 0, n, 0)
        self.count[i] = m + 1
        self.fill[i] += n

    def codes(self, a: int) -> list[int]:
        """The codes of bin ``a``'s pieces."""
        i = self.slots[a]
        return self.piece_array[0, i, : self.count[i]].tolist()


class EmittedRows:
    """Rows :meth:`OpenRows.place` emitted, kept: their pieces in ``out[:, :size]`` (code,
    start, length, leaf, as the kernel writes them) and each row's end in
    ``row_end[:rows]``. Only appended to (growing makes new arrays holding the same
    first pieces), so a reader of its first rows sees them unchanged; :meth:`split`
    leaves it as it is. No Python object per row or piece."""

    __slots__ = ("out", "row_end", "size", "rows")

    def __init__(self, pieces: int = 128, rows: int = 32):
        self.out = np.empty((4, pieces), np.int64)
        self.row_end = np.empty(rows, np.int64)
        self.size = 0
        self.rows = 0

    def __len__(self) -> int:
        return self.rows

    def grow_out(self, pieces: int | None = None) -> None:
        """Doubles the pieces and rows it can hold, keeping those it holds; given
        ``pieces``, only what lacks room: the pieces where fewer than ``pieces`` more
        fit, the rows where fewer than 2 more do (what the placement kernel asks)."""
        if pieces is None or self.size + pieces > self.out.shape[1]:
            out = np.empty((4, 2 * self.out.shape[1]), np.int64)
            out[:, : self.size] = self.out[:, : self.size]
            self.out = out
        if pieces is None or self.rows + 2 > len(self.row_end):
            row_end = np.empty(2 * len(self.row_end), np.int64)
            row_end[: self.rows] = self.row_end[: self.rows]
            self.row_end = row_end

    def recoded(self, recode: Any) -> EmittedRows:
        """A copy whose pieces' codes are ``recode(codes)`` (an array function); this
        one is left as it is (a snapshot may read it)."""
        copy = EmittedRows(self.out.shape[1], len(self.row_end))
        size, rows = self.size, self.rows
        copy.out[0, :size] = recode(self.out[0, :size])
        copy.out[1:, :size] = self.out[1:, :size]
        copy.row_end[:rows] = self.row_end[:rows]
        copy.size, copy.rows = size, rows
        return copy

    def head(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The first ``n`` rows' pieces as arrays ``(codes, lengths, ends)`` (views)."""
        cut = int(self.row_end[n - 1]) if n else 0
        return self.out[0, :cut], self.out[2, :cut], self.row_end[:n]

    def split(self, n: int) -> tuple[tuple, EmittedRows]:
        """:meth:`head` of ``n`` rows, and the rest as a new :class:`EmittedRows`."""
        first = self.head(n)
        cut = len(first[0])
        size, rows = self.size - cut, self.rows - n
        # As large as this one grew: the rest fills up to about as many rows again.
        rest = EmittedRows(max(self.out.shape[1], 2 * size), max(len(self.row_end), 2 * rows))
        rest.out[:, :size] = self.out[:, cut : self.size]
        rest.row_end[:rows] = self.row_end[n : self.rows] - cut
        rest.size, rest.rows = size, rows
        return first, rest


class Bins(OpenRows):
    """The open rows of one lane over records (see :class:`OpenRows`).

    A piece's code is its id: ``record_of[id]`` is the record (its array when records
    have one field, else its tuple of arrays), ``lineage_of[id]`` its lineage (a piece
    of a split record's as one int, see :func:`held_lineage`); start and leaf are 0.
    ``pieces`` and ``lineages`` read them by bin, in bin order.
    ``compact``: whether a bin has held a lineage in compact form. Bins keep arrays
    and lineages, not elements: arrays, ints and tuples of them, which the garbage
    collector does not track (or stops tracking), so thousands of open rows cost it
    nothing.

    ``pack`` never changes a carry it was given: it changes a :meth:`copy` (once per
    block) and returns that. The saved form (:meth:`saved_form`, :meth:`lineage_form`)
    is cached; the methods that change the rows drop the cache themselves.
    """

    __slots__ = ("fields", "record_of", "lineage_of", "next_id", "compact", "_saved")

    def __init__(self, num_bins: int):
        super().__init__(num_bins)
        self.fields: tuple[str, ...] | None = None
        self.record_of: dict[int, Any] = {}
        self.lineage_of: dict[int, Any] = {}
        self.next_id = 0
        self.compact = False
        self._saved: Saved | None = None  # see saved_form

    def _changed(self) -> None:
        self._form = self._saved = None

    def copy(self) -> Bins:
        """The same open rows, sharing nothing that either may change (the records'
        arrays and lineages are shared: nothing changes them). Its caches start empty."""
        new = Bins.__new__(Bins)
        new.fill, new.count, new.slots = self.fill.copy(), self.count.copy(), self.slots.copy()
        new.piece_array = self.piece_array.copy()
        new.out, new.row_end = self.out, self.row_end  # scratch, read out after each call
        new.fields, new.next_id, new.compact = self.fields, self.next_id, self.compact
        new.record_of, new.lineage_of = self.record_of.copy(), self.lineage_of.copy()
        new._form = new._saved = None
        return new

    def saved_form(self) -> Saved:
        """The saved form: the held records as elements, in bin order, and each bin's
        record count; cached until a bin changes."""
        saved = self._saved
        if saved is None:
            held = tuple(chain.from_iterable(map(self.held, range(len(self.fill)))))
            count = self.count
            saved = self._saved = Saved(held, tuple([int(count[i]) for i in self.slots]))
        return saved

    def loaded_from(self, saved: Saved) -> Bins:
        """Takes ``saved``, which it was just loaded from, as its saved form; returns it."""
        self._saved = saved
        return self

    @property
    def pieces(self) -> list[list[Any]]:
        """Each bin's records, in bin order."""
        get = self.record_of.__getitem__
        return [list(map(get, self.codes(a))) for a in range(len(self.fill))]

    @property
    def lineages(self) -> tuple[tuple, ...]:
        """Each bin's lineages, in bin order (the tuples :meth:`lineage_form` holds)."""
        return self.lineage_form()[0].groups

    def lineage_form(self) -> tuple[HeldLineages, tuple]:
        """The lineages of the held records in bin order (each bin's tuple, joined when
        read), and each bin's count; cached until a bin changes."""
        form = self._form
        if form is None:
            get = self.lineage_of.__getitem__
            bins = tuple(tuple(map(get, self.codes(a))) for a in range(len(self.fill)))
            form = self._form = (HeldLineages(bins, held_lineage), tuple(map(len, bins)))
        return form

    def held(self, a: int) -> list[Element]:
        """The records of bin ``a`` as elements (their data rebuilt from the arrays)."""
        fields = self.fields or ()
        ids = self.codes(a)
        records, lineages = self.record_of, self.lineage_of
        if len(fields) == 1:
            (field,) = fields
            return [Element({field: records[x]}, held_lineage(lineages[x])) for x in ids]
        return [Element(dict(zip(fields, records[x])), held_lineage(lineages[x])) for x in ids]

    def contents(self, a: int) -> list[tuple[Any, Any, int]]:
        """Bin ``a``'s pieces as (record, lineage, length)."""
        i = self.slots[a]
        ids, lengths = self.piece_array[[0, 2], i, : self.count[i]].tolist()
        return [(self.record_of[x], self.lineage_of[x], n) for x, n in zip(ids, lengths)]

    def hold(self, record: Any, lineage: Any) -> int:
        """Keeps a record (its array, or tuple of arrays) and its lineage; returns its id.
        The bins do not change: :meth:`put` or :meth:`place` puts it into one."""
        x = self.next_id
        self.next_id = x + 1
        self.record_of[x] = record
        self.lineage_of[x] = lineage
        return x

    def add(self, a: int, record: Any, lineage: Any, n: int) -> None:
        """Puts a record (its array, or tuple of arrays) of length ``n`` into bin ``a``."""
        self.put(a, self.hold(record, lineage), n)

    def rows(
        self, emitted: tuple[np.ndarray, list], spec: PackSpec, compact: bool
    ) -> list[Element]:
        """The rows :meth:`place` emitted, as packed rows derived from their records
        (recipe: their lengths); their records leave the bins.

        ``compact``: the rows' lineages keep the bins' compact piece lineages (see
        :func:`~zephon_jax.core.lineage.plain_lineage`), for rows that go straight to
        the batch."""
        pieces, ends = emitted
        ids, lengths = pieces[0].tolist(), pieces[2].tolist()
        fields = self.fields or ()
        pop_record, pop_lineage = self.record_of.pop, self.lineage_of.pop
        expand = self.compact and not compact
        out = []
        begin = 0
        for end in ends:
            held = ids[begin:end]
            recipe = tuple(lengths[begin:end])
            row = PackedRow(spec, fields, list(map(pop_record, held)), recipe)
            parents = tuple(map(pop_lineage, held))
            if expand:  # what derive(row, <the records>, lengths) makes
                parents = plain_parents(parents)
            out.append(Element(row, derived(parents, recipe)))
            begin = end
        return out

    def emit(self, a: int, spec: PackSpec, compact: bool = False) -> Element:
        """Bin ``a`` as a packed row derived from its records (see :meth:`rows`)."""
        self._changed()
        i = self.slots[a]
        c = int(self.count[i])
        pieces = self.piece_array[:, i, :c].copy()
        self.fill[i] = self.count[i] = 0
        return self.rows((pieces, [c]), spec, compact)[0]


def _hold_pieces(carry: Bins, record: np.ndarray, lineage: Any, cut: int, lengths: list[int]):
    """Holds ``record`` cut into pieces of at most ``cut`` as ``split`` makes them, with
    each piece's lineage ``((lineage,), j)``, kept as one int where it can be; returns
    the next piece's id."""
    n = record.shape[0]
    count = -(-n // cut)
    if can_code(lineage, count):
        carry.compact = True
        held: list[Any] = [piece_code(lineage, j) for j in range(count)]
    else:
        held = [piece(lineage, j) for j in range(count)]
    for j in range(count):
        part = record[j * cut : (j + 1) * cut]
        carry.hold(part, held[j])
        lengths.append(part.shape[0])
    return carry.next_id


def _documents(first: int, lengths: list[int]) -> tuple:
    """Pieces of ``lengths`` held with ids ``first, first + 1, ...`` as the documents
    :meth:`OpenRows.place` takes: each its own document of leaf 0, its id as position
    (as lists where the kernel runs interpreted: it reads them faster)."""
    k = len(lengths)
    if not COMPILED:
        return [0, *accumulate(lengths)], [0], [0] * k, range(k), range(first, first + k)
    offsets = np.zeros(k + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    records = np.arange(k, dtype=np.int64)
    return offsets, _BASES, np.zeros(k, np.int64), records, records + first


class BinPackOperator(ContractOperator):
    """First-fit or best-fit packing over ``num_bins`` open rows per lane.

    Made through the operator contract (:class:`ContractOperator`): ``init``, ``step``,
    ``flush`` (a row is ``Made`` from its records, with their lengths as recipe),
    ``make`` (a row from its records) and ``trace``, with a ``step_block`` that places
    a block with one kernel call and the saved form pack has always had.

    Carry: None until the first record that is not empty, then a :class:`Bins` (or,
    in a lane reading a token array column-wise, the engine's
    :class:`~zephon_jax.operators.token_bins.TokenBins` of the same open rows): at
    most ``num_bins`` open rows, each a list of pointers to the records in it; saved
    as those records (one pointer each) and each bin's record count. Memory per
    lane does not depend on ``seq_len`` x ``num_bins``, only on the records the bins
    hold. ``step``, ``step_block``, ``place_split`` and ``flush`` return a new carry
    and never change the one they were given.
    """

    def __init__(
        self,
        seq_len: int,
        method: str = "best_fit",
        num_bins: int | None = None,
        max_segments: int | None = None,
        dtypes: Mapping[str, Any] | None = None,
    ):
        if method not in METHODS:
            raise PipelineError(f"unknown pack method {method!r}; use one of {METHODS}")
        self.method = method
        self.num_bins = positive_int(
            DEFAULT_NUM_BINS if num_bins is None else num_bins, "pack(num_bins)"
        )
        self.spec = PackSpec(seq_len, f"pack(method={method!r})", dtypes, max_segments)
        self.seq_len = self.spec.seq_len
        self.best = method == "best_fit"
        super().__init__(
            "pack",
            _no_carry,
            self._step,
            self._flush,
            self._make,
            trace=_trace,
            max_held=self.num_bins * min(self.seq_len, self.spec.max_segments or self.seq_len),
            describe=(
                f"pack(seq_len={self.seq_len}, method={self.method!r}, num_bins={self.num_bins}"
                f"{self.spec.describe()})"
            ),
            carry_bound=(
                f"{self.num_bins} open rows of {self.seq_len} (held as pointers, one per record)"
            ),
            step_block=self._block,
            save=self._save,
            load=self._load,
            user_code=False,
        )
        # What the engine may do with it (see LineageOperator): count its rows in bulk,
        # fuse a split of pieces up to seq_len before it, run it column-wise.
        self.rows_list_pieces = True
        self.fuses_after_split = self.seq_len
        self.column_packing = BinPacking(self.num_bins, self.best, self.spec)

    def _step(self, carry: Bins | None, element: Element) -> tuple[Bins | None, list[Made]]:
        try:
            carry, rows = self._block(carry, (element,))
        except StepFailed as failed:
            error = failed.error
        else:
            return carry, list(map(_made, rows))
        raise error

    def _block(self, carry: Bins | None, elements: Sequence[Element]):
        """The fold of ``step`` over ``elements`` (the engine's ``step_block``): their
        records are held in a copy of the carry, then placed by one call of the
        placement kernel (:func:`~zephon_jax.core.compiled_kernels.place`, whose rules
        the module docstring gives); returns the copy and the rows.
        """
        out: list[Element] = []
        start = 0
        if carry is None:  # made by the first record that is not empty
            for start, element in enumerate(elements):
                try:
                    carry = self._admit(None, element)[0]
                except Exception as e:
                    raise StepFailed(start, e, out, carry) from e
                if carry is not None:
                    break
            else:
                return carry, out
        else:
            carry = carry.copy()
        return carry, self._place(carry, elements, start, out)

    def place_split(
        self,
        carry: Bins | None,
        elements: Sequence[Element],
        cut: int,
        key: str,
        compact: bool = False,
    ) -> tuple[Bins | None, list[Element], int, int]:
        """``split(cut, key)`` then this ``pack`` over ``elements``, in one loop.

        Exactly what ``step_block`` over ``split``'s outputs does, for the leading
        elements that are one-field records ``{key: 1-D array}`` (``cut`` at most
        ``seq_len``); returns ``(carry, rows, count, empty)``: the new carry (``carry``
        itself where it took none), the rows, how many elements it took (the caller
        sends the rest through ``split``, then ``pack``) and how many of those were
        empty (split emits nothing for them). Takes none until the carry has records
        with field ``key``. ``compact``: the rows go straight to the batch and keep
        compact lineages (see :func:`plain_lineage`).
        """
        if carry is None or carry.fields != (key,) or not 0 < cut <= self.spec.seq_len:
            return carry, [], 0, 0
        carry = carry.copy()
        rows, taken, empty = self._place(carry, elements, 0, [], cut, compact)
        return carry, rows, taken, empty

    def _place(
        self,
        carry: Bins,
        elements: Sequence[Element],
        start: int,
        out: list[Element],
        cut: int = 0,
        compact: bool = False,
    ):
        """Places ``elements[start:]`` into ``carry``'s bins (a copy no one else holds
        yet); returns ``out`` with the rows.

        With ``cut`` (see :meth:`place_split`), returns ``(out, count, empty)``
        instead: it cuts each element into pieces first and stops at one it cannot
        take. The elements before one that fails are placed before the error goes up.
        """
        first = carry.next_id
        lengths: list[int] = []
        taken, empty, failure = self._hold(carry, elements, start, cut, lengths)
        if lengths:
            placed = carry.place(_documents(first, lengths), 0, self.spec, self.best)
            out += carry.rows(placed, self.spec, compact)
        if failure is not None:
            raise StepFailed(taken, failure, out, carry) from failure
        return (out, taken, empty) if cut else out

    def _hold(
        self, carry: Bins, elements: Sequence[Element], start: int, cut: int, lengths: list[int]
    ) -> tuple[int, int, Exception | None]:
        """Holds the records of ``elements[start:]`` in ``carry`` (cut into pieces of at
        most ``cut``, given one) in order, appending their lengths to ``lengths``.

        Returns ``(stop, empty, error)``: the element it stopped at (all taken:
        ``len(elements)``; with ``cut``, the first that is not a one-field record of
        the carry's field; without, the first that fails its checks, with ``error``)
        and how many empty ones it dropped (``split`` emits nothing for them)."""
        seq_len = self.spec.seq_len
        fields = carry.fields
        single = fields[0] if fields is not None and len(fields) == 1 else None
        record_of, lineage_of, append, ndarray = (
            carry.record_of,
            carry.lineage_of,
            lengths.append,
            np.ndarray,
        )
        x = carry.next_id  # the next piece's id
        empty = 0
        stop, error = len(elements), None
        record: Any = None
        for index in range(start, len(elements)):
            element = elements[index]
            data = element.data
            n = -1
            if single is not None and type(data) is dict and len(data) == 1:
                record = data.get(single)
                if type(record) is ndarray and record.ndim == 1:
                    n = record.shape[0]
            lineage = element.lineage
            if cut:
                if n <= 0:
                    if n == 0:  # split emits no piece of an empty record
                        empty += 1
                        continue
                    stop = index
                    break
                if n > cut:
                    carry.next_id = x
                    x = _hold_pieces(carry, record, lineage, cut, lengths)
                    continue
                # Piece 0 of ``split``: its lineage ((lineage,), 0), as one int where it can be.
                if is_position(lineage):
                    lineage = piece_code(lineage, 0)
                    carry.compact = True
                else:
                    lineage = piece(lineage, 0)
            elif not 0 < n <= seq_len:  # the checks of any other record, with their errors
                try:
                    _, arrays, n = self._admit(carry, element)
                except Exception as e:
                    stop, error = index, e
                    break
                if n == 0:
                    continue
                record = arrays[0] if len(arrays) == 1 else arrays
            record_of[x] = record
            lineage_of[x] = lineage
            x += 1
            append(n)
        carry.next_id = x
        return stop, empty, error

    def _admit(self, carry: Bins | None, element: Element) -> tuple[Bins | None, tuple, int]:
        """Checks a record; returns the carry (made at the first record), its arrays and
        its length (0: an empty record, dropped)."""
        spec = self.spec
        fields, arrays, n = spec.record(element.data, element.lineage)
        if n > spec.seq_len:
            raise spec.too_long(n, element.lineage)
        if n == 0:
            return carry, arrays, 0
        if carry is None:
            carry = Bins(self.num_bins)
        if carry.fields is None:
            carry.fields = fields
        elif fields != carry.fields:
            raise PipelineError(
                f"pack got records with fields {list(fields)} after records with fields "
                f"{list(carry.fields)}; every record must have the same fields"
            )
        return carry, arrays, n

    def _flush(self, carry: Any) -> tuple[Bins | None, list[Made]]:
        """Emits every open row (the carry: Bins, a lane's TokenBins, or None)."""
        if carry is None:
            return carry, []
        if type(carry) is Bins:
            carry = carry.copy()
        else:  # a lane's TokenBins (see operators.token_bins): a new Bins of its rows
            carry = carry.to_bins()
        fill, slots = carry.fill, carry.slots
        out = [carry.emit(a, self.spec) for a in range(self.num_bins) if fill[slots[a]]]
        return carry, list(map(_made, out))

    def _save(self, carry: Any) -> Saved:  # Bins, a lane's TokenBins, or None
        if carry is None:
            return Saved()
        if type(carry) is not Bins:  # a lane's TokenBins (see operators.token_bins)
            carry = carry.to_bins()
        return carry.saved_form()

    def save_lineages(self, carry: Bins | None) -> tuple[Sequence, tuple | None]:
        """``save`` with the held records as their lineages (see :meth:`Bins.lineage_form`)."""
        if carry is None:
            return (), None
        return carry.lineage_form()

    def _load(self, saved: Saved, lane: int) -> Bins | None:
        counts = saved.aux
        self.check_counts(counts, len(saved.held), lane)
        if counts is None:
            return None
        carry = Bins(self.num_bins)
        record = self.spec.record
        at = 0
        for a, count in enumerate(counts):  # bin a is row a (rows in bin order)
            for element in saved.held[at : at + count]:
                fields, arrays, n = record(element.data, element.lineage)
                if carry.fields is None:
                    carry.fields = fields
                carry.add(a, arrays[0] if len(arrays) == 1 else arrays, element.lineage, n)
            at += count
        return carry.loaded_from(saved)

    def check_counts(self, counts: Any, held: int, lane: int) -> None:
        """Raises a :class:`StateError` unless ``counts`` (a saved carry's records per
        row, None: no carry) fits ``held`` held records and this pack's rows."""
        if counts is None:
            if held:
                raise StateError(
                    f"lane {lane}: the saved carry of {self.describe()} holds {held} records "
                    "without rows; the state was altered"
                )
            return
        if not (
            isinstance(counts, tuple)
            and len(counts) == self.num_bins
            and all(is_int(c) and c >= 0 for c in counts)
            and sum(counts) == held
        ):
            raise StateError(
                f"lane {lane}: the saved carry of {self.describe()} counts {counts!r} records "
                f"per row for {held} held records; the state was altered or written "
                "by another pipeline"
            )
        if self.method == "first_fit" and 0 in counts[: self.num_bins - counts.count(0)]:
            raise StateError(
                f"lane {lane}: the saved carry of {self.describe()} has an empty row before "
                f"an open one ({counts!r} records per row), which first_fit never leaves (its "
                "open rows come first, in the order they opened); the state was altered"
            )

    def _make(self, recipe: Any, inputs: Sequence[Any]) -> PackedRow:
        """The row of ``inputs`` (records) packed with lengths ``recipe``."""
        fields: tuple[str, ...] = ()
        records: list = []
        lengths: list[int] = []
        for data, length in zip(inputs, recipe):
            fields, arrays, n = self.spec.record(data, None)
            if n != length:
                raise StateError(
                    f"a record packed with {length} items now has {n}; the sources or the "
                    "functions before pack changed since the state was taken"
                )
            records.append(arrays[0] if len(arrays) == 1 else arrays)
            lengths.append(n)
        if not records:
            raise StateError("the state holds a packed row made of no records; it was altered")
        return PackedRow(self.spec, fields, records, tuple(lengths))


def _no_carry(lane: int) -> None:
    """A lane's carry before its first record: None (the Bins come with the fields)."""
    return None


def _made(row: Element) -> Made:
    """A row ``rows`` or ``emit`` made (with plain lineages) as the contract's output:
    ``Made`` from its records, as elements, by its lengths, with the row already made."""
    data: PackedRow = row.data
    parents, recipe = row.lineage
    fields = data.fields
    if len(fields) == 1:
        (field,) = fields
        records = [{field: record} for record in data.pieces]
    else:
        records = [dict(zip(fields, record)) for record in data.pieces]
    return Made(tuple(map(Element, records, parents)), recipe, data)


def _trace(recipe: Any, parents: tuple, start: Any, stop: Any) -> list:
    """A row is its records, whole, in segment order."""
    return [(parent, 0, n, None) for parent, n in zip(parents, recipe)]
