"""``pack(method="concat")``: concatenate records and cut rows of exactly ``seq_len``.

No padding (except in the last row when a finite input ends, and in rows
closed by ``max_segments``): a record that does not fit the open row is split,
its tail starting the next row. Positions restart at 0 for each piece, as in
Grain's ``ConcatThenSplitIterDataset``. The open row holds pointers only (see
:mod:`zephon_jax.operators.packing`).
"""

from __future__ import annotations

from typing import Any, Mapping

from zephon_jax.element import Element
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.operators.base import LineageOperator, Rebuild
from zephon_jax.operators.packing import PackedRow, PackSpec


class OpenRow:
    """The open row of one lane: its pieces and their ``(lineage, start, stop)`` pointers."""

    __slots__ = ("fields", "pieces", "pointers", "fill")

    def __init__(self):
        self.fields: tuple[str, ...] | None = None
        self.pieces: list[tuple] = []
        self.pointers: tuple = ()  # immutable: shared with the saved form
        self.fill = 0

    def add(self, arrays: tuple, start: int, stop: int, lineage: Any) -> None:
        self.pieces.append((arrays, start, stop))
        self.pointers = self.pointers + ((lineage, start, stop),)
        self.fill += stop - start

    def emit(self, spec: PackSpec) -> Element:
        element = Element(PackedRow(spec, self.fields, self.pieces), self.pointers)
        self.pieces, self.pointers, self.fill = [], (), 0
        return element


class ConcatPackOperator(LineageOperator):
    """Concat-then-split packing.

    Carry: one open row, held as ``(lineage, start, stop)`` pointers to the
    record pieces in it (at most ``seq_len`` pieces). A row's lineage is the
    tuple of its pieces' pointers.
    """

    name = "pack"

    def __init__(
        self,
        seq_len: int,
        max_segments: int | None = None,
        dtypes: Mapping[str, Any] | None = None,
    ):
        self.spec = PackSpec(seq_len, "pack(method='concat')", dtypes, max_segments)
        self.seq_len = self.spec.seq_len

    def step(self, carry: OpenRow | None, element: Element):
        spec = self.spec
        fields, arrays, n = spec.record(element.data, element.lineage)
        if n == 0:
            return carry, []
        if carry is None:
            carry = OpenRow()
        if carry.fields is None:
            carry.fields = fields
        elif fields != carry.fields:
            raise PipelineError(
                f"pack got records with fields {list(fields)} after records with fields "
                f"{list(carry.fields)}; every record must have the same fields"
            )
        out = []
        start = 0
        while start < n:
            stop = min(n, start + spec.seq_len - carry.fill)
            carry.add(arrays, start, stop, element.lineage)
            start = stop
            if carry.fill == spec.seq_len or len(carry.pieces) == spec.max_segments:
                out.append(carry.emit(spec))
        return carry, out

    def flush(self, carry: OpenRow | None):
        if carry is None or not carry.fill:
            return carry, []
        return carry, [carry.emit(self.spec)]

    def carry_to_plain(self, carry: OpenRow | None):
        return None if carry is None else carry.pointers

    def carry_from_plain(self, plain, lane, rebuild: Rebuild):
        if plain is None:
            return None
        if not isinstance(plain, tuple):
            raise StateError(
                f"lane {lane}: the state's pack carry is not a tuple of piece pointers; it was "
                "written by another pipeline or altered"
            )
        carry = OpenRow()
        for lineage, start, stop in plain:
            carry.fields, arrays, _ = self.spec.record(rebuild(lineage).data, lineage)
            carry.add(arrays, start, stop, lineage)
        return carry

    def carry_lineages(self, plain):
        return [piece[0] for piece in plain]

    def parents(self, lineage):
        return tuple(piece[0] for piece in lineage)

    def regenerate(self, lineage, rebuild: Rebuild):
        fields, pieces = None, []
        for parent, start, stop in lineage:
            fields, arrays, _ = self.spec.record(rebuild(parent).data, parent)
            pieces.append((arrays, start, stop))
        return PackedRow(self.spec, fields, pieces)

    def provenance_pieces(self, lineage, start, stop):
        """A row is its pieces ``(record, start, stop)``, in order."""
        return [(piece, a, b, None) for piece, a, b in lineage]

    def carry_bound(self) -> str:
        return f"1 open row of {self.seq_len} (one pointer per record piece in it)"

    def describe(self) -> str:
        return f"pack(seq_len={self.seq_len}, method='concat'{self.spec.describe()})"
