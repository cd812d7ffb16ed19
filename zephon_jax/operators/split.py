"""``split``: cuts records longer than ``max_len`` into pieces of at most ``max_len``."""

from __future__ import annotations

from typing import Any

import numpy as np

from zephon_jax.checks import positive_int
from zephon_jax.errors import PipelineError
from zephon_jax.operators.base import stateless


def _length(data: Any, key: str) -> int:
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


def _keys(data: Any) -> str:
    return f"with fields {sorted(data)}" if isinstance(data, dict) else ""


class SplitOperator(stateless):
    """Splits each record into consecutive pieces of at most ``max_len`` items.

    Every 1-D array field as long as ``data[key]`` is cut at the same places;
    other fields are copied into each piece. Piece ``j`` is derived from its
    record with recipe ``j``. Carry: none. A record of ``n`` items emits
    ``ceil(n / max_len)`` pieces at once (an empty record emits none).
    """

    name = "split"

    def __init__(self, max_len: int, key: str = "tokens"):
        self.max_len = positive_int(max_len, "split(max_len)")
        self.key = key
        super().__init__(self.pieces, "split")

    def pieces(self, data: Any) -> list:
        """The pieces of one record."""
        n = _length(data, self.key)
        if n <= self.max_len:
            return [data] if n else []
        return [self._piece(data, n, j) for j in range(-(-n // self.max_len))]

    def _piece(self, data: dict, n: int, j: int) -> dict:
        start, stop = j * self.max_len, min(n, (j + 1) * self.max_len)
        return {
            f: (v[start:stop] if isinstance(v, np.ndarray) and v.ndim == 1 and len(v) == n else v)
            for f, v in data.items()
        }

    def remake(self, recipe, inputs):
        data = inputs[0]
        n = _length(data, self.key)
        return data if n <= self.max_len else self._piece(data, n, recipe)

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
