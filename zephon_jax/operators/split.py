"""``split``: cuts records longer than ``max_len`` into pieces of at most ``max_len``.

Made through the functional contract (:class:`~zephon_jax.operators.contract.ContractOperator`)
without carry: ``step`` returns each piece as made from its record with the piece's
index as recipe, ``make`` cuts that piece again on restore; a fast ``step_block``
passes records that need no cut after one quick check.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from zephon_jax.core.checks import positive_int
from zephon_jax.core.lineage import Element, derived, piece
from zephon_jax.core.packed import plain
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.operators.base import Saved, StepFailed
from zephon_jax.operators.contract import (
    ContractOperator,
    Made,
    load_nothing,
    no_carry,
    save_nothing,
)
from zephon_jax.state.envelope import is_int


def _length(data: Any, key: str) -> int:
    if type(data) is dict:  # the common case, checked quickly
        value = data.get(key)
        if type(value) is np.ndarray and value.ndim == 1:
            return value.shape[0]
    try:
        value = data[key]
    except (KeyError, TypeError, IndexError) as e:
        raise PipelineError(
            f"split(key={key!r}) needs records that are dicts with a {key!r} field; got "
            f"{type(data).__name__} {_keys(data)}; pass key= naming the sequence field"
        ) from e
    if np.ndim(value) != 1:
        raise PipelineError(f"split(key={key!r}) needs a 1-D {key!r}; got shape {np.shape(value)}")
    return len(value)


def _cut_along(value: Any, n: int) -> bool:
    """Whether a field is a sequence of ``n`` items, cut with the key field."""
    if isinstance(value, np.ndarray):
        return value.ndim >= 1 and value.shape[0] == n
    return isinstance(value, (list, tuple)) and len(value) == n


def _keys(data: Any) -> str:
    return f"with fields {sorted(data)}" if isinstance(data, dict) else ""


class SplitOperator(ContractOperator):
    """Splits each record into consecutive pieces of at most ``max_len`` items.

    Every sequence field as long as ``data[key]`` (a numpy array whose first
    dimension is that length, a list or a tuple) is cut at the same places along
    its first axis; other fields (scalars, strings, sequences of another length)
    are copied into each piece. Piece ``j`` is made from its record with recipe
    ``j``. Carry: none (saved as ``Saved((), None)``). A record of ``n`` items
    emits ``ceil(n / max_len)`` pieces at once (an empty record emits none).
    """

    may_pack = False  # declared for the engine (see LineageOperator)

    def __init__(self, max_len: int, key: str = "tokens"):
        self.max_len = positive_int(max_len, "split(max_len)")
        self.key = key
        self.cuts_records = self.max_len  # declared for the engine (see LineageOperator)
        self.cut_key = key
        super().__init__(
            "split",
            no_carry,
            self._step,
            make=self._make,
            trace=self._trace,
            describe=f"split(max_len={self.max_len}, key={self.key!r})",
            carry_bound="none (pieces are emitted at once)",
            step_block=self._step_block_fast,
            save=save_nothing,
            load=self._load_nothing,
            user_code=False,
        )

    def _step(self, carry: None, element: Element) -> tuple[None, list[Made]]:
        inputs = (element,)
        pieces = self.pieces(plain(element.data))
        return carry, [Made(inputs, j, out) for j, out in enumerate(pieces)]

    def _elements(self, element: Element) -> list[Element]:
        """The engine's elements for the pieces of ``element``: ``_step``'s outputs."""
        outputs = self.pieces(plain(element.data))
        parents = (element.lineage,)  # what ``piece(lineage, j)`` makes, built once
        if len(outputs) == 1:
            return [Element(outputs[0], derived(parents, 0))]
        return [Element(out, derived(parents, j)) for j, out in enumerate(outputs)]

    def _step_block_fast(self, carry: None, elements: Sequence[Element]):
        """The fold of ``_step``: a record that needs no cut passes after one quick check."""
        out: list[Element] = []
        append = out.append
        key, max_len, cut, ndarray = self.key, self.max_len, self._elements, np.ndarray
        for index, element in enumerate(elements):
            data = element.data
            if type(data) is dict:
                value = data.get(key)
                if type(value) is ndarray and value.ndim == 1 and 0 < value.shape[0] <= max_len:
                    append(Element(data, piece(element.lineage, 0)))  # as ``_step`` makes it
                    continue
            try:
                out += cut(element)
            except Exception as e:
                raise StepFailed(index, e, out, carry) from e
        return carry, out

    def pieces(self, data: Any) -> list:
        """The pieces of one record."""
        n = _length(data, self.key)
        if n <= self.max_len:
            return [data] if n else []
        return [self._piece(data, n, j) for j in range(-(-n // self.max_len))]

    def _piece(self, data: dict, n: int, j: int) -> dict:
        start, stop = j * self.max_len, min(n, (j + 1) * self.max_len)
        return {f: (v[start:stop] if _cut_along(v, n) else v) for f, v in data.items()}

    def _make(self, recipe: Any, inputs: Sequence[Any]) -> Any:
        """Piece ``recipe`` of ``inputs[0]``; a :class:`StateError` for a piece it has not."""
        data = inputs[0]
        if type(recipe) is int and recipe == 0 and type(data) is dict:  # a record not cut
            value = data.get(self.key)
            if type(value) is np.ndarray and value.ndim == 1 and value.shape[0] <= self.max_len:
                return data
        n = _length(data, self.key)
        pieces = max(1, -(-n // self.max_len))
        if not (type(recipe) is int or is_int(recipe)) or not 0 <= recipe < pieces:
            raise StateError(
                f"the state holds piece {recipe!r} of a record that {self.describe()} cuts into "
                f"{pieces} pieces; the state was altered or the sources changed"
            )
        return data if n <= self.max_len else self._piece(data, n, int(recipe))

    def _trace(self, recipe: Any, parents: tuple, start: Any, stop: Any) -> list:
        """Piece ``j`` is ``[j*max_len, (j+1)*max_len)`` of its record."""
        parent, offset = parents[0], recipe * self.max_len
        if start is None:
            return [(parent, None, None, None)]
        if stop is None:
            stop = self.max_len
        return [(parent, offset + start, offset + stop, None)]

    def _load_nothing(self, saved: Saved, lane: int) -> None:
        return load_nothing(self, saved)
