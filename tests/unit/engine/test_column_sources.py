"""Column-wise readers: where documents' tokens are for token arrays (in place) and token
stores (read into a shared arena, with open rows' pieces moved when it is replaced)."""

from __future__ import annotations

import numpy as np

from zephon_jax.engine.column_sources import ArrayTokens, StoreTokens


class FakeStore:
    """A token store: documents ``docs``, read in batches (each read noted)."""

    def __init__(self, docs):
        self.docs = [np.asarray(d, np.int32) for d in docs]
        self.offsets = np.concatenate([[0], np.cumsum([len(d) for d in self.docs])])
        self.reads: list[list[int]] = []

    def read_flat(self, records):
        self.reads.append(list(records))
        return np.concatenate([self.docs[r] for r in records])


class FakeBins:
    """Open rows' pieces: ``piece_array[1]`` starts, ``[2]`` lengths, ``count`` per row."""

    def __init__(self, starts, lengths, count):
        self.piece_array = np.array([np.zeros_like(starts), starts, lengths], np.int64)
        self.count = np.asarray(count)
        self.tokens = None


def array_tokens():
    # leaf 0: documents of lengths 2, 3; leaf 1: lengths 1, 4 (offsets one after the other)
    tokens = (np.arange(5), np.arange(100, 105))
    offsets = np.array([0, 2, 5, 0, 1, 5])
    return ArrayTokens(tokens, offsets, np.array([0, 3]))


def test_array_tokens_lengths_starts_and_one():
    reader = array_tokens()
    leaves, records = np.array([0, 1, 1, 0]), np.array([1, 0, 1, 0])
    assert reader.lengths(leaves, records).tolist() == [3, 1, 4, 2]
    assert reader.ahead(leaves, records).tolist() == [3, 1, 4, 2]
    starts, which = reader.starts(leaves, records)
    assert starts.tolist() == [2, 0, 1, 0] and which.tolist() == [0, 1, 1, 0]
    assert reader.one(1, 1) == (1, 4, 1)
    assert reader.one(0, 1) == (2, 3, 0)
    assert reader.several
    offsets, bases, got_leaves, got_records = reader.block(leaves, records)
    assert offsets is reader.offsets and bases is reader.bases and got_leaves is leaves


def test_store_tokens_read_documents_into_the_arena_one_read_per_store():
    a = FakeStore([[1, 2], [3, 4, 5]])
    b = FakeStore([[9], [8, 7]])
    reader = StoreTokens([a, b], np.dtype(np.int32))
    leaves, records = np.array([1, 0, 1, 0]), np.array([1, 1, 0, 0])
    assert reader.lengths(leaves, records).tolist() == [2, 3, 1, 2]
    starts, zeros = reader.starts(leaves, records)
    # store 0's documents first (1, then 0), then store 1's (1, then 0)
    assert a.reads == [[1, 0]] and b.reads == [[1, 0]]
    assert starts.tolist() == [5, 0, 7, 3] and zeros.tolist() == [0, 0, 0, 0]
    arena = reader.tokens[0]
    assert arena[:8].tolist() == [3, 4, 5, 1, 2, 8, 7, 9]
    assert reader.used == 8
    spans, bases, zero_leaves, index = reader.block(np.array([0]), np.array([1]))
    assert spans.tolist() == [8, 11] and index.tolist() == [0]
    assert bases.tolist() == [0] and zero_leaves.tolist() == [0]
    assert arena[8:11].tolist() == [3, 4, 5]


def test_store_tokens_documents_read_ahead_are_found_by_one():
    store = FakeStore([[1, 2], [3, 4, 5]])
    reader = StoreTokens([store], np.dtype(np.int32))
    assert reader.ahead(np.array([0]), np.array([1])).tolist() == [3]
    assert store.reads == [[1]]
    assert reader.one(0, 1) == (0, 3, 0)
    assert store.reads == [[1]]  # found read ahead: not read again
    assert reader.one(0, 1) == (3, 3, 0)  # no longer ahead: read now
    assert store.reads == [[1], [1]]


def test_a_full_arena_is_replaced_keeping_open_rows_pieces():
    big = 1 << 20  # more than the first arena holds
    store = FakeStore([[5, 6, 7], np.ones(big)])
    reader = StoreTokens([store], np.dtype(np.int32))
    reader.starts(np.array([0, 0]), np.array([0, 0]))  # arena: 5 6 7 5 6 7
    # one open row holds a piece of the second copy (start 4, length 2: tokens 6 7);
    # a second piece slot, beyond the row's count, is not live
    bins = FakeBins(np.array([[4, 0]]), np.array([[2, 3]]), [1])
    reader.register(bins)
    old = reader.tokens
    starts, _ = reader.starts(np.array([0]), np.array([1]))
    assert reader.tokens is not old and bins.tokens is reader.tokens
    arena = reader.tokens[0]
    assert bins.piece_array[1].tolist() == [[0, 0]]  # the live piece moved to the start
    assert arena[:2].tolist() == [6, 7]
    assert starts.tolist() == [2] and reader.used == 2 + big
    assert len(arena) >= 2 * (2 + big)
