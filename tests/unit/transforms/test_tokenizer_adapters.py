"""The tokenizer adapters: each kind is recognized and wrapped, encodes without special
tokens into int32 arrays (``encode_batch`` equal to one by one), has an identity of the
form ``kind:hash`` that follows its content; ``to_int32`` and ``canonical``'s contracts."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import text_fixtures as tf

from zephon_jax.errors import PipelineError
from zephon_jax.transforms.tokenizer_adapters import (
    CallableTokenizer,
    HFTokenizersTokenizer,
    SentencePieceTokenizer,
    TiktokenTokenizer,
    TransformersTokenizer,
    as_text_tokenizer,
    canonical,
    is_instance_of_lib,
    to_int32,
)

TEXTS = ["hello world", "", "the quick brown fox jumps over the lazy dog"]
WRAPPERS = {
    "callable": CallableTokenizer,
    "tokenizers": HFTokenizersTokenizer,
    "transformers": TransformersTokenizer,
    "tiktoken": TiktokenTokenizer,
    "sentencepiece": SentencePieceTokenizer,
}


@pytest.mark.parametrize("kind", tf.TOKENIZER_KINDS)
def test_each_kind_is_wrapped_and_encodes_as_its_library(kind):
    tokenizer, encode = tf.make_tokenizer(kind)
    wrapped = as_text_tokenizer(tokenizer)
    assert type(wrapped) is WRAPPERS[kind] and wrapped.kind == kind
    assert as_text_tokenizer(wrapped) is wrapped
    singles = [wrapped.encode(t) for t in TEXTS]
    for text, ids in zip(TEXTS, singles):
        assert ids.dtype == np.int32 and ids.ndim == 1
        assert ids.tolist() == list(encode(text))
    assert tf.BOS not in singles[2] and tf.EOS not in singles[2]  # no special tokens
    batch = wrapped.encode_batch(TEXTS)
    assert [b.tolist() for b in batch] == [s.tolist() for s in singles]
    assert all(b.dtype == np.int32 for b in batch)


@pytest.mark.parametrize("kind", tf.TOKENIZER_KINDS)
def test_identity_names_the_kind_and_survives_pickling(kind):
    tokenizer, _ = tf.make_tokenizer(kind)
    wrapped = as_text_tokenizer(tokenizer)
    if kind == "callable":
        assert wrapped.identity == "callable:text_fixtures.char_codes"
    else:
        assert re.fullmatch(rf"{kind}:[0-9a-f]{{24}}", wrapped.identity)
    again = pickle.loads(pickle.dumps(wrapped))
    assert again.identity == wrapped.identity
    assert again.encode(TEXTS[0]).tolist() == wrapped.encode(TEXTS[0]).tolist()


def test_identity_follows_the_content():
    small = as_text_tokenizer(tf.tiktoken_encoding(60)).identity
    assert small != as_text_tokenizer(tf.tiktoken_encoding(120)).identity
    assert small == as_text_tokenizer(tf.tiktoken_encoding(60)).identity


def test_a_tokenizer_with_padding_is_refused():
    tok = tf.bpe_tokenizer()
    padded = type(tok).from_str(tok.to_str())
    padded.enable_padding()
    with pytest.raises(PipelineError, match=r"padding enabled.*call tokenizer.no_padding\(\)"):
        as_text_tokenizer(padded)


def test_other_objects_are_refused_naming_what_is_accepted():
    with pytest.raises(PipelineError, match=r"cannot use a builtins.int; pass a callable"):
        as_text_tokenizer(3)


@pytest.mark.parametrize(
    "ids, want", [([1, 2, 3], [1, 2, 3]), ([], []), (np.array([5], np.int64), [5]), ((0,), [0])]
)
def test_to_int32_accepts_flat_int_sequences(ids, want):
    out = to_int32(ids, "tok")
    assert out.dtype == np.int32 and out.tolist() == want


@pytest.mark.parametrize(
    "ids, match",
    [
        ([[1, 2]], r"tok returned list of shape \(1, 2\).*flat sequence of int token ids"),
        ([1.5], "flat sequence of int token ids"),
        (["a"], "flat sequence of int token ids"),
        ([-1, 2], r"outside \[0, 2\*\*31\)"),
        ([2**31], r"outside \[0, 2\*\*31\)"),
    ],
)
def test_to_int32_refuses_other_ids(ids, match):
    with pytest.raises(PipelineError, match=match):
        to_int32(ids, "tok")


def test_a_callable_returning_bad_ids_is_named():
    def bad(text):
        return [[1]]

    with pytest.raises(PipelineError, match=r"tokenizer .*bad returned list"):
        as_text_tokenizer(bad).encode("x")


def test_is_instance_of_lib_without_importing():
    assert is_instance_of_lib(np.zeros(1), "numpy", "ndarray")
    assert not is_instance_of_lib([], "numpy", "ndarray")
    assert not is_instance_of_lib([], "numpy", "no.such.thing")
    assert not is_instance_of_lib([], "a_module_never_imported", "X")


class Thing:
    def __init__(self, a, cache_dir="/x"):
        self.a = a
        self.cache_dir = cache_dir  # ignored: names where files were


def test_canonical_does_not_depend_on_order_or_ignored_attributes():
    assert (
        canonical({"b": 1, "a": 2}) == canonical({"a": 2, "b": 1}) == ["dict", [("a", 2), ("b", 1)]]
    )
    assert canonical({3, 1, 2}) == canonical({2, 3, 1})
    assert canonical(0.5) == ["float", "0.5"]
    assert canonical((1, "a")) == ["tuple", [1, "a"]]
    pattern = re.compile("a+", re.I)
    assert canonical(pattern) == ["pattern", "a+", int(pattern.flags)]
    assert canonical(pattern) != canonical(re.compile("a+"))
    assert canonical(Thing(1, "/here")) == canonical(Thing(1, "/there"))
    assert canonical(Thing(1)) != canonical(Thing(2))
    assert canonical(b"ab") != canonical(b"ac")
