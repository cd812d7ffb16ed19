"""Tokenizers for ``prepare``: byte-level ids, loading ``module:function`` (here a word-level
tokenizer trained inside the test with the ``tokenizers`` library), the end-of-document id a
tokenizer states, and byte-pair merges learned without a download."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from pipelines import user_module

from zephon_jax.errors import PipelineError
from zephon_jax.tools.tokenizers import (
    BYTE_VOCAB_SIZE,
    EOS_ID,
    PAD_ID,
    byte_detokenize,
    byte_tokenize,
    is_byte_tokenizer,
    learn_byte_pair_ranks,
    load_callable,
    load_tokenizer,
    tokenizer_eos_id,
)

# A user module: a word-level tokenizer trained when the module is imported, its encode
# function, and the same encode as a method of an object that states its end-of-text id.
WORD_TOKENIZER = """
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

TOKENIZER = Tokenizer(models.WordLevel(unk_token="<unk>"))
TOKENIZER.pre_tokenizer = pre_tokenizers.Whitespace()
TOKENIZER.train_from_iterator(
    ["the cat sat", "the cat", "the dog"],
    trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "</s>"], show_progress=False),
)


def encode(text):
    return TOKENIZER.encode(text).ids


class Wrapped:
    eos_token_id = TOKENIZER.token_to_id("</s>")

    def encode(self, text):
        return encode(text)


wrapped_encode = Wrapped().encode
not_callable = 42


class Namespace:
    @staticmethod
    def encode(text):
        return encode(text)
"""


@pytest.fixture
def word_module(tmp_path, monkeypatch):
    yield from user_module(tmp_path, monkeypatch, "word_tok", WORD_TOKENIZER)


def test_byte_tokens_are_utf8_bytes_plus_two():
    tokens = byte_tokenize("Aé")  # 'A' = 0x41, 'é' = 0xC3 0xA9
    assert tokens.dtype == np.uint16
    assert tokens.tolist() == [0x41 + 2, 0xC3 + 2, 0xA9 + 2]
    assert byte_tokenize("").tolist() == []
    assert (PAD_ID, EOS_ID, BYTE_VOCAB_SIZE) == (0, 1, 258)


def test_byte_detokenize_inverts_and_drops_reserved_ids():
    assert byte_detokenize(byte_tokenize("héllo\n")) == "héllo\n"
    assert byte_detokenize([PAD_ID, 0x68 + 2, EOS_ID, 0x69 + 2, PAD_ID]) == "hi"
    assert byte_detokenize(np.array([0xFF + 2], np.uint16)) == "\ufffd"  # not UTF-8: replaced


def test_the_byte_tokenizer_is_named_by_none_empty_or_bytes():
    for spec in (None, "", "bytes"):
        assert is_byte_tokenizer(spec)
        assert load_tokenizer(spec) is byte_tokenize
    assert not is_byte_tokenizer("word_tok:encode")
    assert not is_byte_tokenizer("Bytes")


def test_a_trained_tokenizer_loads_by_module_and_function(word_module):
    encode = load_tokenizer(f"{word_module}:encode")
    # Trained on "the" x3, "cat" x2, "dog" and "sat" x1 after the three special tokens.
    assert encode("the dog sat on") == [3, 5, 6, 1]
    assert encode("cat") == [4]
    method = load_callable(f"{word_module}:Namespace.encode")  # a dotted attribute path
    assert method("the cat") == [3, 4]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("word_tok", "is not of the form module:function"),
        (":encode", "is not of the form module:function"),
        ("word_tok:", "is not of the form module:function"),
        ("no_such_module_here:encode", "cannot import module 'no_such_module_here'"),
        ("word_tok:decode", "module 'word_tok' has no attribute 'decode'"),
        ("word_tok:Namespace.decode", "has no attribute 'Namespace.decode'"),
        ("word_tok:not_callable", "'word_tok:not_callable' is a int, not a callable"),
    ],
)
def test_a_bad_spec_names_the_cause(word_module, spec, message):
    with pytest.raises(PipelineError, match=message):
        load_callable(spec)


def test_load_callable_finds_modules_in_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "cwd_tok.py").write_text("def encode(text):\n    return [len(text)]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    sys.modules.pop("cwd_tok", None)
    try:
        assert load_callable("cwd_tok:encode")("abc") == [3]
        assert sys.path[0] == str(tmp_path)
    finally:
        sys.modules.pop("cwd_tok", None)


def test_eos_id_is_what_the_tokenizer_states(word_module):
    import tiktoken

    assert tokenizer_eos_id(byte_tokenize) == EOS_ID
    assert tokenizer_eos_id(load_tokenizer(f"{word_module}:encode")) is None
    # A method of an object with eos_token_id (a Hugging Face tokenizer's encode).
    assert tokenizer_eos_id(load_tokenizer(f"{word_module}:wrapped_encode")) == 2
    ranks = learn_byte_pair_ranks(["the cat sat"], 3)
    enc = tiktoken.Encoding(
        name="unit_test_bpe",
        pat_str=r"""'s|'t| ?\w+| ?[^\s\w]+|\s+(?!\S)|\s+""",
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": len(ranks)},
    )
    assert tokenizer_eos_id(enc.encode) == len(ranks) == 259  # tiktoken's eot_token


def test_eos_id_ignores_booleans_and_non_integers():
    def tok(text):
        return []

    tok.eos_token_id = True  # type: ignore[attr-defined]
    assert tokenizer_eos_id(tok) is None
    tok.eos_token_id = "2"  # type: ignore[attr-defined]
    assert tokenizer_eos_id(tok) is None
    tok.eos_token_id = np.int32(9)  # type: ignore[attr-defined]
    assert tokenizer_eos_id(tok) == 9


def test_byte_pair_merges_by_hand():
    # "abab" is one word: pairs ab x2, ba x1 -> merge ab; then ab+ab -> abab; then none left.
    ranks = learn_byte_pair_ranks(["abab"], 5)
    assert len(ranks) == 258
    assert ranks[b"ab"] == 256 and ranks[b"abab"] == 257
    assert all(ranks[bytes([b])] == b for b in range(256))
    # Words "ab" and " cd" count once each: the tie goes to the larger pair, (c, d).
    assert list(learn_byte_pair_ranks(["ab cd"], 1))[256:] == [b"cd"]
    # Pairs are counted over all words: ab (in "ab" and " ab") beats the larger xy.
    assert list(learn_byte_pair_ranks(["ab ab xy"], 1))[256:] == [b"ab"]
    assert learn_byte_pair_ranks(["abab"], 0) == {bytes([b]): b for b in range(256)}
