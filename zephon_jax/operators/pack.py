"""``pack``: bin packing of variable-length records into fixed-length rows.

``first_fit`` and ``best_fit`` keep ``num_bins`` open rows per lane. A record
goes into the lowest (``first_fit``) or the fullest (``best_fit``) open row it
fits; when it fits none, the fullest row is emitted and the record starts a
new one there. A row is emitted as soon as it is full or holds
``max_segments`` records. Records are never cut, so a record longer than
``seq_len`` raises (put ``split(seq_len)`` before ``pack``); empty records are
dropped.

Open rows hold pointers only: the ``(arrays, start, stop)`` pieces of their
records and a ``(lineage, 0, length)`` pointer per record. Rows are assembled once, straight into the
batch (see :mod:`zephon_jax.operators.packing` for the output fields and dtypes).
"""

from __future__ import annotations

import bisect
from typing import Any, Mapping

import numpy as np

from zephon_jax.element import Element
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.operators.base import LineageOperator, Rebuild
from zephon_jax.operators.packing import PackedRow, PackSpec, check_positive

DEFAULT_NUM_BINS = 32
METHODS = ("first_fit", "best_fit")
_SCAN_IN_PYTHON = 64  # up to this many bins, a Python scan beats numpy's call overhead


class Bins:
    """The open rows of one lane: their pieces, lineages, pointers and fills.

    ``lineages[i]`` (the saved form of bin ``i``) and ``pointers[i]`` (one
    ``(lineage, 0, length)`` per record: the lineage of the row it becomes) are
    immutable tuples, shared, so a snapshot copies nothing that did not change.
    """

    __slots__ = ("fields", "pieces", "lineages", "pointers", "fill", "fill_array", "order", "saved")

    def __init__(self, num_bins: int):
        self.fields: tuple[str, ...] | None = None
        self.pieces: list[list[tuple]] = [[] for _ in range(num_bins)]
        self.lineages: list[tuple] = [()] * num_bins
        self.pointers: list[tuple] = [()] * num_bins
        self.fill = [0] * num_bins
        # The same fills, for a vectorized first-fit scan over many bins.
        self.fill_array = np.zeros(num_bins, np.int64) if num_bins > _SCAN_IN_PYTHON else None
        self.order: list[tuple[int, int]] | None = None  # best_fit: sorted (fill, -bin)
        self.saved: tuple | None = None  # the saved form, until a bin changes

    def add(self, i: int, arrays: tuple, lineage: Any, n: int) -> None:
        self.pieces[i].append((arrays, 0, n))
        self.lineages[i] = self.lineages[i] + (lineage,)
        self.pointers[i] = self.pointers[i] + ((lineage, 0, n),)
        self.fill[i] += n
        if self.fill_array is not None:
            self.fill_array[i] = self.fill[i]
        self.saved = None

    def emit(self, i: int, spec: PackSpec) -> Element:
        """Bin ``i`` as a packed row (its lineage: its records' pointers); empties the bin."""
        element = Element(PackedRow(spec, self.fields, self.pieces[i]), self.pointers[i])
        self.pieces[i] = []
        self.lineages[i] = ()
        self.pointers[i] = ()
        self.fill[i] = 0
        if self.fill_array is not None:
            self.fill_array[i] = 0
        self.saved = None
        return element


class BinPackOperator(LineageOperator):
    """First-fit or best-fit packing over ``num_bins`` open rows per lane.

    Carry: at most ``num_bins`` open rows, each a list of pointers to the
    records in it; saved as one lineage per record. Memory per lane does not
    depend on ``seq_len`` x ``num_bins``, only on the records the bins hold. A
    packed row's lineage is the tuple of its records' ``(lineage, 0, length)``
    pointers, in segment order.
    """

    name = "pack"

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
        self.num_bins = check_positive(
            DEFAULT_NUM_BINS if num_bins is None else num_bins, "pack(num_bins)"
        )
        self.spec = PackSpec(seq_len, f"pack(method={method!r})", dtypes, max_segments)
        self.seq_len = self.spec.seq_len

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
        carry.add(i, arrays, element.lineage, n)
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

    def carry_to_plain(self, carry: Bins | None):
        if carry is None:
            return None
        if carry.saved is None:
            carry.saved = tuple(carry.lineages)
        return carry.saved

    def carry_from_plain(self, plain, lane, rebuild: Rebuild):
        if plain is None:
            return None
        if not isinstance(plain, tuple) or len(plain) != self.num_bins:
            raise StateError(
                f"lane {lane}: the state's pack carry is not {self.num_bins} bins of record "
                "pointers; it was written by another pipeline or altered"
            )
        carry = Bins(self.num_bins)
        for i, lineages in enumerate(plain):
            for lineage in lineages:
                fields, arrays, n = self.spec.record(rebuild(lineage).data, lineage)
                if carry.fields is None:
                    carry.fields = fields
                carry.add(i, arrays, lineage, n)
        carry.saved = plain
        return carry

    def carry_lineages(self, plain):
        return [lineage for lineages in plain for lineage in lineages]

    def parents(self, lineage):
        return tuple(pointer[0] for pointer in lineage)

    def regenerate(self, lineage, rebuild: Rebuild):
        fields, pieces = None, []
        for parent, start, stop in lineage:
            fields, arrays, _ = self.spec.record(rebuild(parent).data, parent)
            pieces.append((arrays, start, stop))
        return PackedRow(self.spec, fields, pieces)

    def provenance_pieces(self, lineage, start, stop):
        """A row is its records' pieces ``(record, start, stop)``, in segment order."""
        return [(piece, a, b, None) for piece, a, b in lineage]

    def carry_bound(self) -> str:
        return f"{self.num_bins} open rows of {self.seq_len} (held as pointers, one per record)"

    def describe(self) -> str:
        return (
            f"pack(seq_len={self.seq_len}, method={self.method!r}, num_bins={self.num_bins}"
            f"{self.spec.describe()})"
        )
