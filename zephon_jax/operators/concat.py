"""``pack(method="concat")``: concatenate records and cut rows of exactly ``seq_len``.

No padding (except in the last row when a finite input ends): a record that
does not fit the open row is split, its tail starting the next row. Positions
restart at 0 for each piece, as in Grain's ``ConcatThenSplitIterDataset``.
"""

from __future__ import annotations

import numpy as np

from zephon_jax.checks import positive_int
from zephon_jax.lineage import derive
from zephon_jax.operators.base import LineageOperator, Saved
from zephon_jax.operators.pack import RowBuffers, record_fields


class ConcatPackOperator(LineageOperator):
    """Concat-then-split packing.

    Carry: one open row, saved as the records with a piece in it (one pointer
    each, at most ``seq_len``) and the ``(start, stop)`` bounds of each piece. A
    row is derived from those records with the bounds as its recipe.
    """

    name = "pack"

    def __init__(self, seq_len: int):
        self.seq_len = positive_int(seq_len, "pack(seq_len)")
        self.max_held = self.seq_len
        self._arange = np.arange(self.seq_len, dtype=np.int32)

    def step(self, carry: RowBuffers | None, element):
        data = element.data
        fields, n = record_fields(data, self.seq_len, "pack(method='concat')")
        if n == 0:
            return carry, []
        if carry is None:
            carry = RowBuffers(data, 1, self.seq_len)
        elif fields != carry.fields:
            from zephon_jax.errors import PipelineError

            raise PipelineError(
                f"pack got records with fields {list(fields)} after records with fields "
                f"{list(carry.fields)}; every record must have the same fields"
            )
        out = []
        start = 0
        while start < n:
            stop = min(n, start + self.seq_len - carry.used[0])
            carry.place(0, data, start, stop, (element, start, stop), self._arange)
            start = stop
            if carry.used[0] == self.seq_len:
                out.append(_emit(carry))
        return carry, out

    def flush(self, carry: RowBuffers | None):
        if carry is None or not carry.used[0]:
            return carry, []
        return carry, [_emit(carry)]

    def save(self, carry: RowBuffers | None) -> Saved:
        if carry is None or not carry.used[0]:
            return Saved()
        pieces = carry.segments[0]
        return Saved(tuple(p[0] for p in pieces), tuple((p[1], p[2]) for p in pieces))

    def load(self, saved: Saved, lane: int) -> RowBuffers | None:
        if not saved.held:
            return None
        rows = RowBuffers(saved.held[0].data, 1, self.seq_len)
        for element, (start, stop) in zip(saved.held, saved.aux):
            rows.place(0, element.data, start, stop, (element, start, stop), self._arange)
        return rows

    def remake(self, recipe, inputs):
        rows = RowBuffers(inputs[0], 1, self.seq_len)
        for data, (start, stop) in zip(inputs, recipe):
            rows.place(0, data, start, stop, None, self._arange)
        return rows.emit(0)

    def trace(self, recipe, parents, start, stop):
        """A row is its pieces ``(record, start, stop)``, in order."""
        return [(parent, a, b, None) for parent, (a, b) in zip(parents, recipe)]

    def carry_bound(self) -> str:
        return f"1 open row of {self.seq_len} (one pointer per record piece in it)"

    def describe(self) -> str:
        return f"pack(seq_len={self.seq_len}, method='concat')"


def _emit(carry: RowBuffers):
    pieces = carry.segments[0]
    return derive(carry.emit(0), [p[0] for p in pieces], tuple((p[1], p[2]) for p in pieces))
