"""Where a column-wise lane's tokens live: token arrays as they are, token stores read
block by block into one flat array.

A :class:`~zephon_jax.engine.columns.ColumnarPlan` reads its documents through one of
these readers, which tell the placement kernel where each document's tokens are:

* :class:`ArrayTokens`: ``TokenArray`` sources; the pieces point into their token
  arrays, which never change.
* :class:`StoreTokens`: ``TokenStore`` sources (local or remote); the documents of a
  block are read with one batched read per store into a flat array shared by the
  lanes of the process (the *arena*), and the pieces point into it. Each batched read
  is one TensorStore read of all the block's documents of that store
  (``TokenStore.read_flat``), not one read per document. When the arena
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
_AHEAD_KEPT = 1 << 16  # documents read ahead and not drawn yet, at most


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

    def lengths(self, leaves: np.ndarray, records: np.ndarray) -> np.ndarray:
        """The documents' lengths in tokens."""
        index = self.bases[leaves] + records
        return self.offsets[index + 1] - self.offsets[index]

    ahead = lengths  # a mixture drawer's ids read ahead: nothing to read

    def one(self, leaf: int, record: int) -> tuple[int, int, int]:
        """Document ``record`` of ``leaf``: its start in ``tokens``, its length and which
        of ``tokens`` it is in."""
        index = int(self.bases[leaf]) + record
        start = int(self.offsets[index])
        return start, int(self.offsets[index + 1]) - start, leaf

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
        self._doc_lengths = tuple(np.diff(np.asarray(s.offsets, np.int64)) for s in stores)
        self.arena = np.empty(0, dtype)
        self.used = 0
        self.tokens: tuple[np.ndarray, ...] = (self.arena,)
        self.several = False
        self._bases = np.zeros(1, np.int64)
        self._bins: weakref.WeakSet = weakref.WeakSet()  # open rows pointing into the arena
        # Documents read ahead for mixture drawers: (store, document) -> their starts.
        self._read_ahead: dict[tuple[int, int], list[int]] = {}

    def ahead(self, leaves: np.ndarray, records: np.ndarray) -> np.ndarray:
        """Reads documents a mixture drawer is about to draw (one batched read per store);
        returns their lengths. :meth:`one` then finds them read."""
        starts, _ = self.starts(leaves, records)
        read = self._read_ahead
        if len(read) > _AHEAD_KEPT:  # left by drawers that dropped their read-ahead
            read.clear()
        for key, start in zip(zip(leaves.tolist(), records.tolist()), starts.tolist()):
            read.setdefault(key, []).append(start)
        return self.lengths(leaves, records)

    def one(self, leaf: int, record: int) -> tuple[int, int, int]:
        """Document ``record`` of store ``leaf``: its start in the arena (read now unless
        read ahead), its length and 0 (the arena's place in ``tokens``)."""
        read = self._read_ahead.get((leaf, record))
        if read:
            start = read.pop()
            if not read:
                del self._read_ahead[(leaf, record)]
        else:
            start = int(self.starts(np.array([leaf]), np.array([record]))[0][0])
        return start, int(self._doc_lengths[leaf][record]), 0

    def register(self, bins: Any) -> None:
        """Keeps ``bins`` (a TokenBins) pointing into the arena when it is replaced."""
        self._bins.add(bins)

    def lengths(self, leaves: np.ndarray, records: np.ndarray) -> np.ndarray:
        """The documents' lengths in tokens (nothing is read)."""
        lengths = np.empty(len(records), np.int64)
        for leaf in np.unique(leaves).tolist():
            where = leaves == leaf
            lengths[where] = self._doc_lengths[leaf][records[where]]
        return lengths

    def starts(self, leaves: np.ndarray, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Reads the documents into the arena: where each starts there (and zeros, the
        one array of ``tokens``)."""
        lengths = self.lengths(leaves, records)
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
            flat = self.stores[leaf].read_flat(records[where])
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
        spans[1::2] = starts + self.lengths(leaves, records)
        return spans, self._bases, zeros, np.arange(0, 2 * len(starts), 2, dtype=np.int64)

    def _replace(self, needed: int) -> None:
        """A new arena with room for ``needed`` more tokens, holding (first) the pieces
        of the open rows that point into the old one and the documents read ahead."""
        live = [
            (bins, np.arange(bins.piece_array.shape[2]) < bins.count[:, None])
            for bins in self._bins
        ]
        held = sum(int(bins.piece_array[2][mask].sum()) for bins, mask in live)
        held += sum(
            int(self._doc_lengths[leaf][record]) * len(starts)
            for (leaf, record), starts in self._read_ahead.items()
        )
        size = max(_FIRST_ARENA, 2 * (held + needed))
        arena = np.empty(size, self.arena.dtype)
        old = self.arena
        at = 0
        for bins, mask in live:
            starts = bins.piece_array[1][mask]
            lengths = bins.piece_array[2][mask]
            moved = np.empty(len(starts), np.int64)
            for k, (s, n) in enumerate(zip(starts.tolist(), lengths.tolist())):
                arena[at : at + n] = old[s : s + n]
                moved[k] = at
                at += n
            bins.piece_array[1][mask] = moved
        for (leaf, record), starts in self._read_ahead.items():
            n = int(self._doc_lengths[leaf][record])
            for k, s in enumerate(starts):
                arena[at : at + n] = old[s : s + n]
                starts[k] = at
                at += n
        self.arena = arena
        self.used = at
        self.tokens = (arena,)
        for bins, _ in live:
            bins.tokens = self.tokens
