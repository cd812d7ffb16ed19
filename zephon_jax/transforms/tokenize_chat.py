"""``tokenize_chat``: a conversation becomes ``{"tokens", "loss_mask"}`` (int32).

``loss_mask`` is 1 exactly on the tokens the assistant generates, 0 elsewhere.
Two methods, chosen from the tokenizer's chat template:

* **generation markers**: a template that wraps assistant output in
  ``{% generation %}...{% endgeneration %}`` is rendered by ``transformers``'
  ``apply_chat_template(..., return_assistant_tokens_mask=True)``; tokens and
  mask are exactly what it returns.
* **prefix difference**, for templates without markers: for every assistant
  message ``i``, render the conversation up to message ``i - 1`` with the
  generation prompt (``P``) and up to message ``i`` without it (``Q``). The
  assistant's characters are ``Q[len(P):]``: its content and whatever the
  template writes after it up to the next message (end-of-turn token,
  newline). This needs a *prefix-stable* template: ``P`` is a prefix of ``Q``
  and ``Q`` a prefix of the whole rendered conversation. Tokens overlapping
  those characters get mask 1, the rule ``transformers`` applies to marker
  spans.

Both need a fast tokenizer (character offsets). A template that has no markers
and is not prefix-stable (e.g. one that drops earlier turns' reasoning) cannot
give masks: ``tokenize_chat`` raises when it is defined (a probe conversation)
or at the first record that shows it.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

import numpy as np

from zephon_jax.errors import PipelineError
from zephon_jax.transforms.tokenize import record_field
from zephon_jax.transforms.tokenizer_adapters import TransformersTokenizer, is_instance_of_lib

GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")
METHODS = ("generation_markers", "prefix_difference")
_PROBE = (
    {"role": "user", "content": "Hello there."},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "Count to three."},
    {"role": "assistant", "content": "One, two, three."},
)
_FIX = (
    "wrap the assistant content in the template with {% generation %}...{% endgeneration %} "
    "(then transformers' assistant masks are used)"
)


def overlap_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list:
    """1 for every token whose character range overlaps one of the sorted ``spans``."""
    mask = [0] * len(offsets)
    k = 0
    for t, (start, end) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if end > spans[k][0]:
            mask[t] = 1
    return mask


class TokenizeChatTransform:
    """``{field: [{"role", "content"}, ...]} -> {"tokens", "loss_mask"}`` (int32).

    ``field`` may also hold the messages as a JSON string. Pure; the
    tokenizer's identity (vocabulary, merges, special tokens, chat template)
    and the method are part of :meth:`describe`, hence of the fingerprint.
    """

    def __init__(self, tokenizer: Any, field: str = "messages"):
        if not is_instance_of_lib(tokenizer, "transformers", "PreTrainedTokenizerBase"):
            raise PipelineError(
                f"tokenize_chat needs a transformers tokenizer with a chat template; got "
                f"{type(tokenizer).__module__}.{type(tokenizer).__name__}. Wrap a "
                "tokenizers.Tokenizer in transformers.PreTrainedTokenizerFast(tokenizer_object="
                "..., chat_template=...)"
            )
        if not isinstance(field, str):
            raise PipelineError(f"tokenize_chat(field=...) needs a field name; got {field!r}")
        try:
            template = tokenizer.get_chat_template()
        except (ValueError, TypeError) as e:
            raise PipelineError(
                f"tokenize_chat: the tokenizer has no usable chat template ({e}); set "
                "tokenizer.chat_template to a Jinja template"
            ) from e
        if not getattr(tokenizer, "is_fast", False):
            raise PipelineError(
                f"tokenize_chat needs a fast tokenizer (character offsets map the assistant's "
                f"text to tokens); {type(tokenizer).__name__} is slow: load it with use_fast=True"
            )
        self.tokenizer = tokenizer
        self.field = field
        self.method = (
            "generation_markers" if GENERATION_MARKER.search(template) else "prefix_difference"
        )
        self.identity = TransformersTokenizer(tokenizer).identity
        if self.method == "prefix_difference":
            self._probe()
        self.name = self.describe()

    # ----- messages ---------------------------------------------------------------------
    def _messages(self, record: Any) -> list:
        value = record_field(record, self.field, "tokenize_chat")
        if isinstance(value, (str, bytes, np.str_, np.bytes_)):
            try:
                value = json.loads(value)
            except ValueError as e:
                raise PipelineError(
                    f"tokenize_chat: field {self.field!r} holds a string that is not JSON ({e}); "
                    "it must be a list of {'role': ..., 'content': ...} messages"
                ) from e
        if (
            not isinstance(value, (list, tuple))
            or not value
            or not all(isinstance(m, dict) and "role" in m for m in value)
        ):
            raise PipelineError(
                f"tokenize_chat: field {self.field!r} must hold a non-empty list of messages "
                f"(dicts with 'role' and 'content'); got {type(value).__name__}"
            )
        return [dict(m) for m in value]

    # ----- prefix difference ----------------------------------------------------------
    def _render(self, messages: list, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _assistant_spans(self, messages: list) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the character spans the assistant generates."""
        full = self._render(messages, False)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            if i == 0:
                raise PipelineError(
                    "tokenize_chat (prefix difference): the conversation starts with an "
                    "assistant message, so there is no prompt to take the difference from; "
                    f"{_FIX}"
                )
            prompt = self._render(messages[:i], True)
            done = self._render(messages[: i + 1], False)
            if not (done.startswith(prompt) and full.startswith(done)):
                raise PipelineError(
                    "tokenize_chat cannot build a loss mask: the chat template has no "
                    "{% generation %} markers and is not prefix-stable (rendering the first "
                    f"{i} messages with the generation prompt, then {i + 1} messages, does not "
                    f"give prefixes of the whole conversation, at message {i}); {_FIX}"
                )
            spans.append((len(prompt), len(done)))
        return full, spans

    def _probe(self) -> None:
        """Checks prefix stability on a small conversation, to fail at definition time."""
        try:
            self._assistant_spans([dict(m) for m in _PROBE])
        except PipelineError:
            raise
        except Exception:
            pass  # the template rejects the probe; records are checked one by one

    # ----- transform --------------------------------------------------------------------
    def apply(self, record: Any, rng_key: tuple) -> dict:
        return self.apply_batch([record], [rng_key])[0]

    def apply_batch(self, records: Sequence[Any], rng_keys: Sequence[tuple]) -> list[dict]:
        """``[apply(r, k) ...]`` with the block tokenized in one call."""
        conversations = [self._messages(r) for r in records]
        tok = self.tokenizer
        if self.method == "generation_markers":
            out = tok.apply_chat_template(
                conversations, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            ids, masks = out["input_ids"], out["assistant_masks"]
        else:
            rendered = [self._assistant_spans(c) for c in conversations]
            out = tok(
                [text for text, _ in rendered],
                add_special_tokens=False,
                return_offsets_mapping=True,
            )
            ids = out["input_ids"]
            masks = [
                overlap_mask(offsets, spans)
                for offsets, (_, spans) in zip(out["offset_mapping"], rendered)
            ]
        return [
            {"tokens": np.asarray(i, np.int32), "loss_mask": np.asarray(m, np.int32)}
            for i, m in zip(ids, masks)
        ]

    def describe(self) -> str:
        return f"tokenize_chat({self.identity}, field={self.field!r}, method={self.method!r})"
