"""Tokenizers for corpus preparation: byte-level, or any ``module:function``.

Byte-level ids: ``0`` (``PAD_ID``, also what packing pads with) and ``1``
(``EOS_ID``) are reserved, byte ``b`` is token ``b + 2``: 258 ids in all.
"""

from __future__ import annotations

import collections
import importlib
import os
import sys
from typing import Any, Callable, Iterable

import numpy as np

from zephon_jax.errors import PipelineError

PAD_ID = 0
EOS_ID = 1
BYTE_OFFSET = 2
BYTE_VOCAB_SIZE = 256 + BYTE_OFFSET


def byte_tokenize(text: str) -> np.ndarray:
    """Byte-level tokens: the UTF-8 bytes of ``text`` plus ``BYTE_OFFSET``, as uint16.

    Ids ``0`` (``PAD_ID``, also what packing pads with) and ``1`` (``EOS_ID``)
    are reserved, so byte ``b`` is token ``b + 2`` and the vocabulary has 258 ids.
    """
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16) + BYTE_OFFSET


def byte_detokenize(tokens: Any) -> str:
    """Inverse of :func:`byte_tokenize`; reserved ids are dropped."""
    arr = np.asarray(tokens).astype(np.int64)
    arr = arr[arr >= BYTE_OFFSET] - BYTE_OFFSET
    return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def load_callable(spec: str) -> Callable[..., Any]:
    """Resolves ``"module:function"`` (the function may be a dotted attribute path)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise PipelineError(
            f"{spec!r} is not of the form module:function (e.g. mypkg.tok:encode); the module "
            "must be importable from the current directory or PYTHONPATH"
        )
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise PipelineError(f"cannot import module {module_name!r} of {spec!r}: {e}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise PipelineError(f"module {module_name!r} has no attribute {attr!r}") from e
    if not callable(obj):
        raise PipelineError(f"{spec!r} is a {type(obj).__name__}, not a callable")
    return obj


def is_byte_tokenizer(spec: str | None) -> bool:
    """Whether ``spec`` names the built-in byte-level tokenizer (None, "" or "bytes")."""
    return spec in (None, "", "bytes")


def load_tokenizer(spec: str | None) -> Callable[[str], Any]:
    """The tokenizer ``spec`` names (``module:function``, ``str -> list[int]``); None: bytes."""
    if spec is None or is_byte_tokenizer(spec):
        return byte_tokenize
    return load_callable(spec)


def tokenizer_eos_id(tokenize: Callable[..., Any]) -> int | None:
    """The id that ends a document for the tokenizer callable ``tokenize``, where it says:
    an ``eos_token_id`` (or tiktoken's ``eot_token``) of the callable itself or of the
    object it is a method of (a Hugging Face tokenizer's ``encode``); else None."""
    if tokenize is byte_tokenize:
        return EOS_ID
    for obj in (tokenize, getattr(tokenize, "__self__", None)):
        for attr in ("eos_token_id", "eot_token"):
            value = getattr(obj, attr, None)
            if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
                return int(value)
    return None


# Splits text into words before byte-pair merges (the shape of tiktoken's patterns).
WORD_PATTERN = r"""'s|'t| ?\w+| ?[^\s\w]+|\s+(?!\S)|\s+"""


def learn_byte_pair_ranks(
    texts: Iterable[str], num_merges: int, pattern: str = WORD_PATTERN
) -> dict[bytes, int]:
    """Byte-pair merges learned on ``texts``: the ``mergeable_ranks`` a
    ``tiktoken.Encoding`` takes, so one can be built without a download.

    The 256 bytes first, then ``num_merges`` merges (fewer if no pair is left), each
    the most frequent adjacent pair over the words ``pattern`` finds (ties: the
    larger pair). Deterministic; needs the ``regex`` package (tiktoken's own).
    """
    import regex

    words = collections.Counter(w.encode("utf-8") for t in texts for w in regex.findall(pattern, t))
    ranks = {bytes([b]): b for b in range(256)}
    split = {w: [bytes([b]) for b in w] for w in words}
    for _ in range(num_merges):
        pairs: collections.Counter = collections.Counter()
        for w, parts in split.items():
            for a, b in zip(parts, parts[1:]):
                pairs[a, b] += words[w]
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        ranks[a + b] = len(ranks)
        for w, parts in split.items():
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == a and parts[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            split[w] = merged
    return ranks
