"""Synthetic in-memory token corpora shared by the Grain and zephon_jax benchmarks."""

from __future__ import annotations

import numpy as np


def _documents(lengths: np.ndarray, rng: np.random.Generator, vocab: int) -> list[dict]:
    """Documents ``{"tokens": int32}`` of ``lengths``: read-only views into one buffer."""
    if len(lengths) == 0:
        return []
    tokens = rng.integers(1, vocab, size=int(lengths.sum()), dtype=np.int32)
    tokens.flags.writeable = False
    return [{"tokens": p} for p in np.split(tokens, np.cumsum(lengths[:-1]))]


def make_corpus(
    num_docs: int, max_len: int = 2048, seed: int = 0, vocab: int = 32000
) -> list[dict[str, np.ndarray]]:
    """``num_docs`` documents with lengths uniform in ``[1, max_len]``.

    Token ids are uniform in ``[1, vocab)`` (0 stays free as a padding id). The
    result depends only on the arguments.
    """
    if num_docs < 0 or max_len < 1 or vocab < 2:
        raise ValueError(f"bad corpus arguments: {num_docs=}, {max_len=}, {vocab=}")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, size=num_docs, dtype=np.int64)
    return _documents(lengths, rng, vocab)


def make_lognormal_corpus(
    num_docs: int,
    mean_len: float = 600.0,
    sigma: float = 1.0,
    max_len: int = 32768,
    seed: int = 0,
    vocab: int = 32000,
) -> list[dict[str, np.ndarray]]:
    """``num_docs`` documents with log-normal lengths of mean about ``mean_len``.

    ``sigma`` is the log-space spread: with the defaults about 4 % of the
    documents are longer than 2048 tokens (a web-text-like tail). Lengths are
    clipped to ``[1, max_len]``.
    """
    if num_docs < 0 or mean_len <= 1 or sigma < 0 or max_len < 1 or vocab < 2:
        raise ValueError(f"bad corpus arguments: {num_docs=}, {mean_len=}, {sigma=}, {max_len=}")
    rng = np.random.default_rng(seed)
    mu = np.log(mean_len) - sigma**2 / 2
    lengths = np.clip(np.rint(rng.lognormal(mu, sigma, size=num_docs)), 1, max_len)
    return _documents(lengths.astype(np.int64), rng, vocab)


def corpus_tokens(corpus: list[dict[str, np.ndarray]]) -> int:
    """Total number of tokens in ``corpus``."""
    return int(sum(len(d["tokens"]) for d in corpus))


def describe(corpus: list[dict[str, np.ndarray]], seq_len: int) -> dict:
    """Size and length figures of ``corpus`` (for the results file)."""
    lengths = np.array([len(d["tokens"]) for d in corpus], dtype=np.int64)
    return {
        "num_docs": len(corpus),
        "tokens": int(lengths.sum()),
        "mean_len": float(lengths.mean()) if len(lengths) else 0.0,
        "median_len": float(np.median(lengths)) if len(lengths) else 0.0,
        "max_len": int(lengths.max()) if len(lengths) else 0,
        "share_longer_than_seq_len": float((lengths > seq_len).mean()) if len(lengths) else 0.0,
    }
