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
* :class:`RecordTokens`: Python lists of one-field records; the pieces point into
  each list's records' arrays one after the other, which stay where they are.

All give the same pieces (the same lineages, lengths and tokens), so rows, states and
batches do not depend on the reader. The gather kernel reads a batch's pieces from
their addresses in memory (``piece_addresses``): in the token arrays, in the arrays a
store read, or in the records' own arrays.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from zephon_jax.core.compiled_kernels import array_addresses, data_address


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
        at = np.empty(len(starts), np.int64)
        parts = [np.zeros(0, self.dtype)] * (len(self.bases) if self.several else 1)
        for leaf, where in _by_leaf(leaves if self.several else None):
            flat, at[where] = self.read_spans(leaf, starts[where], lengths[where])
            parts[leaf] = np.ascontiguousarray(flat, self.dtype)  # one array type
        return tuple(parts), at

    def piece_addresses(
        self, starts: Any, lengths: Any, leaves: Any
    ) -> tuple[np.ndarray, np.ndarray, Any]:
        """The gather kernel's ``(addresses, like, held)`` for the pieces (see
        :func:`~zephon_jax.operators.token_bins.piece_addresses`): the pieces read by
        :meth:`materialize`, then located in the arrays read."""
        tokens, at = self.materialize(starts, lengths, leaves)
        return array_addresses(tokens, at, None if leaves is None else np.asarray(leaves))


class StoreTokens(StreamTokens):
    """Documents of token stores (local or remote), read when rows are gathered: one
    batched read per store (``TokenStore.read_spans``; see the module docstring)."""

    def __init__(self, stores: Sequence[Any], dtype: np.dtype):
        self.stores = tuple(stores)
        super().__init__([np.asarray(s.offsets, np.int64) for s in self.stores], dtype)

    def read_spans(self, leaf: int, starts: np.ndarray, lengths: np.ndarray) -> tuple:
        return self.stores[leaf].read_spans(starts, lengths)

    def piece_addresses(
        self, starts: Any, lengths: Any, leaves: Any
    ) -> tuple[np.ndarray, np.ndarray, Any]:
        """The gather kernel's ``(addresses, like, held)`` for the pieces: each store's
        pieces located where the store can give them in place
        (``TokenStore.span_addresses``: a plain local store's mapped shard files), else
        read into one array per store (:meth:`StreamTokens.piece_addresses`)."""
        starts = np.asarray(starts, np.int64)
        lengths = np.asarray(lengths, np.int64)
        like = np.empty(0, self.dtype)
        if not self.several:  # (all of one store: its addresses as they come)
            located = _located(self.stores[0], starts, lengths)
            if located is None:
                return super().piece_addresses(starts, lengths, leaves)
            return located[0], like, located[1]
        addresses = np.empty(len(starts), np.int64)
        held = []
        for leaf, where in _by_leaf(leaves):
            located = _located(self.stores[leaf], starts[where], lengths[where])
            if located is None:
                return super().piece_addresses(starts, lengths, leaves)
            addresses[where] = located[0]
            held.append(located[1])
        return addresses, like, held


def _located(store: Any, starts: np.ndarray, lengths: np.ndarray) -> tuple | None:
    """``store.span_addresses(starts, lengths)``, None where the store has no such method."""
    locate = getattr(store, "span_addresses", None)
    return None if locate is None else locate(starts, lengths)


def _by_leaf(leaves: Any) -> list[tuple[int, Any]]:
    """``(leaf, where)`` for each leaf among the pieces' ``leaves`` (None: all pieces
    are of leaf 0), ``where`` the indices of its pieces."""
    if leaves is None:
        return [(0, slice(None))]
    leaves = np.asarray(leaves, np.int64)
    present = np.flatnonzero(np.bincount(leaves)).tolist()  # (cheaper than np.unique)
    return [(leaf, np.flatnonzero(leaves == leaf)) for leaf in present]


class RecordTokens(StreamTokens):
    """Documents that are records ``{field: 1-D integer array}`` of in-memory sources (a
    Python list of dicts): a leaf's stream is its records' arrays one after the other,
    and a gather reads a piece where it lies in its record's array
    (:meth:`piece_addresses`; the general assembly slices it, :meth:`read_spans`).
    ``arrays[l]`` lists leaf ``l``'s records' arrays, C-contiguous and of ``dtype``
    (taken from the records once: a gather then reads no dict)."""

    def __init__(
        self, arrays: Sequence[list[np.ndarray]], offsets: Sequence[np.ndarray], dtype: np.dtype
    ):
        self.arrays = tuple(arrays)
        super().__init__(offsets, dtype)
        # Where each record starts in all leaves' streams one after the other, and where
        # its array is in memory: a gather locates its pieces in the records' own arrays.
        sizes = [int(o[-1]) for o in offsets]
        self.stream_bases = np.cumsum([0] + sizes[:-1]).astype(np.int64)
        self.record_starts = np.concatenate(
            [o[:-1] + base for o, base in zip(offsets, self.stream_bases)]
        )
        self.record_addresses = self._addresses()

    def _addresses(self) -> np.ndarray:
        """The records' arrays' data addresses (of this process: not pickled)."""
        return np.array([data_address(a) for leaf in self.arrays for a in leaf], np.int64)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "record_addresses": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.record_addresses = self._addresses()

    def piece_addresses(
        self, starts: Any, lengths: Any, leaves: Any
    ) -> tuple[np.ndarray, np.ndarray, Any]:
        """The gather kernel's ``(addresses, like, held)`` for the pieces (see
        :func:`~zephon_jax.operators.token_bins.piece_addresses`), in the records' own
        arrays (C-contiguous, of this reader's dtype): nothing is copied before the
        gather."""
        at = np.asarray(starts, np.int64)
        if leaves is not None and self.several:
            at = at + self.stream_bases[np.asarray(leaves, np.int64)]
        records = np.searchsorted(self.record_starts, at, side="right") - 1
        within = (at - self.record_starts[records]) * self.dtype.itemsize
        return self.record_addresses[records] + within, np.empty(0, self.dtype), self.arrays

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
