"""Column-wise readers: where documents' tokens are for token arrays (in place) and token
stores (placed from their offsets, read when a batch's pieces are gathered)."""

from __future__ import annotations

import pickle

import numpy as np

from zephon_jax.core.compiled_kernels import tokens_at
from zephon_jax.engine.column_sources import ArrayTokens, RecordTokens, StoreTokens


class FakeStore:
    """A token store: documents ``docs``; reads of token spans noted (one per call)."""

    def __init__(self, docs):
        self.docs = [np.asarray(d, np.int32) for d in docs]
        self.stream = np.concatenate(self.docs)
        self.offsets = np.concatenate([[0], np.cumsum([len(d) for d in self.docs])])
        self.reads: list[list[tuple[int, int]]] = []

    def read_spans(self, starts, lengths):
        spans = list(zip(np.asarray(starts).tolist(), np.asarray(lengths).tolist()))
        self.reads.append(spans)
        at = np.cumsum([0] + [n for _, n in spans[:-1]]).astype(np.int64)
        flat = [self.stream[s : s + n] for s, n in spans]
        return (np.concatenate(flat) if flat else self.stream[:0]), at


def array_tokens():
    # leaf 0: documents of lengths 2, 3; leaf 1: lengths 1, 4 (offsets one after the other)
    tokens = (np.arange(5), np.arange(100, 105))
    offsets = np.array([0, 2, 5, 0, 1, 5])
    return ArrayTokens(tokens, offsets, np.array([0, 3]))


def test_array_tokens_lengths_and_starts():
    reader = array_tokens()
    leaves, records = np.array([0, 1, 1, 0]), np.array([1, 0, 1, 0])
    assert reader.lengths(leaves, records).tolist() == [3, 1, 4, 2]
    assert reader.ahead(leaves, records).tolist() == [3, 1, 4, 2]
    starts, which = reader.starts(leaves, records)
    assert starts.tolist() == [2, 0, 1, 0] and which.tolist() == [0, 1, 1, 0]
    assert reader.several
    offsets, bases, got_leaves, got_records = reader.block(leaves, records)
    assert offsets is reader.offsets and bases is reader.bases and got_leaves is leaves


def test_store_tokens_place_from_offsets_and_read_nothing():
    a = FakeStore([[1, 2], [3, 4, 5]])
    b = FakeStore([[9], [8, 7]])
    reader = StoreTokens([a, b], np.dtype(np.int32))
    leaves, records = np.array([1, 0, 1, 0]), np.array([1, 1, 0, 0])
    assert reader.lengths(leaves, records).tolist() == [2, 3, 1, 2]
    assert reader.ahead(leaves, records).tolist() == [2, 3, 1, 2]
    starts, which = reader.starts(leaves, records)
    assert starts.tolist() == [1, 2, 0, 0] and which.tolist() == [1, 0, 1, 0]
    offsets, bases, got_leaves, _ = reader.block(leaves, records)
    index = bases[leaves] + records
    assert (offsets[index + 1] - offsets[index]).tolist() == [2, 3, 1, 2]
    assert reader.several and reader.tokens is reader
    assert a.reads == [] and b.reads == []  # nothing is read to place documents


def test_store_tokens_materialize_reads_each_store_once_into_an_array_per_store():
    a = FakeStore([[1, 2], [3, 4, 5]])
    b = FakeStore([[9], [8, 7]])
    c = FakeStore([[6]])
    reader = StoreTokens([a, b, c], np.dtype(np.int32))
    # pieces: store 1 tokens 1:3 (8 7), store 0 tokens 3:5 (4 5), store 1 token 0 (9)
    leaves = [1, 0, 1]
    tokens, at = reader.materialize([1, 3, 0], [2, 2, 1], leaves)
    assert len(a.reads) == 1 and len(b.reads) == 1 and c.reads == []
    assert len(tokens) == 3 and len(tokens[2]) == 0  # no piece of store 2: nothing read
    got = [tokens[l][s : s + n].tolist() for l, s, n in zip(leaves, at.tolist(), [2, 2, 1])]
    assert got == [[8, 7], [4, 5], [9]]
    assert all(t.dtype == np.int32 for t in tokens)


def test_store_tokens_materialize_of_one_store_needs_no_leaves():
    store = FakeStore([[1, 2], [3, 4, 5]])
    reader = StoreTokens([store], np.dtype(np.int32))
    assert not reader.several
    (flat,), at = reader.materialize([2, 0], [3, 2], None)
    assert [flat[s : s + n].tolist() for s, n in zip(at.tolist(), [3, 2])] == [[3, 4, 5], [1, 2]]


def _read(addresses, like, lengths):
    return [tokens_at(a, n, like).tolist() for a, n in zip(addresses.tolist(), lengths)]


def test_store_tokens_locate_pieces_in_the_arrays_they_read():
    a = FakeStore([[1, 2], [3, 4, 5]])
    b = FakeStore([[9], [8, 7]])
    reader = StoreTokens([a, b], np.dtype(np.int32))
    addresses, like, held = reader.piece_addresses([1, 3, 0], [2, 2, 1], [1, 0, 1])
    assert like.dtype == np.int32 and len(like) == 0
    assert _read(addresses, like, [2, 2, 1]) == [[8, 7], [4, 5], [9]]
    assert len(a.reads) == 1 and len(b.reads) == 1  # one batched read per store
    # the addresses are in the arrays read, which the caller holds while it gathers
    for address, leaf in zip(addresses.tolist(), [1, 0, 1]):
        assert held[leaf].ctypes.data <= address < held[leaf].ctypes.data + held[leaf].nbytes


def list_reader():
    # leaf 0: records of 3, 0 and 4 tokens; leaf 1: records of 2 and 0 and 3 tokens
    leaves = [
        [np.array([10, 11, 12], np.int16), np.zeros(0, np.int16), np.array([20, 21, 22, 23], np.int16)],
        [np.array([30, 31], np.int16), np.zeros(0, np.int16), np.array([40, 41, 42], np.int16)],
    ]  # fmt: skip
    offsets = [np.array([0, 3, 3, 7]), np.array([0, 2, 2, 5])]
    return RecordTokens(leaves, offsets, np.dtype(np.int16)), leaves


def test_record_tokens_locate_pieces_in_the_records_own_arrays():
    """A piece (a start in its leaf's stream, the records one after the other) is found in
    its record's array, whole or from within it, past empty records, in either leaf."""
    reader, leaves = list_reader()
    starts, lengths, which = [3, 0, 5, 2, 1, 4], [4, 3, 2, 3, 2, 1], [0, 0, 0, 1, 0, 1]
    addresses, like, held = reader.piece_addresses(starts, lengths, which)
    assert like.dtype == np.int16 and held is reader.arrays
    assert _read(addresses, like, lengths) == [
        [20, 21, 22, 23], [10, 11, 12], [22, 23], [40, 41, 42], [11, 12], [42]
    ]  # fmt: skip
    # the addresses point into the records' arrays: nothing was copied
    assert addresses[0] == leaves[0][2].ctypes.data
    assert addresses[3] == leaves[1][2].ctypes.data


def test_record_tokens_of_one_leaf_need_no_leaves():
    reader = RecordTokens([[np.array([5, 6], np.int32), np.array([7, 8, 9], np.int32)]],
                          [np.array([0, 2, 5])], np.dtype(np.int32))  # fmt: skip
    addresses, like, _ = reader.piece_addresses([3, 0], [2, 2], None)
    assert _read(addresses, like, [2, 2]) == [[8, 9], [5, 6]]


def test_a_pickled_record_reader_locates_pieces_in_its_own_copies():
    """Addresses are of one process: a reader sent to another (a loader worker) locates the
    pieces in the arrays it unpickled, never at the sender's addresses."""
    reader, _ = list_reader()
    copy = pickle.loads(pickle.dumps(reader))
    addresses, like, held = copy.piece_addresses([3, 2], [4, 3], [0, 1])
    assert _read(addresses, like, [4, 3]) == [[20, 21, 22, 23], [40, 41, 42]]
    assert addresses[0] == held[0][2].ctypes.data != reader.arrays[0][2].ctypes.data
