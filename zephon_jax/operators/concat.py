"""``pack(method="concat")``: concatenate records and cut rows of exactly ``seq_len``.

No padding (except in the last row when a finite input ends, and in rows
closed by ``max_segments``): a record that does not fit the open row is split,
its tail starting the next row. Positions restart at 0 for each piece, as in
Grain's ``ConcatThenSplitIterDataset``. The open row holds pointers only (see
:mod:`zephon_jax.core.packed`).
"""

from __future__ import annotations

from typing import Any, Mapping

from zephon_jax.core.lineage import Element, derived
from zephon_jax.core.packed import PackedRow, PackSpec
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.operators.base import LineageOperator, Saved
from zephon_jax.state.envelope import is_int


class OpenRow:
    """The open row of one lane: its pieces, their records and ``(start, stop)`` bounds."""

    __slots__ = ("fields", "pieces", "held", "lineages", "bounds", "fill")

    def __init__(self):
        self.fields: tuple[str, ...] | None = None
        self.pieces: list[tuple] = []
        self.held: tuple[Element, ...] = ()  # immutable: shared with the saved form
        self.lineages: tuple = ()
        self.bounds: tuple = ()
        self.fill = 0

    def add(self, arrays: tuple, start: int, stop: int, element: Element) -> None:
        self.pieces.append((arrays, start, stop))
        self.held = self.held + (element,)
        self.lineages = self.lineages + (element.lineage,)
        self.bounds = self.bounds + ((start, stop),)
        self.fill += stop - start

    def emit(self, spec: PackSpec) -> Element:
        """The open row, derived from its records with the bounds as recipe; empties it."""
        row = PackedRow(spec, self.fields or (), self.pieces)
        element = Element(row, derived(self.lineages, self.bounds))
        self.pieces, self.held, self.lineages, self.bounds, self.fill = [], (), (), (), 0
        return element


class ConcatPackOperator(LineageOperator):
    """Concat-then-split packing.

    Carry: one open row, saved as the records with a piece in it (one pointer
    each, at most ``seq_len``) and the ``(start, stop)`` bounds of each piece. A
    row is derived from those records with the bounds as its recipe.
    """

    name = "pack"
    user_code = False

    def __init__(
        self,
        seq_len: int,
        max_segments: int | None = None,
        dtypes: Mapping[str, Any] | None = None,
    ):
        self.spec = PackSpec(seq_len, "pack(method='concat')", dtypes, max_segments)
        self.seq_len = self.spec.seq_len
        self.max_held = min(self.seq_len, self.spec.max_segments or self.seq_len)

    def step(self, carry: OpenRow | None, element: Element):
        spec = self.spec
        fields, arrays, n = spec.record(element.data, element.lineage)
        if n == 0:
            return carry, []
        if carry is None:
            carry = OpenRow()
        return self._cut(carry, element, fields, arrays, 0, n)

    def _cut(
        self, carry: OpenRow, element: Element, fields: tuple, arrays: tuple, start: int, n: int
    ) -> tuple[OpenRow, list[Element]]:
        """Adds items ``start:n`` of ``element`` to the open row, emitting each row it fills."""
        spec = self.spec
        if carry.fields is None:
            carry.fields = fields
        elif fields != carry.fields:
            raise PipelineError(
                f"pack got records with fields {list(fields)} after records with fields "
                f"{list(carry.fields)}; every record must have the same fields"
            )
        out = []
        while start < n:
            stop = min(n, start + spec.seq_len - carry.fill)
            carry.add(arrays, start, stop, element)
            start = stop
            if carry.fill == spec.seq_len or len(carry.pieces) == spec.max_segments:
                out.append(carry.emit(spec))
        return carry, out

    def recut(self, carry: OpenRow | None, pieces: list) -> tuple[OpenRow | None, list[Element]]:
        """Continues the stream with ``pieces``: ``(element, start, stop)``, items
        ``start:stop`` of an input element, in stream order. The rows are cut as if the
        stream held just those items there (a restore that excludes records re-cuts
        the rows and open row after the exclusion point from their other pieces)."""
        out: list[Element] = []
        for element, start, stop in pieces:
            fields, arrays, n = self.spec.record(element.data, element.lineage)
            if not (is_int(start) and is_int(stop) and 0 <= start < stop <= n):
                raise StateError(
                    f"the state holds a packed row piece {(start, stop)!r} of a record of {n} "
                    "items; the state was altered, or the sources or functions before pack "
                    "changed"
                )
            if carry is None:
                carry = OpenRow()
            carry, rows = self._cut(carry, element, fields, arrays, start, stop)
            out.extend(rows)
        return carry, out

    def flush(self, carry: OpenRow | None):
        if carry is None or not carry.fill:
            return carry, []
        return carry, [carry.emit(self.spec)]

    def save(self, carry: OpenRow | None) -> Saved:
        if carry is None or not carry.fill:
            return Saved()
        return Saved(carry.held, carry.bounds)

    def load(self, saved: Saved, lane: int) -> OpenRow | None:
        if not saved.held:
            return None
        bounds = saved.aux
        if not (
            isinstance(bounds, tuple)
            and len(bounds) == len(saved.held)
            and all(
                isinstance(s, tuple)
                and len(s) == 2
                and all(is_int(x) for x in s)
                and 0 <= s[0] < s[1]
                for s in bounds
            )
        ):
            raise StateError(
                f"lane {lane}: the saved carry of {self.describe()} has spans {bounds!r} for "
                f"{len(saved.held)} held records; the state was altered or written by another "
                "pipeline"
            )
        carry = OpenRow()
        for element, (start, stop) in zip(saved.held, bounds):
            carry.fields, arrays, _ = self.spec.record(element.data, element.lineage)
            carry.add(arrays, start, stop, element)
        return carry

    def remake(self, recipe, inputs):
        fields: tuple[str, ...] = ()
        pieces: list = []
        for data, span in zip(inputs, recipe):
            fields, arrays, n = self.spec.record(data, None)
            if not (
                isinstance(span, tuple)
                and len(span) == 2
                and is_int(span[0])
                and is_int(span[1])
                and 0 <= span[0] < span[1] <= n
            ):
                raise StateError(
                    f"the state holds a packed row piece {span!r} of a record of {n} items; "
                    "the state was altered, or the sources or functions before pack changed"
                )
            pieces.append((arrays, span[0], span[1]))
        return PackedRow(self.spec, fields, pieces)

    def trace(self, recipe, parents, start, stop):
        """A row is its pieces ``(record, start, stop)``, in order."""
        return [(parent, a, b, None) for parent, (a, b) in zip(parents, recipe)]

    def carry_bound(self) -> str:
        return f"1 open row of {self.seq_len} (one pointer per record piece in it)"

    def describe(self) -> str:
        return f"pack(seq_len={self.seq_len}, method='concat'{self.spec.describe()})"
