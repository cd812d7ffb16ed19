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
"""

from __future__ import annotations

import bisect
from itertools import chain
from typing import Any, Mapping, Sequence

import numpy as np

from zephon_jax.core.checks import positive_int
from zephon_jax.core.lineage import PIECE_BITS, PIECE_MASK, Element, HeldLineages, held_lineage
from zephon_jax.core.packed import PackedRow, PackSpec
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.operators.base import LineageOperator, Saved, StepFailed
from zephon_jax.state.envelope import is_int

DEFAULT_NUM_BINS = 32
METHODS = ("first_fit", "best_fit")
_SCAN_IN_PYTHON = 64  # up to this many bins, a Python scan beats numpy's call overhead


class Bins:
    """The open rows of one lane: the records, lineages and fill of each.

    ``pieces[i]`` are the records in bin ``i`` (each one's array when records
    have one field, else its tuple of arrays) and ``lineages[i]`` their
    lineages (a tuple, replaced as the bin grows; a piece of a split record as
    one int, see :func:`held_lineage`), in segment order; ``fill[i]`` is their
    total length. ``order`` keeps every bin's :func:`_code` sorted (best_fit). For
    first_fit the bins are in the order they opened: the open ones first, an
    emitted bin moved to the end (:meth:`retire`). Bins keep arrays and lineages,
    not elements: arrays, ints and tuples of them, which the garbage collector does
    not track (or stops tracking), so thousands of open rows cost it nothing; and a
    snapshot takes the bins' tuples as they are.
    """

    __slots__ = (
        "fields",
        "pieces",
        "lineages",
        "fill",
        "fill_array",
        "order",
        "compact",
        "_saved",
        "_form",
    )

    def __init__(self, num_bins: int):
        self.fields: tuple[str, ...] | None = None
        self.pieces: list[list[Any]] = [[] for _ in range(num_bins)]
        self.lineages: list[tuple] = [()] * num_bins
        self.fill = [0] * num_bins
        # The same fills, for a vectorized first-fit scan over many bins.
        self.fill_array = np.zeros(num_bins, np.int64) if num_bins > _SCAN_IN_PYTHON else None
        self.order: list[int] | None = None  # the sorted codes of the bins (see above)
        self.compact = False  # whether a bin has held a lineage in compact form
        self._saved: Saved | None = None  # the saved form, until a bin changes
        self._form: tuple[HeldLineages, tuple] | None = None  # the same, as lineages

    @property
    def saved(self) -> Saved | None:
        """The saved form (``None`` until made); setting it (``None`` when a bin
        changes) also drops the cached :meth:`lineage_form`."""
        return self._saved

    @saved.setter
    def saved(self, saved: Saved | None) -> None:
        self._saved = saved
        self._form = None

    def lineage_form(self) -> tuple[HeldLineages, tuple]:
        """The lineages of the held records in bin order (the bins' tuples, joined when
        read), and each bin's count; cached until a bin changes."""
        form = self._form
        if form is None:
            bins = tuple(self.lineages)
            form = self._form = (HeldLineages(bins, held_lineage), tuple(map(len, bins)))
        return form

    def held(self, i: int) -> list[Element]:
        """The records of bin ``i`` as elements (their data rebuilt from the arrays)."""
        fields = self.fields or ()
        if len(fields) == 1:
            (field,) = fields
            return [
                Element({field: array}, held_lineage(lineage))
                for array, lineage in zip(self.pieces[i], self.lineages[i])
            ]
        return [
            Element(dict(zip(fields, arrays)), held_lineage(lineage))
            for arrays, lineage in zip(self.pieces[i], self.lineages[i])
        ]

    def add(self, i: int, record: Any, lineage: Any, n: int) -> None:
        """Puts a record (its array, or tuple of arrays) of length ``n`` into bin ``i``."""
        self.pieces[i].append(record)
        self.lineages[i] += (lineage,)
        self.fill[i] += n
        if self.fill_array is not None:
            self.fill_array[i] = self.fill[i]
        self.order = None  # rebuilt when next needed
        self.saved = None

    def retire(self, i: int) -> int:
        """Moves bin ``i`` (just emitted, empty) after the others; returns its new index."""
        self.pieces.append(self.pieces.pop(i))
        self.lineages.append(self.lineages.pop(i))
        self.fill.append(self.fill.pop(i))
        fill_array = self.fill_array
        if fill_array is not None:
            fill_array[i:-1] = fill_array[i + 1 :]
            fill_array[-1] = 0
        self.order = None
        return len(self.fill) - 1

    def emit(self, i: int, spec: PackSpec, compact: bool = False) -> Element:
        """Bin ``i`` as a packed row derived from its records (recipe: their lengths).

        ``compact``: the row's lineage keeps the bin's compact piece lineages (see
        :func:`~zephon_jax.core.lineage.plain_lineage`), for rows that go straight to the batch.
        """
        records = self.pieces[i]
        fields = self.fields or ()
        lengths = tuple(map(len, records) if len(fields) == 1 else (len(r[0]) for r in records))
        row = PackedRow(spec, fields, records, lengths)
        # What derive(row, <the records>, lengths) makes.
        parents = self.lineages[i]
        if self.compact and not compact:
            bits, mask = PIECE_BITS, PIECE_MASK  # held_lineage, inlined
            parents = tuple(
                [((~h >> bits,), ~h & mask) if type(h) is int and h < 0 else h for h in parents]
            )
        element = Element(row, (parents, lengths))
        records.clear()  # the row has a copy; the bin keeps its list (no new one for the collector)
        self.lineages[i] = ()
        self.fill[i] = 0
        if self.fill_array is not None:
            self.fill_array[i] = 0
        self._saved = self._form = None  # as ``saved = None``, without the setter's call
        return element


def _code(fill: int, i: int, num_bins: int) -> int:
    """Sorts bins by fill, then by index downwards: ``(fill, -i)`` as one int
    (inlined in :meth:`BinPackOperator.step_block`)."""
    return fill * num_bins + num_bins - 1 - i


class BinPackOperator(LineageOperator):
    """First-fit or best-fit packing over ``num_bins`` open rows per lane.

    Carry: at most ``num_bins`` open rows, each a list of pointers to the
    records in it; saved as those records (one pointer each) and each bin's
    record count. Memory per lane does not depend on ``seq_len`` x
    ``num_bins``, only on the records the bins hold. A row is derived from its
    records, with their lengths as recipe.
    """

    name = "pack"
    user_code = False

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
        self.max_held = self.num_bins * min(self.seq_len, self.spec.max_segments or self.seq_len)

    def step(self, carry: Bins | None, element: Element):
        try:
            return self.step_block(carry, (element,))
        except StepFailed as failed:
            error = failed.error
        raise error

    def step_block(self, carry: Bins | None, elements: Sequence[Element]):
        """The fold of ``step`` over ``elements``, in one loop over plain ints.

        ``best_fit`` takes the fullest bin filled to at most ``seq_len - n`` (ties:
        the lowest index) by bisection in the sorted bin codes; ``first_fit`` the
        lowest such bin. If none fits, the fullest bin (the lowest of equals) is
        emitted and the record starts a new row there (``best_fit``) or, the
        emitted bin moved after the others (see :meth:`Bins.retire`), in the last
        bin (``first_fit``).
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
        return carry, self._place(carry, elements, start, out)

    def place_split(
        self,
        carry: Bins | None,
        elements: Sequence[Element],
        cut: int,
        key: str,
        compact: bool = False,
    ):
        """``split(cut, key)`` then this ``pack`` over ``elements``, in one loop.

        Exactly what ``step_block`` over ``split``'s outputs does, for the leading
        elements that are one-field records ``{key: 1-D array}`` (``cut`` at most
        ``seq_len``); returns ``(rows, count, empty)``: the rows, how many elements
        it took (the caller sends the rest through ``split``, then ``pack``) and how
        many of those were empty (split emits nothing for them). Takes none until
        the carry has records with field ``key``. ``compact``: the rows go straight
        to the batch and keep compact lineages (see :func:`plain_lineage`).
        """
        if carry is None or carry.fields != (key,) or not 0 < cut <= self.spec.seq_len:
            return [], 0, 0
        return self._place(carry, elements, 0, [], cut, compact)

    def _place(
        self,
        carry: Bins,
        elements: Sequence[Element],
        start: int,
        out: list[Element],
        cut: int = 0,
        compact: bool = False,
    ):
        """Places ``elements[start:]`` into ``carry``'s bins; returns ``out`` with the rows.

        With ``cut`` (see :meth:`place_split`), returns ``(out, count, empty)``
        instead: it cuts each element into pieces first and stops at one it cannot take.
        """
        spec = self.spec
        seq_len = spec.seq_len
        max_segments = spec.max_segments or -1
        width = self.num_bins
        top = width - 1
        bisect_right, insort = bisect.bisect_right, bisect.insort
        ndarray = np.ndarray
        fill, pieces_of, lineages_of, fill_array = (
            carry.fill,
            carry.pieces,
            carry.lineages,
            carry.fill_array,
        )
        emit, retire = carry.emit, carry.retire
        best = self.method == "best_fit"
        order: list[int] = []  # best_fit: the bins' codes, sorted
        if best:
            if carry.order is None:  # kept sorted from here on; rebuilt after a restore or flush
                carry.order = sorted(_code(u, j, width) for j, u in enumerate(fill))
            order = carry.order
        carry.saved = None  # the block changes it (no save runs until it returns)
        fields = carry.fields
        single = fields[0] if fields is not None and len(fields) == 1 else None
        count = 1  # pieces of the element (more only with ``cut``)
        empty = 0
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
                    return out, index, empty
                value = record
                count = 1 if n <= cut else -(-n // cut)
                # The lineage of piece j, ((lineage,), j), kept as one int where it can be.
                coded = type(lineage) is int and lineage >= 0 and count <= PIECE_MASK
                if coded:
                    lineage = lineage << PIECE_BITS
                    carry.compact = True
            elif not 0 < n <= seq_len:  # the checks of any other record, with their errors
                try:
                    _, arrays, n = self._admit(carry, element)
                except Exception as e:
                    raise StepFailed(index, e, out, carry) from e
                if n == 0:
                    continue
                record = arrays[0] if len(arrays) == 1 else arrays
            j = 0
            while True:  # over the element's pieces (one, without ``cut``)
                if cut:
                    held = ~(lineage | j) if coded else ((element.lineage,), j)
                    if count > 1:
                        record = value[j * cut : (j + 1) * cut]
                        n = record.shape[0]
                else:
                    held = lineage
                room = seq_len - n
                if best:
                    k = bisect_right(order, room * width + top) - 1  # _code(room, 0, width)
                    i = top - order.pop(k if k >= 0 else -1) % width
                elif fill_array is None:  # first_fit, a scan in Python
                    for i, u in enumerate(fill):  # noqa: B007 - the loop finds ``i``
                        if u <= room:
                            break
                    else:  # no bin fits: the fullest (the lowest of equals)
                        i = fill.index(max(fill))
                else:  # first_fit over many bins
                    fits = fill_array <= room
                    i = int(fits.argmax()) if fits.any() else fill.index(max(fill))
                if fill[i] > room:  # fits no bin: the fullest one goes out
                    out.append(emit(i, spec, compact))
                    if not best:
                        i = retire(i)
                pieces = pieces_of[i]
                pieces.append(record)
                lineages_of[i] += (held,)
                used = fill[i] = fill[i] + n
                if fill_array is not None:
                    fill_array[i] = used
                if used == seq_len or len(pieces) == max_segments:
                    out.append(emit(i, spec, compact))
                    used = 0
                    if not best:
                        retire(i)
                if best:
                    insort(order, used * width + top - i)  # _code(used, i, width)
                j += 1
                if j >= count:
                    break
        return (out, len(elements), empty) if cut else out

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

    def flush(self, carry: Any):  # Bins, a lane's TokenBins, or None
        if carry is None:
            return carry, []
        if type(carry) is not Bins:  # a lane's TokenBins (see operators.token_bins)
            carry = carry.to_bins()
        out = [carry.emit(i, self.spec) for i, u in enumerate(carry.fill) if u]
        carry.order = None
        return carry, out

    def save(self, carry: Any) -> Saved:  # Bins, a lane's TokenBins, or None
        if carry is None:
            return Saved()
        if type(carry) is not Bins:  # a lane's TokenBins (see operators.token_bins)
            return self.save(carry.to_bins())
        if carry.saved is None:
            held = tuple(chain.from_iterable(map(carry.held, range(self.num_bins))))
            carry.saved = Saved(held, tuple(map(len, carry.lineages)))
        return carry.saved

    def save_lineages(self, carry: Bins | None) -> tuple[Sequence, tuple | None]:
        """``save`` with the held records as their lineages (see :meth:`Bins.lineage_form`)."""
        if carry is None:
            return (), None
        return carry.lineage_form()

    def load(self, saved: Saved, lane: int) -> Bins | None:
        counts = saved.aux
        if counts is None:
            return None
        if not (
            isinstance(counts, tuple)
            and len(counts) == self.num_bins
            and all(is_int(c) and c >= 0 for c in counts)
            and sum(counts) == len(saved.held)
        ):
            raise StateError(
                f"lane {lane}: the saved carry of {self.describe()} counts {counts!r} records "
                f"per row for {len(saved.held)} held records; the state was altered or written "
                "by another pipeline"
            )
        if self.method == "first_fit" and 0 in counts[: self.num_bins - counts.count(0)]:
            raise StateError(
                f"lane {lane}: the saved carry of {self.describe()} has an empty row before "
                f"an open one ({counts!r} records per row), which first_fit never leaves (its "
                "open rows come first, in the order they opened); the state was altered"
            )
        carry = Bins(self.num_bins)
        record = self.spec.record
        at = 0
        for i, count in enumerate(counts):  # each bin built at once, as add() would
            if not count:
                continue
            elements = saved.held[at : at + count]
            at += count
            pieces, lengths = [], []
            for element in elements:
                fields, arrays, n = record(element.data, element.lineage)
                if carry.fields is None:
                    carry.fields = fields
                pieces.append(arrays[0] if len(arrays) == 1 else arrays)
                lengths.append(n)
            carry.pieces[i] = pieces
            carry.lineages[i] = tuple(e.lineage for e in elements)
            carry.fill[i] = sum(lengths)
            if carry.fill_array is not None:
                carry.fill_array[i] = carry.fill[i]
        carry.saved = saved
        return carry

    def remake(self, recipe, inputs):
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

    def trace(self, recipe, parents, start, stop):
        """A row is its records, whole, in segment order."""
        return [(parent, 0, n, None) for parent, n in zip(parents, recipe)]

    def carry_bound(self) -> str:
        return f"{self.num_bins} open rows of {self.seq_len} (held as pointers, one per record)"

    def describe(self) -> str:
        return (
            f"pack(seq_len={self.seq_len}, method={self.method!r}, num_bins={self.num_bins}"
            f"{self.spec.describe()})"
        )
