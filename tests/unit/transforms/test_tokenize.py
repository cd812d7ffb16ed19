"""``Dataset.tokenize``: every supported tokenizer kind, batched per block, fingerprinted."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import text_fixtures as tf

import zephon_jax as zj
from zephon_jax.transforms.tokenize import TokenizeTransform
from zephon_jax.transforms.tokenizer_adapters import HFTokenizersTokenizer, as_text_tokenizer


def _records(num: int, seed: int) -> list[dict]:
    return [{"text": t, "id": i} for i, t in enumerate(tf.texts(num, seed))]


@pytest.mark.parametrize("kind", tf.TOKENIZER_KINDS)
def test_tokens_are_the_library_encoding_with_bos_and_eos(kind):
    tokenizer, encode = tf.make_tokenizer(kind)
    records = _records(40, seed=1) + [{"text": ""}, {"text": "héllo wörld ✓"}]
    transform = TokenizeTransform(tokenizer, bos_id=tf.BOS, eos_id=tf.EOS)
    expected = [np.array([tf.BOS, *encode(r["text"]), tf.EOS], np.int32) for r in records]
    one_by_one = [transform.apply(r, (0, 0, i)) for i, r in enumerate(records)]
    batched = transform.apply_batch(records, [(0, 0, i) for i in range(len(records))])
    for want, a, b in zip(expected, one_by_one, batched):
        assert list(a) == ["tokens"] and list(b) == ["tokens"]
        assert a["tokens"].dtype == np.int32 and b["tokens"].dtype == np.int32
        assert a["tokens"].tobytes() == want.tobytes() == b["tokens"].tobytes()
    assert max(len(e) for e in expected) > 10
    plain = TokenizeTransform(tokenizer).apply(records[0], (0, 0, 0))["tokens"]
    assert plain.tobytes() == np.asarray(encode(records[0]["text"]), np.int32).tobytes()


@pytest.mark.parametrize("kind", tf.TOKENIZER_KINDS)
def test_pipeline_rows_hold_the_tokens_of_the_records_in_order(kind):
    tokenizer, encode = tf.make_tokenizer(kind)
    records = _records(60, seed=2)
    ds = (
        zj.Dataset.source(records)
        .repeat(1)
        .tokenize(tokenizer, eos_id=tf.EOS)
        .pack(64, method="concat")
        .batch(1)
    )
    rows = [b["tokens"][0] for b in zj.Loader(ds)]
    stream = np.concatenate(rows)
    want = np.concatenate([np.array([*encode(r["text"]), tf.EOS], np.int32) for r in records])
    assert stream.dtype == np.int32
    assert stream[: len(want)].tobytes() == want.tobytes()
    assert not stream[len(want) :].any()


def test_lanes_encode_blocks_of_records_in_one_call(monkeypatch):
    calls = []
    original = HFTokenizersTokenizer.encode_batch

    def spy(self, texts):
        calls.append(len(texts))
        return original(self, texts)

    def forbidden(self, text):
        raise AssertionError("one-by-one encode used where a block could be batched")

    monkeypatch.setattr(HFTokenizersTokenizer, "encode_batch", spy)
    monkeypatch.setattr(HFTokenizersTokenizer, "encode", forbidden)
    ds = (
        zj.Dataset.source(_records(500, seed=3))
        .shuffle(1)
        .tokenize(tf.bpe_tokenizer(), eos_id=tf.EOS)
        .split(32)
        .pack(32, num_bins=4)
        .batch(4, num_lanes=2)
    )
    it = iter(zj.Loader(ds))
    for _ in range(40):
        next(it)
    # Blocks grow 8, 16, 32, ... per lane; every record went through a batched call.
    assert max(calls) >= 32 and sum(calls) >= 8 * len(calls)


def test_token_mixtures_encode_blocks_of_each_component_in_one_call(monkeypatch):
    calls = []
    original = HFTokenizersTokenizer.encode_batch

    def spy(self, texts):
        calls.append(len(texts))
        return original(self, texts)

    def forbidden(self, text):
        raise AssertionError("one-by-one encode used where a block could be batched")

    def pipeline():
        parts = [
            zj.Dataset.source(_records(300, seed=s)).tokenize(tf.bpe_tokenizer(), eos_id=tf.EOS)
            for s in (7, 8)
        ]
        ds = zj.Dataset.mix(parts, {0: [0.5, 0.5], 5: [0.2, 0.8]}, unit="tokens")
        return ds.split(32).pack(32, num_bins=4).batch(4, num_lanes=2)

    expected = [next(it) for it in [iter(zj.Loader(pipeline()))] for _ in range(12)]
    monkeypatch.setattr(HFTokenizersTokenizer, "encode_batch", spy)
    monkeypatch.setattr(HFTokenizersTokenizer, "encode", forbidden)
    it = iter(zj.Loader(pipeline(), process_index=1, process_count=2))
    got = [next(it) for _ in range(12)]
    assert max(calls) >= 16
    for want, part in zip(expected, got):
        assert part["tokens"].tobytes() == want["tokens"][2:].tobytes()


def test_a_failing_record_in_a_block_is_named():
    records = _records(30, seed=4)
    records[13] = {"text": 17}
    ds = zj.Dataset.source(records).tokenize(tf.bpe_tokenizer()).split(64).pack(64).batch(2)
    with pytest.raises(zj.PipelineError) as info:
        next(iter(zj.Loader(ds)))
    message = str(info.value)
    assert "field 'text' holds a int, not text" in message
    assert "record 13" in message and "lane" in message


def test_missing_field_is_a_clear_error():
    ds = zj.Dataset.source([{"content": "a b c"}] * 4).tokenize(tf.char_codes).pack(8).batch(2)
    with pytest.raises(zj.PipelineError, match=r"tokenize\(field='text'\) needs records with a "):
        next(iter(zj.Loader(ds)))
    with pytest.raises(
        zj.PipelineError,
        match=r"fields \['content'\]\. Pass field=.*\n  \(at lane 0, lane-local position 0",
    ):
        next(iter(zj.Loader(ds)))
    ok = zj.Dataset.source([{"content": "abc"}] * 4).tokenize(tf.char_codes, field="content")
    batch = next(iter(zj.Loader(ok.pack(8).batch(2))))
    assert batch["tokens"][0, :6].tolist() == [97, 98, 99, 97, 98, 99]


def test_bad_tokenizers_and_ids_are_rejected():
    with pytest.raises(zj.PipelineError, match="cannot use a builtins.int"):
        zj.Dataset.source([{"text": "a"}]).tokenize(3)
    with pytest.raises(zj.PipelineError, match="bos_id"):
        zj.Dataset.source([{"text": "a"}]).tokenize(tf.char_codes, bos_id=-1)
    from tokenizers import Tokenizer

    padded = Tokenizer.from_str(tf.bpe_tokenizer().to_str())
    padded.enable_padding(length=16)
    with pytest.raises(zj.PipelineError, match="no_padding"):
        zj.Dataset.source([{"text": "a"}]).tokenize(padded)
    bad = zj.Dataset.source([{"text": "a"}] * 2).tokenize(lambda t: [[1, 2]]).pack(4).batch(1)
    with pytest.raises(zj.PipelineError, match="flat sequence of int token ids"):
        next(iter(zj.Loader(bad)))


def _other(kind: str):
    """A tokenizer of ``kind`` that encodes differently from :func:`tf.make_tokenizer`'s."""
    if kind == "callable":
        return lambda text: [ord(c) + 1 for c in text]
    if kind == "tokenizers":
        return tf.bpe_tokenizer(300)
    if kind == "transformers":
        return tf.hf_tokenizer(tf.MARKED_TEMPLATE, 300)
    if kind == "tiktoken":
        return tf.tiktoken_encoding(100)
    return tf.sentencepiece_processor(140)


def _pipeline(tokenizer) -> zj.BatchedDataset:
    return (
        zj.Dataset.source(_records(50, seed=5))
        .tokenize(tokenizer, eos_id=tf.EOS)
        .split(32)
        .pack(32, num_bins=2)
        .batch(2)
    )


@pytest.mark.parametrize("kind", tf.TOKENIZER_KINDS)
def test_restoring_into_a_pipeline_with_another_tokenizer_raises(kind):
    tokenizer, _ = tf.make_tokenizer(kind)
    it = iter(zj.Loader(_pipeline(tokenizer)))
    next(it)
    state = it.get_state()
    other = iter(zj.Loader(_pipeline(_other(kind))))
    with pytest.raises(zj.StateMismatchError) as info:
        other.set_state(state)
    assert info.value.field == "transforms"
    assert f"tokenize({kind}:" in str(info.value)
    same = iter(zj.Loader(_pipeline(tokenizer)))
    same.set_state(state)
    assert next(same)["tokens"].tobytes() == next(it)["tokens"].tobytes()


def test_identity_hashes_content_not_object():
    retrained = tf.bpe_tokenizer.__wrapped__(320)
    assert retrained is not tf.bpe_tokenizer()
    assert as_text_tokenizer(retrained).identity == as_text_tokenizer(tf.bpe_tokenizer()).identity
    assert (
        as_text_tokenizer(tf.tiktoken_encoding()).identity
        == as_text_tokenizer(tf.tiktoken_encoding()).identity
    )
    marked = as_text_tokenizer(tf.hf_tokenizer(tf.MARKED_TEMPLATE)).identity
    unmarked = as_text_tokenizer(tf.hf_tokenizer(tf.UNMARKED_TEMPLATE)).identity
    assert marked != unmarked  # the chat template is part of a transformers tokenizer's identity


@pytest.mark.parametrize("kind", tf.TOKENIZER_KINDS)
def test_transforms_pickle_for_worker_processes(kind):
    tokenizer, _ = tf.make_tokenizer(kind)
    transform = TokenizeTransform(tokenizer, eos_id=tf.EOS)
    copy = pickle.loads(pickle.dumps(transform))
    assert copy.describe() == transform.describe()
    records = _records(10, seed=6)
    keys = [(0, 0, i) for i in range(10)]
    for a, b in zip(copy.apply_batch(records, keys), transform.apply_batch(records, keys)):
        assert a["tokens"].tobytes() == b["tokens"].tobytes()


def test_slow_transformers_tokenizers_with_other_merges_do_not_restore(tmp_path):
    base = tf.slow_bpe_tokenizer(tmp_path / "base")
    other = tf.slow_bpe_tokenizer(tmp_path / "other", merges_kept=0.5)
    assert not base.is_fast and base.get_vocab() == other.get_vocab()
    text = tf.texts(1, seed=3)[0]
    assert base.encode(text, add_special_tokens=False) != other.encode(
        text, add_special_tokens=False
    )
    it = iter(zj.Loader(_pipeline(base)))
    next(it)
    state = it.get_state()
    with pytest.raises(zj.StateMismatchError) as info:
        iter(zj.Loader(_pipeline(other))).set_state(state)
    assert info.value.field == "transforms" and "tokenize(transformers:" in str(info.value)
    # The same files elsewhere, the vocabulary listed in another order: the same tokenizer.
    same = iter(zj.Loader(_pipeline(tf.slow_bpe_tokenizer(tmp_path / "copy", reverse_vocab=True))))
    same.set_state(state)
    assert next(same)["tokens"].tobytes() == next(it)["tokens"].tobytes()


SLOW_IDENTITY = """
import sys
sys.path.insert(0, sys.argv[1])
import text_fixtures as tf
from zephon_jax.transforms.tokenizer_adapters import as_text_tokenizer
print(as_text_tokenizer(tf.slow_bpe_tokenizer(sys.argv[2])).identity)
"""


def test_slow_transformers_identity_follows_what_changes_the_output(tmp_path):
    import os
    import subprocess
    import sys

    def identity(tokenizer) -> str:
        return as_text_tokenizer(tokenizer).identity

    base = identity(tf.slow_bpe_tokenizer(tmp_path / "base"))
    used = tf.slow_bpe_tokenizer(tmp_path / "used", reverse_vocab=True)
    for text in tf.texts(20, seed=4):  # fills its caches and sets up its normalizer
        used.encode(text, add_special_tokens=False)
    assert identity(used) == base
    env = dict(os.environ, PYTHONHASHSEED="123")  # another process, other str hashes
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = [sys.executable, "-c", SLOW_IDENTITY, here, str(tmp_path / "elsewhere")]
    out = subprocess.run(script, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == base
    added = tf.slow_bpe_tokenizer(tmp_path / "added")
    added.add_tokens(["quick brown"])
    changed = {
        "merges": tf.slow_bpe_tokenizer(tmp_path / "merges", merges_kept=0.9),
        "added token": added,
        "special token": tf.slow_bpe_tokenizer(tmp_path / "special", eos_token="<|end|>"),
        "init kwarg": tf.slow_bpe_tokenizer(tmp_path / "prefix", add_prefix_space=True),
    }
    identities = {name: identity(tok) for name, tok in changed.items()}
    assert len(set(identities.values()) | {base}) == len(changed) + 1, identities
