"""``pack``: bin packing of variable-length records into fixed-length rows.

``first_fit`` and ``best_fit`` keep ``num_bins`` open rows per lane. A record
goes into the lowest (``first_fit``) or the fullest (``best_fit``) open row it
fits; when it fits none, the fullest row is emitted and the record starts a
new one there. A row is emitted as soon as it is full or holds
``max_segments`` records. Records are never cut, so a record longer than
``seq_len`` raises (put ``split(seq_len)`` before ``pack``); empty records are
dropped.

Open rows hold pointers only: the ``(arrays, start, stop)`` pieces of their
records and the records' elements. Rows are assembled once, straight into the
batch (see :mod:`zephon_jax.operators.packing` for the output fields and dtypes).
"""

from __future__ import annotations

import bisect
from typing import Any, Mapping

import numpy as np

from zephon_jax.checks import positive_int
from zephon_jax.envelope import is_int
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.lineage import Element
from zephon_jax.operators.base import LineageOperator, Saved
from zephon_jax.operators.packing import PackedRow, PackSpec

DEFAULT_NUM_BINS = 32
METHODS = ("first_fit", "best_fit")
_SCAN_IN_PYTHON = 64  # up to this many bins, a Python scan beats numpy's call overhead


class Bins:
    """The open rows of one lane: their pieces, elements, lineages, lengths and fills.

    ``held[i]``, ``lineages[i]`` and ``lengths[i]`` are immutable tuples shared
    with saved forms and outputs, so a save copies nothing that did not change.
    """

    __slots__ = (
        "fields",
        "pieces",
        "held",
        "lineages",
        "lengths",
        "fill",
        "fill_array",
        "order",
        "saved",
    )

    def __init__(self, num_bins: int):
        self.fields: tuple[str, ...] | None = None
        self.pieces: list[list[tuple]] = [[] for _ in range(num_bins)]
        self.held: list[tuple[Element, ...]] = [()] * num_bins
        self.lineages: list[tuple] = [()] * num_bins
        self.lengths: list[tuple[int, ...]] = [()] * num_bins
        self.fill = [0] * num_bins
        # The same fills, for a vectorized first-fit scan over many bins.
        self.fill_array = np.zeros(num_bins, np.int64) if num_bins > _SCAN_IN_PYTHON else None
        self.order: list[tuple[int, int]] | None = None  # best_fit: sorted (fill, -bin)
        self.saved: Saved | None = None  # the saved form, until a bin changes

    def add(self, i: int, piece: tuple, element: Element, n: int) -> None:
        self.pieces[i].append(piece)
        self.held[i] = self.held[i] + (element,)
        self.lineages[i] = self.lineages[i] + (element.lineage,)
        self.lengths[i] = self.lengths[i] + (n,)
        self.fill[i] += n
        if self.fill_array is not None:
            self.fill_array[i] = self.fill[i]
        self.saved = None

    def emit(self, i: int, spec: PackSpec) -> Element:
        """Bin ``i`` as a packed row derived from its records (recipe: their lengths)."""
        row = PackedRow(spec, self.fields or (), self.pieces[i])
        # What derive(row, held[i], lengths[i]) makes, without walking the bin again.
        element = Element(row, (self.lineages[i], self.lengths[i]))
        self.pieces[i] = []
        self.held[i] = ()
        self.lineages[i] = ()
        self.lengths[i] = ()
        self.fill[i] = 0
        if self.fill_array is not None:
            self.fill_array[i] = 0
        self.saved = None
        return element


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
        spec = self.spec
        fields, arrays, n = spec.record(element.data, element.lineage)
        if n > spec.seq_len:
            raise spec.too_long(n, element.lineage)
        if n == 0:
            return carry, []
        if carry is None:
            carry = Bins(self.num_bins)
        if carry.fields is None:
            carry.fields = fields
        elif fields != carry.fields:
            raise PipelineError(
                f"pack got records with fields {list(fields)} after records with fields "
                f"{list(carry.fields)}; every record must have the same fields"
            )
        out: list[Element] = []
        room = spec.seq_len - n
        if self.method == "best_fit":
            i = self._best_fit(carry, room)
        else:
            i = self._first_fit(carry, room)
        if carry.fill[i] > room:  # fits no bin: the fullest one goes out
            out.append(carry.emit(i, spec))
        carry.add(i, (arrays, 0, n), element, n)
        if carry.fill[i] == spec.seq_len or len(carry.pieces[i]) == spec.max_segments:
            out.append(carry.emit(i, spec))
        if carry.order is not None:
            bisect.insort(carry.order, (carry.fill[i], -i))
        return carry, out

    def _best_fit(self, carry: Bins, room: int) -> int:
        """Takes the fullest bin filled to at most ``room`` (else the fullest bin) out of
        the fill order and returns its index; ties go to the lowest index."""
        order = carry.order
        if order is None:  # kept sorted from here on; rebuilt after a restore or flush
            order = carry.order = sorted((u, -i) for i, u in enumerate(carry.fill))
        k = bisect.bisect_right(order, (room, 1)) - 1
        return -order.pop(k if k >= 0 else -1)[1]

    def _first_fit(self, carry: Bins, room: int) -> int:
        """The lowest bin filled to at most ``room``, else the (lowest) fullest bin."""
        if carry.fill_array is None:
            i = next((j for j, u in enumerate(carry.fill) if u <= room), -1)
        else:
            fits = carry.fill_array <= room
            i = int(fits.argmax()) if fits.any() else -1
        return i if i >= 0 else carry.fill.index(max(carry.fill))

    def flush(self, carry: Bins | None):
        if carry is None:
            return carry, []
        out = [carry.emit(i, self.spec) for i, u in enumerate(carry.fill) if u]
        carry.order = None
        return carry, out

    def save(self, carry: Bins | None) -> Saved:
        if carry is None:
            return Saved()
        if carry.saved is None:
            held = tuple(e for bin_ in carry.held for e in bin_)
            carry.saved = Saved(held, tuple(len(bin_) for bin_ in carry.held))
        return carry.saved

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
                pieces.append((arrays, 0, n))
                lengths.append(n)
            carry.pieces[i] = pieces
            carry.held[i] = elements
            carry.lineages[i] = tuple([element.lineage for element in elements])
            carry.lengths[i] = tuple(lengths)
            carry.fill[i] = sum(lengths)
            if carry.fill_array is not None:
                carry.fill_array[i] = carry.fill[i]
        carry.saved = saved
        return carry

    def remake(self, recipe, inputs):
        fields: tuple[str, ...] = ()
        pieces: list = []
        for data, length in zip(inputs, recipe):
            fields, arrays, n = self.spec.record(data, None)
            if n != length:
                raise StateError(
                    f"a record packed with {length} items now has {n}; the sources or the "
                    "functions before pack changed since the state was taken"
                )
            pieces.append((arrays, 0, n))
        if not pieces:
            raise StateError("the state holds a packed row made of no records; it was altered")
        return PackedRow(self.spec, fields, pieces)

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
