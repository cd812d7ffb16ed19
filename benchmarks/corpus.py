"""Synthetic in-memory token corpus shared by the Grain and zephon_jax benchmarks."""

from __future__ import annotations

import numpy as np


def make_corpus(
    num_docs: int, max_len: int = 2048, seed: int = 0, vocab: int = 32000
) -> list[dict[str, np.ndarray]]:
    """Returns ``num_docs`` documents ``{"tokens": int32 array}``.

    Lengths are uniform in ``[1, max_len]``; token ids are uniform in ``[1, vocab)`` so
    that 0 stays free as a padding id. The result depends only on the arguments.

    All documents are read-only views into one contiguous buffer (one RNG call for the
    lengths, one for the tokens, one ``np.split``), so building 100k documents takes a
    fraction of a second.
    """
    if num_docs < 0:
        raise ValueError(f"num_docs must be >= 0, got {num_docs}")
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if vocab < 2:
        raise ValueError(f"vocab must be >= 2, got {vocab}")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, size=num_docs, dtype=np.int64)
    total = int(lengths.sum())
    tokens = rng.integers(1, vocab, size=total, dtype=np.int32)
    tokens.flags.writeable = False
    if num_docs == 0:
        return []
    pieces = np.split(tokens, np.cumsum(lengths[:-1]))
    return [{"tokens": p} for p in pieces]


def corpus_tokens(corpus: list[dict[str, np.ndarray]]) -> int:
    """Total number of tokens in ``corpus``."""
    return int(sum(len(d["tokens"]) for d in corpus))
