"""Tokenizers trained inside the tests (no downloads), small corpora and conversations."""

from __future__ import annotations

import functools
import os
import tempfile

import numpy as np

from zephon_jax.tools.tokenizers import WORD_PATTERN, learn_byte_pair_ranks

WORDS = (
    "the a quick brown fox jumps over lazy dog cat sat on mat data loader batch token "
    "model train step shard lane pack split mix seed rows global state resume check point "
    "jax grain array record text chat user assistant answer question hello world"
).split()
SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>"]
PAD, UNK, BOS, EOS = 0, 1, 2, 3

# Assistant output inside {% generation %} markers: transformers' assistant masks apply.
MARKED_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<|assistant|>{% generation %}"
    "{{ m['content'] }}<|end|>{% endgeneration %}{% else %}<|user|>{{ m['content'] }}<|end|>"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# The same layout without markers: the prefix-difference method gives the same masks.
UNMARKED_TEMPLATE = MARKED_TEMPLATE.replace("{% generation %}", "").replace(
    "{% endgeneration %}", ""
)
# No markers, and the first line depends on the number of messages: not prefix-stable.
UNSTABLE_TEMPLATE = "turns={{ messages | length }}\n" + UNMARKED_TEMPLATE


def sentence(rng: np.random.Generator, lo: int = 3, hi: int = 30) -> str:
    n = int(rng.integers(lo, hi + 1))
    words = [WORDS[i] for i in rng.integers(0, len(WORDS), size=n)]
    text = " ".join(words)
    return text[0].upper() + text[1:] + (". " if rng.random() < 0.5 else "!")


def texts(num: int, seed: int, hi: int = 30) -> list[str]:
    rng = np.random.default_rng(seed)
    return [sentence(rng, hi=hi) for _ in range(num)]


def conversations(num: int, seed: int) -> list[list[dict]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num):
        turns = int(rng.integers(1, 4))
        messages = []
        if rng.random() < 0.3:
            messages.append({"role": "system", "content": sentence(rng, 2, 6)})
        for _ in range(turns):
            messages.append({"role": "user", "content": sentence(rng, 2, 12)})
            messages.append({"role": "assistant", "content": sentence(rng, 1, 16)})
        out.append(messages)
    return out


@functools.cache
def bpe_tokenizer(vocab_size: int = 320):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on a small corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts(400, seed=100), trainer)
    return tok


@functools.cache
def hf_tokenizer(template: str = MARKED_TEMPLATE, vocab_size: int = 320):
    """A ``transformers.PreTrainedTokenizerFast`` around :func:`bpe_tokenizer`."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=bpe_tokenizer(vocab_size),
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=SPECIALS[4:],
        chat_template=template,
    )


TIKTOKEN_PATTERN = WORD_PATTERN


@functools.cache
def tiktoken_ranks(num_merges: int = 120) -> dict[bytes, int]:
    """Mergeable ranks learned on the corpus (see ``learn_byte_pair_ranks``)."""
    return learn_byte_pair_ranks(texts(300, seed=101), num_merges, TIKTOKEN_PATTERN)


def tiktoken_encoding(num_merges: int = 120):
    """A ``tiktoken.Encoding`` built from :func:`tiktoken_ranks` (no download)."""
    import tiktoken

    ranks = tiktoken_ranks(num_merges)
    return tiktoken.Encoding(
        name=f"test_bpe_{num_merges}",
        pat_str=TIKTOKEN_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": len(ranks)},
    )


@functools.cache
def sentencepiece_processor(vocab_size: int = 150):
    """A ``sentencepiece.SentencePieceProcessor`` trained from a small text file."""
    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w") as f:
            f.write("\n".join(texts(400, seed=102)))
        prefix = os.path.join(tmp, "sp")
        spm.SentencePieceTrainer.train(
            input=corpus,
            model_prefix=prefix,
            vocab_size=vocab_size,
            model_type="bpe",
            num_threads=1,
            minloglevel=2,
        )
        return spm.SentencePieceProcessor(model_file=prefix + ".model")


def char_codes(text: str) -> list[int]:
    """A plain-callable tokenizer: one id per character."""
    return [ord(c) for c in text]


TOKENIZER_KINDS = ("callable", "tokenizers", "transformers", "tiktoken", "sentencepiece")


def make_tokenizer(kind: str):
    """A tokenizer of each kind ``tokenize`` accepts, and its own encode function."""
    if kind == "callable":
        return char_codes, char_codes
    if kind == "tokenizers":
        tok = bpe_tokenizer()
        return tok, lambda t: tok.encode(t, add_special_tokens=False).ids
    if kind == "transformers":
        tok = hf_tokenizer()
        return tok, lambda t: tok.encode(t, add_special_tokens=False)
    if kind == "tiktoken":
        enc = tiktoken_encoding()
        return enc, enc.encode_ordinary
    if kind == "sentencepiece":
        sp = sentencepiece_processor()
        return sp, lambda t: sp.encode(t, out_type=int)
    raise ValueError(kind)


def with_full_loss_mask(record: dict) -> dict:
    """Plain text is trained on everywhere: a loss mask of ones next to its tokens."""
    return {"tokens": record["tokens"], "loss_mask": np.ones_like(record["tokens"])}


def slow_bpe_tokenizer(directory, merges_kept: float = 1.0, reverse_vocab: bool = False, **kw):
    """A slow (Python) ``transformers`` byte-level BPE tokenizer, built from the
    vocab.json and merges.txt of :func:`bpe_tokenizer` written into ``directory``.

    ``merges_kept``: the share of the merges written (the vocabulary stays whole);
    ``reverse_vocab``: the vocabulary file lists its entries in reverse order.
    """
    import json
    from pathlib import Path

    from transformers import ClvpTokenizer

    model = json.loads(bpe_tokenizer().to_str())["model"]
    vocab = list(model["vocab"].items())
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    merges = merges[: int(len(merges) * merges_kept)]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.json").write_text(
        json.dumps(dict(vocab[::-1] if reverse_vocab else vocab)), encoding="utf-8"
    )
    (directory / "merges.txt").write_text(
        "#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8"
    )
    kw.setdefault("unk_token", "<unk>")
    kw.setdefault("bos_token", "<s>")
    kw.setdefault("eos_token", "</s>")
    kw.setdefault("pad_token", "<pad>")
    return ClvpTokenizer(str(directory / "vocab.json"), str(directory / "merges.txt"), **kw)
