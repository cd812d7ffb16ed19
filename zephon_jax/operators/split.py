"""``split``: cuts records longer than ``max_len`` into pieces of at most ``max_len``."""

from __future__ import annotations

from typing import Any

import numpy as np

from zephon_jax.core.checks import positive_int
from zephon_jax.core.lineage import Element, derived, piece
from zephon_jax.core.packed import plain
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.operators.base import LineageOperator, StepFailed
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


class SplitOperator(LineageOperator):
    """Splits each record into consecutive pieces of at most ``max_len`` items.

    Every sequence field as long as ``data[key]`` (a numpy array whose first
    dimension is that length, a list or a tuple) is cut at the same places along
    its first axis; other fields (scalars, strings, sequences of another length)
    are copied into each piece. Piece ``j`` is derived from its
    record with recipe ``j``. Carry: none. A record of ``n`` items emits
    ``ceil(n / max_len)`` pieces at once (an empty record emits none).
    """

    name = "split"
    user_code = False
    may_pack = False

    def __init__(self, max_len: int, key: str = "tokens"):
        self.max_len = positive_int(max_len, "split(max_len)")
        self.key = key
        self.cuts_records = self.max_len  # declared for the engine (see LineageOperator)
        self.cut_key = key

    def step(self, carry, element):
        outputs = self.pieces(plain(element.data))
        parents = (element.lineage,)  # what ``piece(lineage, j)`` makes, built once
        if len(outputs) == 1:
            return carry, [Element(outputs[0], derived(parents, 0))]
        return carry, [Element(out, derived(parents, j)) for j, out in enumerate(outputs)]

    def step_block(self, carry, elements):
        """The fold of ``step``: a record that needs no cut passes after one quick check."""
        out: list[Element] = []
        append = out.append
        key, max_len, step, ndarray = self.key, self.max_len, self.step, np.ndarray
        for index, element in enumerate(elements):
            data = element.data
            if type(data) is dict:
                value = data.get(key)
                if type(value) is ndarray and value.ndim == 1 and 0 < value.shape[0] <= max_len:
                    append(Element(data, piece(element.lineage, 0)))  # as ``step`` makes it
                    continue
            try:
                _, pieces = step(carry, element)
            except Exception as e:
                raise StepFailed(index, e, out, carry) from e
            out += pieces
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

    def remake(self, recipe, inputs):
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

    def trace(self, recipe, parents, start, stop):
        """Piece ``j`` is ``[j*max_len, (j+1)*max_len)`` of its record."""
        parent, offset = parents[0], recipe * self.max_len
        if start is None:
            return [(parent, None, None, None)]
        if stop is None:
            stop = self.max_len
        return [(parent, offset + start, offset + stop, None)]

    def carry_bound(self) -> str:
        return "none (pieces are emitted at once)"

    def describe(self) -> str:
        return f"split(max_len={self.max_len}, key={self.key!r})"
