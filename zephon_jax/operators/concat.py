"""``pack(method="concat")``: concatenate records and cut rows of exactly ``seq_len``.

No padding (except in the last row when a finite input ends, and in rows
closed by ``max_segments``): a record that does not fit the open row is split,
its tail starting the next row. Positions restart at 0 for each piece, as in
Grain's ``ConcatThenSplitIterDataset``. The open row holds pointers only (see
:mod:`zephon_jax.core.packed`).

Made through the functional contract
(:class:`~zephon_jax.operators.contract.ContractOperator`): the carry is an
immutable :class:`ConcatRow`, ``step`` returns a new one and each row it fills
as made from the records with a piece in it, with their ``(start, stop)`` bounds
as recipe. The saved form stays ``Saved(held, bounds)``.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

from zephon_jax.core.lineage import Element, derived
from zephon_jax.core.packed import PackedRow, PackSpec
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.operators.base import Saved, StepFailed
from zephon_jax.operators.contract import ContractOperator, Made
from zephon_jax.state.envelope import is_int


class ConcatRow(NamedTuple):
    """The open row of one lane (immutable): the fields of its records (``None`` before
    the first one), the input elements with a piece in it, each piece's ``(start, stop)``
    bounds and ``(arrays, start, stop)``, and the items in it (``fill``)."""

    fields: tuple[str, ...] | None
    held: tuple
    bounds: tuple
    pieces: tuple
    fill: int


#: The carry of a lane before its first record.
EMPTY_ROW = ConcatRow(None, (), (), (), 0)

# A row a call filled: (fields, held, bounds, pieces), turned into an output once.
_Row = tuple


def _other_fields(fields: tuple, before: tuple) -> PipelineError:
    return PipelineError(
        f"pack got records with fields {list(fields)} after records with fields "
        f"{list(before)}; every record must have the same fields"
    )


class ConcatPackOperator(ContractOperator):
    """Concat-then-split packing.

    Carry: one open row (:class:`ConcatRow`), saved as the records with a piece
    in it (one pointer each, at most ``seq_len``) and the ``(start, stop)`` bounds
    of each piece. A row is made from those records with the bounds as its recipe.
    """

    def __init__(
        self,
        seq_len: int,
        max_segments: int | None = None,
        dtypes: Mapping[str, Any] | None = None,
    ):
        self.spec = PackSpec(seq_len, "pack(method='concat')", dtypes, max_segments)
        self.seq_len = self.spec.seq_len
        super().__init__(
            "pack",
            self._init,
            self._step,
            self._flush,
            self._make,
            trace=self._trace,
            max_held=min(self.seq_len, self.spec.max_segments or self.seq_len),
            describe=f"pack(seq_len={self.seq_len}, method='concat'{self.spec.describe()})",
            carry_bound=f"1 open row of {self.seq_len} (one pointer per record piece in it)",
            step_block=self._step_block_fast,
            save=self._save,
            load=self._load,
            user_code=False,
        )

    def _init(self, lane: int) -> ConcatRow:
        return EMPTY_ROW

    # ----- stepping --------------------------------------------------------------------

    def _step(self, carry: ConcatRow, element: Element) -> tuple[ConcatRow, list[Made]]:
        fields, arrays, n = self.spec.record(element.data, element.lineage)
        if n == 0:
            return carry, []
        rows: list[_Row] = []
        carry = self._fill(carry, element, fields, arrays, 0, n, rows)
        return carry, [self._made(row) for row in rows]

    def _step_block_fast(self, carry: ConcatRow, elements: Sequence[Element]):
        """The fold of ``_step`` over ``elements``: the open row is built in lists and
        made a new carry once per block, its rows made the engine's elements directly."""
        record, seq_len, most = self.spec.record, self.spec.seq_len, self.spec.max_segments
        fields, fill = carry.fields, carry.fill
        held, bounds, pieces = list(carry.held), list(carry.bounds), list(carry.pieces)
        rows: list[_Row] = []
        for index, element in enumerate(elements):
            try:
                got, arrays, n = record(element.data, element.lineage)
                if n and got != fields:
                    if fields is not None:
                        raise _other_fields(got, fields)
                    fields = got
            except Exception as e:
                now = ConcatRow(fields, tuple(held), tuple(bounds), tuple(pieces), fill)
                raise StepFailed(index, e, self._elements(rows), now) from e
            start = 0
            while start < n:
                stop = start + seq_len - fill
                if stop > n:
                    stop = n
                held.append(element)
                bounds.append((start, stop))
                pieces.append((arrays, start, stop))
                fill += stop - start
                start = stop
                if fill == seq_len or len(pieces) == most:
                    rows.append((fields, tuple(held), tuple(bounds), tuple(pieces)))
                    held, bounds, pieces, fill = [], [], [], 0
        carry = ConcatRow(fields, tuple(held), tuple(bounds), tuple(pieces), fill)
        return carry, self._elements(rows)

    def _fill(
        self,
        carry: ConcatRow,
        element: Element,
        fields: tuple,
        arrays: tuple,
        start: int,
        n: int,
        rows: list[_Row],
    ) -> ConcatRow:
        """The open row after items ``start:n`` of ``element`` are added to ``carry``'s
        (which is left as it is); each row they fill is appended to ``rows``."""
        if carry.fields is not None and fields != carry.fields:
            raise _other_fields(fields, carry.fields)
        _, held, bounds, pieces, fill = carry
        seq_len, most = self.spec.seq_len, self.spec.max_segments
        while start < n:
            stop = min(n, start + seq_len - fill)
            held += (element,)
            bounds += ((start, stop),)
            pieces += ((arrays, start, stop),)
            fill += stop - start
            start = stop
            if fill == seq_len or len(pieces) == most:
                rows.append((fields, held, bounds, pieces))
                held, bounds, pieces, fill = (), (), (), 0
        return ConcatRow(fields, held, bounds, pieces, fill)

    def _made(self, row: _Row) -> Made:
        """A filled row as an output: made from its records with the bounds as recipe."""
        fields, held, bounds, pieces = row
        return Made(held, bounds, PackedRow(self.spec, fields, pieces))

    def _elements(self, rows: list[_Row]) -> list[Element]:
        """Filled rows as the engine's elements (what the contract makes of ``_made``)."""
        spec = self.spec
        return [
            Element(PackedRow(spec, fields, pieces), derived(tuple([e.lineage for e in held]), b))
            for fields, held, b, pieces in rows
        ]

    def recut(self, carry: ConcatRow, pieces: list) -> tuple[ConcatRow, list[Element]]:
        """Continues the stream with ``pieces``: ``(element, start, stop)``, items
        ``start:stop`` of an input element, in stream order. The rows are cut as if the
        stream held just those items there (a restore that excludes records re-cuts
        the rows and open row after the exclusion point from their other pieces)."""
        rows: list[_Row] = []
        for element, start, stop in pieces:
            fields, arrays, n = self.spec.record(element.data, element.lineage)
            if not (is_int(start) and is_int(stop) and 0 <= start < stop <= n):
                raise StateError(
                    f"the state holds a packed row piece {(start, stop)!r} of a record of {n} "
                    "items; the state was altered, or the sources or functions before pack "
                    "changed"
                )
            carry = self._fill(carry, element, fields, arrays, start, stop, rows)
        return carry, self._elements(rows)

    def _flush(self, carry: ConcatRow) -> tuple[ConcatRow, list[Made]]:
        if not carry.fill:
            return carry, []
        fields, held, bounds, pieces, _ = carry
        return ConcatRow(fields, (), (), (), 0), [self._made((fields, held, bounds, pieces))]

    # ----- saved form, regeneration, provenance -----------------------------------------

    def _save(self, carry: ConcatRow) -> Saved:
        if not carry.fill:
            return Saved()
        return Saved(carry.held, carry.bounds)

    def _load(self, saved: Saved, lane: int) -> ConcatRow:
        if not saved.held:
            return EMPTY_ROW
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
        fields = None
        pieces = []
        for element, (start, stop) in zip(saved.held, bounds):
            fields, arrays, _ = self.spec.record(element.data, element.lineage)
            pieces.append((arrays, start, stop))
        fill = sum(stop - start for start, stop in bounds)
        return ConcatRow(fields, tuple(saved.held), tuple(bounds), tuple(pieces), fill)

    def _make(self, recipe: Any, inputs: Sequence[Any]) -> PackedRow:
        """The row made from ``inputs`` (records) with ``recipe``, one span per record."""
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

    def _trace(self, recipe: Any, parents: tuple, start: Any, stop: Any) -> list:
        """A row is its pieces ``(record, start, stop)``, in order."""
        return [(parent, a, b, None) for parent, (a, b) in zip(parents, recipe)]
