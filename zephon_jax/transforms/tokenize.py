"""``tokenize``: a text field becomes ``{"tokens": int32 array}``.

The tokenizer adds no special tokens; ``bos_id``/``eos_id``, when given, are
prepended/appended. Other fields are dropped. Blocks of records are encoded in
one call where the tokenizer batches (:meth:`TokenizeTransform.apply_batch`),
with exactly the output of encoding them one by one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Sequence

import numpy as np

from zephon_jax.errors import PipelineError
from zephon_jax.transforms.tokenizer_adapters import TextTokenizer, as_text_tokenizer


def check_token_id(value: Any, name: str, op: str) -> int | None:
    """``value`` as a non-negative int token id, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise PipelineError(f"{op}({name}=...) needs a non-negative int token id; got {value!r}")
    return int(value)


def record_field(record: Any, field: str, op: str) -> Any:
    """``record[field]``, or a PipelineError naming the field and the fix."""
    try:
        return record[field]
    except (KeyError, TypeError, IndexError):
        pass
    have = f"a dict with fields {sorted(record)}" if isinstance(record, Mapping) else type(record)
    raise PipelineError(
        f"{op}(field={field!r}) needs records with a {field!r} field; got {have}. Pass "
        f"field=... naming the field that holds the input, or map the records to have one"
    )


def as_text(value: Any, field: str) -> str:
    """A text field's value as ``str`` (``bytes`` are decoded as UTF-8)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise PipelineError(
                f"tokenize: field {field!r} holds bytes that are not UTF-8 ({e}); decode them "
                "with a map before tokenize"
            ) from e
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return as_text(value.item(), field)
    raise PipelineError(
        f"tokenize: field {field!r} holds a {type(value).__name__}, not text (str or UTF-8 "
        "bytes); convert it with a map before tokenize"
    )


class TokenizeTransform:
    """``{field: text, ...} -> {"tokens": int32[bos + encode(text) + eos]}``.

    Pure: the output depends on the record and the tokenizer only. The
    tokenizer's identity (a hash of its vocabulary, merges and configuration)
    is part of :meth:`describe`, hence of the pipeline fingerprint.
    """

    def __init__(
        self,
        tokenizer: Any,
        field: str = "text",
        bos_id: int | None = None,
        eos_id: int | None = None,
    ):
        if not isinstance(field, str):
            raise PipelineError(f"tokenize(field=...) needs a field name (str); got {field!r}")
        self.tokenizer: TextTokenizer = as_text_tokenizer(tokenizer)
        self.field = field
        self.bos_id = check_token_id(bos_id, "bos_id", "tokenize")
        self.eos_id = check_token_id(eos_id, "eos_id", "tokenize")
        self.name = self.describe()

    def _text(self, record: Any) -> str:
        return as_text(record_field(record, self.field, "tokenize"), self.field)

    def _wrap(self, ids: np.ndarray) -> dict:
        parts = [ids]
        if self.bos_id is not None:
            parts.insert(0, np.array([self.bos_id], np.int32))
        if self.eos_id is not None:
            parts.append(np.array([self.eos_id], np.int32))
        tokens = np.concatenate(parts) if len(parts) > 1 else np.array(ids, np.int32)
        return {"tokens": tokens}

    def apply(self, record: Any, rng_key: tuple) -> dict:
        return self._wrap(self.tokenizer.encode(self._text(record)))

    def apply_batch(self, records: Sequence[Any], rng_keys: Sequence[tuple]) -> list[dict]:
        """``[apply(r, k) for r, k in zip(records, rng_keys)]``, encoded in one call."""
        texts = [self._text(r) for r in records]
        return [self._wrap(ids) for ids in self.tokenizer.encode_batch(texts)]

    def describe(self) -> str:
        return (
            f"tokenize({self.tokenizer.identity}, field={self.field!r}, "
            f"bos_id={self.bos_id}, eos_id={self.eos_id})"
        )
