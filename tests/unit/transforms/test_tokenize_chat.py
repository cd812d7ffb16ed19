"""``Dataset.tokenize_chat``: assistant-only loss masks, with and without generation markers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import text_fixtures as tf

import zephon_jax as zj
from zephon_jax.transforms.tokenize_chat import TokenizeChatTransform


def _records(num: int, seed: int) -> list[dict]:
    return [{"messages": m} for m in tf.conversations(num, seed)]


def _keys(n: int) -> list[tuple]:
    return [(0, 0, i) for i in range(n)]


def test_marked_template_gives_exactly_transformers_assistant_masks():
    tok = tf.hf_tokenizer(tf.MARKED_TEMPLATE)
    records = _records(40, seed=1)
    transform = TokenizeChatTransform(tok)
    assert transform.method == "generation_markers"
    batched = transform.apply_batch(records, _keys(len(records)))
    for i, (record, out) in enumerate(zip(records, batched)):
        want = tok.apply_chat_template(
            record["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        single = transform.apply(record, (0, 0, i))
        for got in (out, single):
            assert sorted(got) == ["loss_mask", "tokens"]
            assert got["tokens"].dtype == np.int32 and got["loss_mask"].dtype == np.int32
            assert got["tokens"].tolist() == list(want["input_ids"])
            assert got["loss_mask"].tolist() == list(want["assistant_masks"])
        mask = out["loss_mask"]
        assert 0 < mask.sum() < len(mask)


def test_mask_covers_the_assistant_content_and_its_end_of_turn_only():
    tok = tf.hf_tokenizer(tf.MARKED_TEMPLATE)
    messages = [
        {"role": "user", "content": "hello world"},
        {"role": "assistant", "content": "the quick fox"},
        {"role": "user", "content": "the lazy dog"},
        {"role": "assistant", "content": "data loader"},
    ]
    out = TokenizeChatTransform(tok).apply({"messages": messages}, (0, 0, 0))
    masked = tok.decode(out["tokens"][out["loss_mask"] == 1].tolist())
    unmasked = tok.decode(out["tokens"][out["loss_mask"] == 0].tolist())
    assert masked == "the quick fox<|end|>data loader<|end|>"
    assert (
        unmasked
        == "<|user|>hello world<|end|><|assistant|><|user|>the lazy dog<|end|><|assistant|>"
    )


def test_prefix_difference_without_markers_agrees_with_the_marked_template():
    marked = TokenizeChatTransform(tf.hf_tokenizer(tf.MARKED_TEMPLATE))
    unmarked = TokenizeChatTransform(tf.hf_tokenizer(tf.UNMARKED_TEMPLATE))
    assert unmarked.method == "prefix_difference"
    records = _records(60, seed=2)
    for a, b in zip(
        marked.apply_batch(records, _keys(60)), unmarked.apply_batch(records, _keys(60))
    ):
        assert a["tokens"].tobytes() == b["tokens"].tobytes()
        assert a["loss_mask"].tobytes() == b["loss_mask"].tobytes()
    single = unmarked.apply(records[5], (0, 0, 5))
    assert (
        single["loss_mask"].tobytes()
        == unmarked.apply_batch(records, _keys(60))[5]["loss_mask"].tobytes()
    )
    assert marked.describe() != unmarked.describe()


def test_messages_may_be_a_json_string():
    transform = TokenizeChatTransform(tf.hf_tokenizer())
    record = _records(1, seed=3)[0]
    a = transform.apply(record, (0, 0, 0))
    b = transform.apply({"messages": json.dumps(record["messages"])}, (0, 0, 0))
    assert a["tokens"].tobytes() == b["tokens"].tobytes()
    assert a["loss_mask"].tobytes() == b["loss_mask"].tobytes()


def test_template_that_cannot_produce_masks_is_a_clear_error():
    unstable = tf.hf_tokenizer(tf.UNSTABLE_TEMPLATE)
    with pytest.raises(zj.PipelineError) as info:
        zj.Dataset.source(_records(4, seed=4)).tokenize_chat(unstable)
    message = str(info.value)
    assert "no {% generation %} markers and is not prefix-stable" in message
    assert "wrap the assistant content in the template with {% generation %}" in message


def test_conversation_the_prefix_method_cannot_handle_is_named():
    tok = tf.hf_tokenizer(tf.UNMARKED_TEMPLATE)
    records = _records(20, seed=5)
    records[3] = {"messages": [{"role": "assistant", "content": "hi"}]}
    ds = zj.Dataset.source(records).tokenize_chat(tok).split(32).pack(32).batch(1)
    with pytest.raises(zj.PipelineError, match=r"starts with an assistant message.*\n.*record 3"):
        next(iter(zj.Loader(ds)))


def test_tokenizers_without_chat_support_are_rejected():
    with pytest.raises(zj.PipelineError, match="needs a transformers tokenizer"):
        zj.Dataset.source([{"messages": []}]).tokenize_chat(tf.bpe_tokenizer())
    from transformers import PreTrainedTokenizerFast

    no_template = PreTrainedTokenizerFast(tokenizer_object=tf.bpe_tokenizer())
    with pytest.raises(zj.PipelineError, match="no usable chat template"):
        zj.Dataset.source([{"messages": []}]).tokenize_chat(no_template)


def test_missing_or_malformed_messages_are_clear_errors():
    transform = TokenizeChatTransform(tf.hf_tokenizer())
    with pytest.raises(zj.PipelineError, match=r"tokenize_chat\(field='messages'\) needs records"):
        transform.apply({"text": "hi"}, (0, 0, 0))
    with pytest.raises(zj.PipelineError, match="non-empty list of messages"):
        transform.apply({"messages": [{"content": "no role"}]}, (0, 0, 0))
    with pytest.raises(zj.PipelineError, match="not JSON"):
        transform.apply({"messages": "{oops"}, (0, 0, 0))
