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

    def one(self, leaf: int, record: int) -> tuple[int, int, int]:
        """Document ``record`` of ``leaf``: its start in ``tokens``, its length and which
        of ``tokens`` it is in."""
        index = int(self.bases[leaf]) + record
        start = int(self.offsets[index])
        return start, int(self.offsets[index + 1]) - start, leaf

    def starts(self, leaves: np.ndarray, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where the documents start in ``tokens``, and which of ``tokens`` they are in."""
        return self.offsets[self.bases[leaves] + records], leaves


class StoreTokens(ArrayTokens):
    """Documents of token stores, read only when rows are gathered (see the module
    docstring).

    Pieces point into the stores' token streams, as :class:`ArrayTokens` point into token
    arrays; ``tokens`` is this reader itself, whose :meth:`materialize` reads the pieces
    of a batch.
    """

    def __init__(self, stores: Sequence[Any], dtype: np.dtype):
        self.stores = tuple(stores)
        self.dtype = np.dtype(dtype)
        offsets = [np.asarray(s.offsets, np.int64) for s in self.stores]
        bases = np.cumsum([0] + [len(o) for o in offsets[:-1]]).astype(np.int64)
        super().__init__(self, np.concatenate(offsets), bases)  # type: ignore[arg-type]

    def materialize(
        self, starts: Any, lengths: Any, leaves: Any
    ) -> tuple[tuple[np.ndarray], np.ndarray]:
        """Reads pieces ``[starts[k], starts[k] + lengths[k])`` of stores ``leaves[k]``
        (None: all of the first): one batched read per store. Returns ``(tokens, at)``:
        piece ``k`` is ``tokens[0][at[k]:at[k] + lengths[k]]``."""
        starts = np.asarray(starts, np.int64)
        lengths = np.asarray(lengths, np.int64)
        if leaves is None or not self.several:
            flat, at = self.stores[0].read_spans(starts, lengths)
            return (flat.astype(self.dtype, copy=False),), at
        leaves = np.asarray(leaves, np.int64)
        at = np.empty(len(starts), np.int64)
        parts = []
        done = 0
        for leaf in np.unique(leaves).tolist():
            where = np.flatnonzero(leaves == leaf)
            flat, spans = self.stores[leaf].read_spans(starts[where], lengths[where])
            at[where] = spans + done
            parts.append(flat)
            done += len(flat)
        return (np.concatenate(parts).astype(self.dtype, copy=False),), at
