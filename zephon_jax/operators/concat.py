"""``pack(method="concat")``: concatenate records and cut rows of exactly ``seq_len``.

No padding (except in the last row when a finite input ends): a record that
does not fit the open row is split, its tail starting the next row. Positions
restart at 0 for each piece, as in Grain's ``ConcatThenSplitIterDataset``.
"""

from __future__ import annotations

import numpy as np

from zephon_jax.operators.base import LineageOperator, Rebuild
from zephon_jax.operators.pack import RowBuffers, record_fields


class ConcatPackOperator(LineageOperator):
    """Concat-then-split packing.

    Carry: one open row, held as ``(lineage, start, stop)`` pointers to the
    record pieces in it (at most ``seq_len`` pieces). A row's lineage is the
    tuple of its pieces' pointers.
    """

    name = "pack"

    def __init__(self, seq_len: int):
        from zephon_jax.errors import PipelineError

        if not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
            raise PipelineError(f"pack(seq_len) needs a positive int; got {seq_len!r}")
        self.seq_len = int(seq_len)
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
            carry.place(0, data, start, stop, (element.lineage, start, stop), self._arange)
            start = stop
            if carry.used[0] == self.seq_len:
                out.append(carry.emit(0, tuple(carry.segments[0])))
        return carry, out

    def flush(self, carry: RowBuffers | None):
        if carry is None or not carry.used[0]:
            return carry, []
        return carry, [carry.emit(0, tuple(carry.segments[0]))]

    def carry_to_plain(self, carry: RowBuffers | None):
        return None if carry is None else tuple(carry.segments[0])

    def carry_from_plain(self, plain, lane, rebuild: Rebuild):
        if not plain:
            return None
        return self._assemble(plain, rebuild)

    def _assemble(self, pieces, rebuild: Rebuild) -> RowBuffers:
        rows = None
        for piece in pieces:
            lineage, start, stop = piece
            data = rebuild(lineage).data
            if rows is None:
                rows = RowBuffers(data, 1, self.seq_len)
            rows.place(0, data, start, stop, piece, self._arange)
        return rows

    def carry_lineages(self, plain):
        return [piece[0] for piece in plain]

    def parents(self, lineage):
        return tuple(piece[0] for piece in lineage)

    def regenerate(self, lineage, rebuild: Rebuild):
        return self._assemble(lineage, rebuild).emit(0, lineage).data

    def provenance_pieces(self, lineage, start, stop):
        """A row is its pieces ``(record, start, stop)``, in order."""
        return [(piece, a, b, None) for piece, a, b in lineage]

    def carry_bound(self) -> str:
        return f"1 open row of {self.seq_len} (one pointer per record piece in it)"

    def describe(self) -> str:
        return f"pack(seq_len={self.seq_len}, method='concat')"
