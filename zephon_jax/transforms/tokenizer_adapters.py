"""One interface over the tokenizers :meth:`Dataset.tokenize` accepts.

:func:`as_text_tokenizer` wraps any of

* a callable ``str -> Sequence[int]``;
* a ``tokenizers.Tokenizer``;
* a ``transformers`` tokenizer (``PreTrainedTokenizerBase``);
* a ``tiktoken.Encoding``;
* a ``sentencepiece.SentencePieceProcessor``

into a :class:`TextTokenizer` whose ``encode``/``encode_batch`` add no special
tokens and return int32 arrays, and whose ``identity`` is a hash of what
decides its output (vocabulary, merges, normalization and configuration, where
the library exposes them). The identity goes into the pipeline fingerprint, so
a state does not restore into a pipeline with another tokenizer.

The libraries are optional: nothing here imports them; an object is recognized
by the module its type comes from.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
from typing import Any, Sequence

import numpy as np

from zephon_jax.core.naming import callable_name
from zephon_jax.errors import PipelineError

_INT32_MAX = np.iinfo(np.int32).max


def to_int32(ids: Any, what: str) -> np.ndarray:
    """``ids`` (a sequence of ints) as a 1-D int32 array; raises if they do not fit."""
    arr = np.asarray(ids)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise PipelineError(
            f"{what} returned {type(ids).__name__} of shape {arr.shape} and dtype {arr.dtype}; "
            "a tokenizer must return a flat sequence of int token ids"
        )
    if arr.size and (arr.min() < 0 or arr.max() > _INT32_MAX):
        raise PipelineError(f"{what} returned token ids outside [0, 2**31): {arr.min()}..")
    return arr.astype(np.int32, copy=False)


def _sha256(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def is_instance_of_lib(obj: Any, module: str, attr_path: str) -> bool:
    """``isinstance(obj, module.attr_path)`` without importing ``module`` (False while it is
    not imported: then ``obj`` cannot be one of its objects)."""
    import sys

    lib = sys.modules.get(module)
    if lib is None:
        return False
    cls: Any = lib
    for part in attr_path.split("."):
        cls = getattr(cls, part, None)
        if cls is None:
            return False
    return isinstance(obj, cls)


class TextTokenizer:
    """A tokenizer behind one interface; subclasses wrap one library each.

    * ``encode(text) -> int32 array`` adds no special tokens;
    * ``encode_batch(texts)`` equals ``[encode(t) for t in texts]``, in one call
      where the library batches;
    * ``identity`` names the library and hashes what decides the output;
    * ``batched`` says whether ``encode_batch`` is faster than one by one.
    """

    kind: str = "callable"
    batched: bool = False

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._identity: str | None = None

    def encode(self, text: str) -> np.ndarray:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def _fingerprint_parts(self) -> tuple:
        raise NotImplementedError

    @property
    def identity(self) -> str:
        """``"<kind>:<sha256 prefix>"``, computed once."""
        if self._identity is None:
            self._identity = f"{self.kind}:{_sha256(*self._fingerprint_parts())[:24]}"
        return self._identity

    def __getstate__(self):
        return {"tokenizer": self.tokenizer, "_identity": self._identity}

    def __setstate__(self, state):
        self.tokenizer = state["tokenizer"]
        self._identity = state["_identity"]


class CallableTokenizer(TextTokenizer):
    """A plain function ``str -> Sequence[int]``; its identity is its qualified name."""

    kind = "callable"

    def encode(self, text: str) -> np.ndarray:
        return to_int32(self.tokenizer(text), f"tokenizer {self._name()}")

    def _name(self) -> str:

        return callable_name(self.tokenizer)

    def _fingerprint_parts(self) -> tuple:
        return (self._name(),)

    @property
    def identity(self) -> str:
        return f"callable:{self._name()}"


class HFTokenizersTokenizer(TextTokenizer):
    """A ``tokenizers.Tokenizer``; identity: its full JSON (vocabulary, merges, config)."""

    kind = "tokenizers"
    batched = True

    def __init__(self, tokenizer: Any):
        if tokenizer.padding is not None:
            raise PipelineError(
                "the tokenizers.Tokenizer has padding enabled, which would add pad tokens to "
                "every record; call tokenizer.no_padding() before passing it (packing pads rows)"
            )
        super().__init__(tokenizer)

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        # encode_batch_fast (tokenizers >= 0.20) skips character offsets: same ids, faster.
        batch = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        encodings = batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, np.int32) for e in encodings]

    def _fingerprint_parts(self) -> tuple:
        return (self.tokenizer.to_str(),)


# Attributes of a slow transformers tokenizer that do not change what it encodes, or
# change as it is used (caches, warnings issued), or name where its files were.
_SLOW_IGNORED = frozenset(
    {
        "deprecation_warnings",
        "_in_target_context_manager",
        "verbose",
        "name_or_path",
        "_name_or_path",
        "_processor_class",
        "init_inputs",
        "files_loaded",
        "tokens_trie",  # built from the added tokens, which are hashed
        "model_max_length",
        "padding_side",
        "truncation_side",
        "model_input_names",
        "clean_up_tokenization_spaces",
        "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output",
        "_commit_hash",
        "cache_dir",
        "local_files_only",
        "revision",
        "subfolder",
        "token",
        "use_auth_token",
        "trust_remote_code",
        "_from_auto",
        "_from_pipeline",
    }
)
_MAX_DEPTH = 6
_WARM_UP = "Warm up: 1 a."


def _ignored(name: Any) -> bool:
    if not isinstance(name, str):
        return False
    return (
        name in _SLOW_IGNORED
        or "cache" in name
        or name.endswith(("_file", "_files", "_path", "_dir"))
    )


def _qualname(obj: Any) -> str:
    kind = obj if isinstance(obj, type) else type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def _is_plain(value: Any) -> bool:
    """Whether ``value`` is its own canonical form: a str, int, bool or None, or a
    tuple of them (a BPE merge)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    return kind is tuple and all(type(v) is str or type(v) is int for v in value)


def _sorted_items(pairs: list) -> list:
    """``[key, value]`` pairs sorted by key, whatever order they came in."""
    try:
        return sorted(pairs, key=lambda kv: kv[0])
    except TypeError:  # keys of mixed types
        return sorted(pairs, key=lambda kv: json.dumps(kv[0], sort_keys=True))


def canonical(value: Any, depth: int = 0) -> Any:
    """``value`` as plain JSON data that does not depend on dict or set order, object
    addresses or the process: what :func:`slow_tokenizer_state` hashes.

    Dicts become sorted ``[key, value]`` pairs; regular expressions their pattern and
    flags; a SentencePiece model its serialized proto's hash; ``AddedToken`` its content and flags; other objects
    their type and attributes (less those :func:`_ignored` names), to ``_MAX_DEPTH``
    levels; functions and classes their names.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return ["float", repr(value)]
    if isinstance(value, (bytes, bytearray)):
        return ["bytes", _sha256(bytes(value))]
    if isinstance(value, dict):
        if all(map(_is_plain, value)) and all(map(_is_plain, value.values())):
            pairs = list(value.items())  # a vocabulary or BPE ranks: as they are, fast
        else:
            pairs = [(canonical(k, depth + 1), canonical(v, depth + 1)) for k, v in value.items()]
        return ["dict", _sorted_items(pairs)]
    if isinstance(value, (list, tuple)):
        if all(map(_is_plain, value)):
            return [type(value).__name__, list(value)]
        return [type(value).__name__, [canonical(v, depth + 1) for v in value]]
    if isinstance(value, (set, frozenset)):
        items = [canonical(v, depth + 1) for v in value]
        return ["set", sorted(items, key=lambda v: json.dumps(v, sort_keys=True))]
    if hasattr(value, "pattern") and hasattr(value, "flags"):  # re / regex patterns
        return ["pattern", canonical(value.pattern), int(value.flags)]
    if callable(getattr(value, "serialized_model_proto", None)):  # SentencePiece
        return ["sentencepiece", _sha256(value.serialized_model_proto())]
    if type(value).__name__ == "AddedToken" and hasattr(value, "content"):
        flags = ("lstrip", "rstrip", "normalized", "single_word", "special")
        return ["AddedToken", value.content, [bool(getattr(value, f, False)) for f in flags]]
    if isinstance(value, type) or inspect.isroutine(value):
        return ["callable", getattr(value, "__module__", ""), getattr(value, "__qualname__", "")]
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict) and depth < _MAX_DEPTH:
        return [_qualname(value), canonical(_attributes(attrs), depth + 1)]
    return [_qualname(value)]


def _attributes(attrs: dict) -> dict:
    """An object's attributes less those ``_ignored`` names, and less the ignored
    entries of its ``init_kwargs`` (where ``transformers`` keeps loading options)."""
    out = {k: v for k, v in attrs.items() if not _ignored(k)}
    if isinstance(out.get("init_kwargs"), dict):
        out["init_kwargs"] = {k: v for k, v in out["init_kwargs"].items() if not _ignored(k)}
    return out


def slow_tokenizer_state(tokenizer: Any) -> str:
    """JSON of what decides a slow (Python) ``transformers`` tokenizer's output: its
    vocabulary and every attribute (BPE ranks, added and special tokens, normalizer
    settings, init kwargs, a SentencePiece model), canonical (see :func:`canonical`).

    The tokenizer encodes a short text first, so that attributes it sets up on first
    use (e.g. a normalizer) are there whether or not it was used before.
    """
    with contextlib.suppress(Exception):  # errors belong to encoding records, not here
        tokenizer(_WARM_UP, add_special_tokens=False)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    state = canonical(_attributes(vars(tokenizer)))
    return json.dumps([_qualname(tokenizer), vocab, state], ensure_ascii=False)


class TransformersTokenizer(TextTokenizer):
    """A ``transformers`` tokenizer (fast or slow).

    Identity: class name, the backend's JSON (fast tokenizers) or, for slow
    (Python) ones, the vocabulary and every attribute that decides the output
    (BPE merges, added and special tokens, normalizer settings, init kwargs, a
    SentencePiece model; see :func:`slow_tokenizer_state`), the special tokens
    and the chat template.
    """

    kind = "transformers"

    def __init__(self, tokenizer: Any):
        super().__init__(tokenizer)
        self.batched = bool(getattr(tokenizer, "is_fast", False))

    def encode(self, text: str) -> np.ndarray:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return to_int32(ids, f"{type(self.tokenizer).__name__}")

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        if not self.batched:
            return [self.encode(t) for t in texts]
        ids = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        return [np.asarray(x, np.int32) for x in ids]

    def __setstate__(self, state):
        super().__setstate__(state)
        self.batched = bool(getattr(self.tokenizer, "is_fast", False))

    def _fingerprint_parts(self) -> tuple:
        tok = self.tokenizer
        backend = getattr(tok, "backend_tokenizer", None) if self.batched else None
        model = backend.to_str() if backend is not None else slow_tokenizer_state(tok)
        template = getattr(tok, "chat_template", None)
        return (
            type(tok).__name__,
            model,
            json.dumps(tok.special_tokens_map, sort_keys=True, default=str),
            json.dumps(template, sort_keys=True, default=str),
        )


class TiktokenTokenizer(TextTokenizer):
    """A ``tiktoken.Encoding``, encoded with ``encode_ordinary`` (no special tokens).

    Records are encoded in a loop: tiktoken's batch API is a Python thread pool
    around the same call, which measured several times slower on blocks of
    short texts. Identity: the split pattern, the mergeable ranks and the
    special tokens.
    """

    kind = "tiktoken"

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode_ordinary(text), np.int32)

    def _fingerprint_parts(self) -> tuple:
        enc = self.tokenizer
        ranks = sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1])
        ranks_blob = b"".join(len(k).to_bytes(2, "little") + k for k, _ in ranks)
        ranks_blob += np.asarray([v for _, v in ranks], np.int64).tobytes()
        return (
            enc._pat_str,
            ranks_blob,
            json.dumps(sorted(enc._special_tokens.items())),
        )


class SentencePieceTokenizer(TextTokenizer):
    """A ``sentencepiece.SentencePieceProcessor``; no BOS/EOS, no sampling.

    Identity: the serialized model (pieces, scores, normalizer and trainer spec).
    """

    kind = "sentencepiece"
    batched = True

    def _encode(self, text_or_texts):
        return self.tokenizer.encode(
            text_or_texts, out_type=int, add_bos=False, add_eos=False, enable_sampling=False
        )

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._encode(text), np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(x, np.int32) for x in self._encode(list(texts))]

    def _fingerprint_parts(self) -> tuple:
        return (self.tokenizer.serialized_model_proto(),)


def as_text_tokenizer(tokenizer: Any) -> TextTokenizer:
    """Wraps ``tokenizer`` (see the module docstring); raises a PipelineError otherwise."""
    if isinstance(tokenizer, TextTokenizer):
        return tokenizer
    if is_instance_of_lib(tokenizer, "tokenizers", "Tokenizer"):
        return HFTokenizersTokenizer(tokenizer)
    if is_instance_of_lib(tokenizer, "transformers", "PreTrainedTokenizerBase"):
        return TransformersTokenizer(tokenizer)
    if is_instance_of_lib(tokenizer, "tiktoken", "Encoding"):
        return TiktokenTokenizer(tokenizer)
    if is_instance_of_lib(tokenizer, "sentencepiece", "SentencePieceProcessor"):
        return SentencePieceTokenizer(tokenizer)
    if callable(tokenizer):
        return CallableTokenizer(tokenizer)
    raise PipelineError(
        f"tokenize cannot use a {type(tokenizer).__module__}.{type(tokenizer).__name__}; pass "
        "a callable str -> list[int], a tokenizers.Tokenizer, a transformers tokenizer, a "
        "tiktoken.Encoding or a sentencepiece.SentencePieceProcessor"
    )
