"""Where a column-wise lane's tokens live: token arrays in memory, or token stores read
when rows are gathered.

A :class:`~zephon_jax.engine.columns.ColumnarPlan` places its documents through one of
these readers, which tell the placement kernel where each document's tokens are. The
kernel needs only where documents start and how long they are, never their tokens:

* :class:`ArrayTokens`: ``TokenArray`` sources; the pieces point into their token
  arrays, which never change.
* :class:`StoreTokens`: ``TokenStore`` sources (local or remote). The pieces point into
  each store's token stream (its ``offsets`` give where a document starts), which is
  not read while rows are open: open rows hold pointers only. A batch's rows are read
  when they are gathered, with one batched read per store of all the pieces the batch
  holds (:meth:`StoreTokens.materialize`, ``TokenStore.read_spans``).

Both give the same pieces (the same lineages, lengths and tokens), so rows, states and
batches do not depend on the reader.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


class ArrayTokens:
    """Documents of token arrays: ``tokens[l]`` is leaf ``l``'s token array, ``offsets``
    all leaves' offsets one after the other, leaf ``l``'s from ``bases[l]``."""

    def __init__(self, tokens: tuple[np.ndarray, ...], offsets: np.ndarray, bases: np.ndarray):
        self.tokens = tokens
        self.offsets = offsets
        self.bases = bases
        self.several = len(bases) > 1

    def block(self, leaves: np.ndarray, records: np.ndarray) -> tuple:
        """The placement kernel's ``(offsets, bases, leaves, records)`` for documents
        ``records`` of ``leaves``."""
        return self.offsets, self.bases, leaves, records

    def lengths(self, leaves: np.ndarray, records: np.ndarray) -> np.ndarray:
        """The documents' lengths in tokens."""
        index = self.bases[leaves] + records
        return self.offsets[index + 1] - self.offsets[index]

    ahead = lengths  # a mixture drawer's ids read ahead: nothing to read

    def starts(self, leaves: np.ndarray, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where the documents start in ``tokens``, and which of ``tokens`` they are in."""
        return self.offsets[self.bases[leaves] + records], leaves


class StreamTokens(ArrayTokens):
    """Documents whose tokens are read only when rows are gathered: the pieces point into
    each leaf's token stream, the leaf's documents one after the other (``offsets``
    give where each starts), as :class:`ArrayTokens` point into token arrays, and
    ``tokens`` is this reader itself, whose :meth:`materialize` reads a batch's pieces.
    A subclass reads spans of one leaf's stream (:meth:`read_spans`)."""

    def __init__(self, offsets: Sequence[np.ndarray], dtype: np.dtype):
        self.dtype = np.dtype(dtype)
        bases = np.cumsum([0] + [len(o) for o in offsets[:-1]]).astype(np.int64)
        super().__init__(self, np.concatenate(offsets), bases)  # type: ignore[arg-type]

    def read_spans(self, leaf: int, starts: np.ndarray, lengths: np.ndarray) -> tuple:
        """``(flat, at)``: span ``k`` of leaf ``leaf``'s stream is ``flat[at[k]:at[k] +
        lengths[k]]``."""
        raise NotImplementedError

    def materialize(
        self, starts: Any, lengths: Any, leaves: Any
    ) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
        """Reads pieces ``[starts[k], starts[k] + lengths[k])`` of leaves ``leaves[k]``
        (None: all of the first): one batched read per leaf. Returns ``(tokens, at)``:
        piece ``k`` is ``tokens[leaves[k]][at[k]:at[k] + lengths[k]]``, one array per
        leaf (empty for leaves no piece is of), so the pieces are not copied again
        into one array."""
        starts = np.asarray(starts, np.int64)
        lengths = np.asarray(lengths, np.int64)
        if leaves is None or not self.several:
            flat, at = self.read_spans(0, starts, lengths)
            return (np.ascontiguousarray(flat, self.dtype),), at
        leaves = np.asarray(leaves, np.int64)
        at = np.empty(len(starts), np.int64)
        parts = [np.zeros(0, self.dtype)] * len(self.bases)
        for leaf in np.unique(leaves).tolist():
            where = np.flatnonzero(leaves == leaf)
            flat, at[where] = self.read_spans(leaf, starts[where], lengths[where])
            parts[leaf] = np.ascontiguousarray(flat, self.dtype)  # one array type
        return tuple(parts), at


class StoreTokens(StreamTokens):
    """Documents of token stores (local or remote), read when rows are gathered: one
    batched read per store (``TokenStore.read_spans``; see the module docstring)."""

    def __init__(self, stores: Sequence[Any], dtype: np.dtype):
        self.stores = tuple(stores)
        super().__init__([np.asarray(s.offsets, np.int64) for s in self.stores], dtype)

    def read_spans(self, leaf: int, starts: np.ndarray, lengths: np.ndarray) -> tuple:
        return self.stores[leaf].read_spans(starts, lengths)


class RecordTokens(StreamTokens):
    """Documents that are records ``{field: 1-D integer array}`` of in-memory sources (a
    Python list of dicts): a leaf's stream is its records' arrays one after the other,
    and a piece is sliced from its record's array when rows are gathered. ``arrays[l]``
    lists leaf ``l``'s records' arrays (taken from the records once: a gather then
    reads no dict)."""

    def __init__(
        self, arrays: Sequence[list[np.ndarray]], offsets: Sequence[np.ndarray], dtype: np.dtype
    ):
        self.arrays = tuple(arrays)
        super().__init__(offsets, dtype)

    def read_spans(self, leaf: int, starts: np.ndarray, lengths: np.ndarray) -> tuple:
        arrays = self.arrays[leaf]
        first = int(self.bases[leaf])
        offsets = self.offsets[first : first + len(arrays) + 1]  # the leaf's offsets (a view)
        records = np.searchsorted(offsets, starts, side="right") - 1
        within = starts - offsets[records]
        # The records' arrays, fetched without a Python loop; those of pieces that are
        # not their whole record are then sliced one by one.
        parts = list(map(arrays.__getitem__, records.tolist()))
        whole = offsets[records + 1] - offsets[records]
        partial = np.flatnonzero((within != 0) | (lengths != whole))
        for k, a, n in zip(partial.tolist(), within[partial].tolist(), lengths[partial].tolist()):
            parts[k] = parts[k][a : a + n]
        at = np.cumsum(lengths) - lengths
        return (np.concatenate(parts) if parts else np.empty(0, self.dtype)), at
