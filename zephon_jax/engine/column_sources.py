"""Where a column-wise lane's tokens live: token arrays as they are, token stores read
block by block into one flat array.

A :class:`~zephon_jax.engine.columns.ColumnarPlan` reads its documents through one of
these readers, which tell the placement kernel where each document's tokens are:

* :class:`ArrayTokens`: ``TokenArray`` sources; the pieces point into their token
  arrays, which never change.
* :class:`StoreTokens`: ``TokenStore`` sources (local or remote); the documents of a
  block are read with one batched read per store into a flat array shared by the
  lanes of the process (the *arena*), and the pieces point into it. When the arena
  is full, the pieces the open rows still hold are copied to the start of a new one
  (rows already finished keep the old one until they are batched).

Both give the same pieces (the same lineages, lengths and tokens), so rows, states and
batches do not depend on the reader.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np

_FIRST_ARENA = 1 << 20  # tokens


class ArrayTokens:
    """Documents of token arrays: ``tokens[l]`` is leaf ``l``'s token array, ``offsets``
    all leaves' offsets one after the other, leaf ``l``'s from ``bases[l]``."""

    def __init__(self, tokens: tuple[np.ndarray, ...], offsets: np.ndarray, bases: np.ndarray):
        self.tokens = tokens
        self.offsets = offsets
        self.bases = bases
        self.several = len(tokens) > 1

    def block(self, leaves: np.ndarray, records: np.ndarray) -> tuple:
        """The placement kernel's ``(offsets, bases, leaves, records)`` for documents
        ``records`` of ``leaves``."""
        return self.offsets, self.bases, leaves, records

    def starts(self, leaves: np.ndarray, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where the documents start in ``tokens``, and which of ``tokens`` they are in."""
        return self.offsets[self.bases[leaves] + records], leaves

    def register(self, bins: Any) -> None:
        """Nothing: token arrays never move."""


class StoreTokens:
    """Documents of token stores, read into one flat array (see the module docstring).

    ``tokens`` is ``(arena,)``, a new tuple whenever the arena is replaced, so rows of
    one arena can tell they share it.
    """

    def __init__(self, stores: Sequence[Any], dtype: np.dtype):
        self.stores = tuple(stores)
        self.lengths = tuple(np.diff(np.asarray(s.offsets, np.int64)) for s in stores)
        self.arena = np.empty(0, dtype)
        self.used = 0
        self.tokens: tuple[np.ndarray, ...] = (self.arena,)
        self.several = False
        self._bases = np.zeros(1, np.int64)
        self._bins: weakref.WeakSet = weakref.WeakSet()  # open rows pointing into the arena

    def register(self, bins: Any) -> None:
        """Keeps ``bins`` (a TokenBins) pointing into the arena when it is replaced."""
        self._bins.add(bins)

    def _lengths_of(self, leaves: np.ndarray, records: np.ndarray) -> np.ndarray:
        lengths = np.empty(len(records), np.int64)
        for leaf in np.unique(leaves).tolist():
            where = leaves == leaf
            lengths[where] = self.lengths[leaf][records[where]]
        return lengths

    def starts(self, leaves: np.ndarray, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Reads the documents into the arena: where each starts there (and zeros, the
        one array of ``tokens``)."""
        lengths = self._lengths_of(leaves, records)
        total = int(lengths.sum())
        if self.used + total > len(self.arena):
            self._replace(total)
        order = np.argsort(leaves, kind="stable")  # each store's documents together
        ends = self.used + np.cumsum(lengths[order])
        starts = np.empty(len(records), np.int64)
        starts[order] = ends - lengths[order]
        at = self.used
        for leaf in np.unique(leaves).tolist():
            where = order[leaves[order] == leaf]
            read = self.stores[leaf].__getitems__(records[where].tolist())
            if read:
                flat = np.concatenate([doc["tokens"] for doc in read])
                self.arena[at : at + len(flat)] = flat
                at += len(flat)
        self.used = at
        return starts, np.zeros(len(records), np.int64)

    def block(self, leaves: np.ndarray, records: np.ndarray) -> tuple:
        """Reads the documents into the arena; the placement kernel's ``(offsets, bases,
        leaves, records)`` for them (document ``k`` spans ``offsets[2k]:offsets[2k + 1]``)."""
        starts, zeros = self.starts(leaves, records)
        spans = np.empty(2 * len(starts), np.int64)
        spans[0::2] = starts
        spans[1::2] = starts + self._lengths_of(leaves, records)
        return spans, self._bases, zeros, np.arange(0, 2 * len(starts), 2, dtype=np.int64)

    def _replace(self, needed: int) -> None:
        """A new arena with room for ``needed`` more tokens, holding (first) the pieces
        of the open rows that point into the old one."""
        live = [
            (bins, np.arange(bins.pieces.shape[2]) < bins.count[:, None]) for bins in self._bins
        ]
        held = sum(int(bins.pieces[2][mask].sum()) for bins, mask in live)
        size = max(_FIRST_ARENA, 4 * (held + needed))
        arena = np.empty(size, self.arena.dtype)
        old = self.arena
        at = 0
        for bins, mask in live:
            starts = bins.pieces[1][mask]
            lengths = bins.pieces[2][mask]
            moved = np.empty(len(starts), np.int64)
            for k, (s, n) in enumerate(zip(starts.tolist(), lengths.tolist())):
                arena[at : at + n] = old[s : s + n]
                moved[k] = at
                at += n
            bins.pieces[1][mask] = moved
        self.arena = arena
        self.used = at
        self.tokens = (arena,)
        for bins, _ in live:
            bins.tokens = self.tokens
