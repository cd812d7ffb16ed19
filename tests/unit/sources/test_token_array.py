"""``TokenArray``: document ``i`` is ``tokens[offsets[i]:offsets[i+1]]`` as a read-only view;
``__getitems__``, lengths, fingerprint, pickling (memory-mapped tokens travel as their
file), and the errors for bad tokens, offsets and indices."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from zephon_jax.errors import PipelineError
from zephon_jax.sources.token_array import TokenArray

TOKENS = np.arange(10, 20, dtype=np.int32)
OFFSETS = [0, 3, 3, 7, 10]  # documents of 3, 0, 4 and 3 tokens


def test_documents_are_views_between_offsets():
    ta = TokenArray(TOKENS, OFFSETS)
    assert len(ta) == 4
    assert [ta[i]["tokens"].tolist() for i in range(4)] == [
        [10, 11, 12],
        [],
        [13, 14, 15, 16],
        [17, 18, 19],
    ]
    doc = ta[np.int64(2)]["tokens"]
    assert np.shares_memory(doc, ta.tokens) and not doc.flags.writeable
    assert TOKENS.flags.writeable  # the caller's array stays writable
    assert ta.lengths.tolist() == [3, 0, 4, 3] and ta.lengths.dtype == np.int64
    assert ta.longest == 4


def test_getitems_equals_getitem_in_the_order_asked():
    ta = TokenArray(TOKENS, OFFSETS, field="ids")
    got = ta.__getitems__([3, 0, 3, 1])
    assert [list(r) for r in got] == [["ids"]] * 4
    assert [r["ids"].tolist() for r in got] == [ta[i]["ids"].tolist() for i in (3, 0, 3, 1)]
    assert ta.__getitems__([]) == []


@pytest.mark.parametrize("index", [-1, 4])
def test_indices_out_of_range_are_refused(index):
    ta = TokenArray(TOKENS, OFFSETS)
    with pytest.raises(IndexError, match=r"out of range 0\.\.3"):
        ta[index]
    with pytest.raises(IndexError, match=r"out of range 0\.\.3"):
        ta.__getitems__([0, index])


def test_from_documents_concatenates_arrays_or_fields():
    ta = TokenArray.from_documents([[1, 2], np.array([3]), []], dtype=np.uint16)
    assert ta.tokens.tolist() == [1, 2, 3] and ta.tokens.dtype == np.uint16
    assert ta.offsets.tolist() == [0, 2, 3, 3]
    dicts = TokenArray.from_documents([{"ids": [5, 6]}, {"ids": [7]}], field="ids")
    assert list(dicts[1]) == ["ids"] and dicts[1]["ids"].tolist() == [7]
    with pytest.raises(PipelineError, match="needs at least one document"):
        TokenArray.from_documents([])


@pytest.mark.parametrize(
    "tokens, offsets, match",
    [
        (np.zeros((2, 2)), [0, 4], "needs a 1-D array of numbers as tokens"),
        (np.array(["a", "b"]), [0, 2], "needs a 1-D array of numbers as tokens"),
        (TOKENS, [0], r"at least one document\); got dtype int64 with shape \(1,\)"),
        (TOKENS, [0.0, 10.0], "1-D integer array"),
        (TOKENS, [1, 10], r"start at 0 and end at len\(tokens\) = 10; they run from 1 to 10"),
        (TOKENS, [0, 9], "they run from 0 to 9"),
        (TOKENS, [0, 5, 4, 10], r"must not decrease; offsets\[1\] = 5 > offsets\[2\] = 4"),
    ],
)
def test_bad_tokens_or_offsets_are_refused(tokens, offsets, match):
    with pytest.raises(PipelineError, match=match):
        TokenArray(tokens, offsets)


def test_field_must_be_a_str():
    with pytest.raises(PipelineError, match=r"TokenArray\(field=\) needs a str; got 3"):
        TokenArray(TOKENS, OFFSETS, field=3)


def test_fingerprint_follows_offsets_count_and_dtype_not_values():
    ta = TokenArray(TOKENS, OFFSETS)
    assert ta.fingerprint().startswith("4-10-int32-")
    assert ta.fingerprint() == TokenArray(TOKENS + 1, OFFSETS).fingerprint()
    assert ta.fingerprint() != TokenArray(TOKENS, [0, 3, 4, 7, 10]).fingerprint()
    assert ta.fingerprint() != TokenArray(TOKENS.astype(np.int64), OFFSETS).fingerprint()
    assert repr(ta) == "TokenArray(4 documents, 10 int32 tokens)"


def test_pickles_in_memory_and_memory_mapped(tmp_path):
    ta = TokenArray(TOKENS, OFFSETS)
    again = pickle.loads(pickle.dumps(ta))
    assert again.tokens.tolist() == TOKENS.tolist() and again.offsets.tolist() == OFFSETS
    path = tmp_path / "tokens.bin"
    np.arange(100, dtype=np.uint16).tofile(path)
    mapped = np.memmap(path, np.uint16, "r")[40:50]  # a slice of a mapped file
    mta = TokenArray(mapped, [0, 4, 10])
    blob = pickle.dumps(mta)
    assert str(path).encode() in blob  # the file's name travels, not its tokens
    remapped = pickle.loads(blob)
    assert isinstance(remapped.tokens, np.memmap)
    assert remapped[1]["tokens"].tolist() == list(range(44, 50))
