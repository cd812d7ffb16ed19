"""E2 for a language-model pipeline: tokenize + tokenize_chat + mix + split + pack +
to_training, on 1, 2 and 4 processes, across resumes, and with loader workers; and
``loss_mask`` cut and packed with its tokens."""

from __future__ import annotations

import numpy as np
import pytest
import text_fixtures as tf
from pipelines import assert_batches_equal, resume_across, run_topology, take

import zephon_jax as zj

STEPS = 24
SEQ_LEN = 24


def llm_pipeline() -> zj.BatchedDataset:
    text = (
        zj.Dataset.source([{"text": t} for t in tf.texts(300, seed=10)])
        .tokenize(tf.bpe_tokenizer(), eos_id=tf.EOS)
        .map(tf.with_full_loss_mask)
    )
    chat = zj.Dataset.source([{"messages": m} for m in tf.conversations(200, seed=11)])
    chat = chat.tokenize_chat(tf.hf_tokenizer(tf.MARKED_TEMPLATE))
    return (
        zj.Dataset.mix([text, chat], [0.5, 0.5])
        .shuffle(seed=3)
        .split(SEQ_LEN)
        .pack(SEQ_LEN, method="best_fit", num_bins=4)
        .window_shuffle(3, seed=4)
        .to_training(pad_id=tf.PAD)
        .batch(8)
    )


@pytest.fixture(scope="module")
def reference():
    ds = llm_pipeline()
    return ds, take(iter(zj.Loader(ds)), STEPS)


def test_batches_are_training_ready_and_nontrivial(reference):
    _, batches = reference
    first = batches[0]
    assert list(first) == ["inputs", "targets", "loss_mask", "segment_ids", "positions"]
    assert all(first[k].shape == (8, SEQ_LEN) for k in first)
    assert [first[k].dtype for k in first] == [np.int32] * 2 + [np.float32] + [np.int32] * 2
    mask = np.stack([b["loss_mask"] for b in batches])
    inside = np.stack([b["segment_ids"][:, :-1] == b["segment_ids"][:, 1:] for b in batches])
    inside &= np.stack([b["segment_ids"][:, :-1] != 0 for b in batches])
    # Chat prompts are masked out inside segments; plain text is trained on everywhere.
    assert 0.4 < mask.mean() < 0.95 and (mask[..., :-1][inside] == 0).any()
    assert np.array_equal(
        np.stack([b["targets"][:, :-1] for b in batches])[inside],
        np.stack([b["inputs"][:, 1:] for b in batches])[inside],
    )
    assert len({b["inputs"].tobytes() for b in batches}) == STEPS


@pytest.mark.parametrize("process_count", [2, 4])
def test_processes_concatenate_to_the_single_process_batch(reference, process_count):
    ds, expected = reference
    assert_batches_equal(run_topology(ds, process_count, STEPS), expected)


@pytest.mark.parametrize(("save_at", "save_procs", "restore_procs"), [(5, 1, 4), (11, 4, 2)])
def test_resume_on_another_topology(reference, save_at, save_procs, restore_procs):
    ds, expected = reference
    resumed = resume_across(ds, STEPS, save_at, save_procs, restore_procs)
    assert_batches_equal(resumed, expected[save_at:])


def test_loader_workers_give_the_same_batches(reference):
    ds, expected = reference
    loader = zj.Loader(llm_pipeline(), num_workers=1)
    it = iter(loader)
    try:
        assert_batches_equal(take(it, STEPS), expected)
    finally:
        it.close()


# ----- loss_mask travels with its tokens through split, pack and concat ---------------


def _conversation_records() -> tuple[list[dict], list[dict]]:
    records = [{"messages": m} for m in tf.conversations(60, seed=12)]
    chat = zj.Dataset.source(records).tokenize_chat(tf.hf_tokenizer(tf.MARKED_TEMPLATE))
    transform = chat._sampler.transforms[0]
    return records, transform.apply_batch(records, [(0, 0, i) for i in range(len(records))])


def test_concat_packing_keeps_every_tokens_loss_mask_in_order():
    records, tokenized = _conversation_records()
    ds = (
        zj.Dataset.source(records)
        .repeat(1)
        .tokenize_chat(tf.hf_tokenizer(tf.MARKED_TEMPLATE))
        .split(7)
        .pack(16, method="concat")
        .batch(1)
    )
    rows = list(zj.Loader(ds))
    keep = np.concatenate([r["tokens_segment_ids"][0] for r in rows]) > 0
    tokens = np.concatenate([r["tokens"][0] for r in rows])[keep]
    mask = np.concatenate([r["loss_mask"][0] for r in rows])[keep]
    assert tokens.tobytes() == np.concatenate([t["tokens"] for t in tokenized]).tobytes()
    assert mask.tobytes() == np.concatenate([t["loss_mask"] for t in tokenized]).tobytes()
    assert 0 < mask.mean() < 1


def test_bin_packing_keeps_each_pieces_loss_mask_with_its_tokens():
    records, tokenized = _conversation_records()
    ds = (
        zj.Dataset.source(records)
        .shuffle(seed=1)
        .tokenize_chat(tf.hf_tokenizer(tf.MARKED_TEMPLATE))
        .split(10)
        .pack(16, method="best_fit", num_bins=3)
        .window_shuffle(4, seed=2)
        .batch(4)
    )
    # Every packed segment is a piece j (tokens [10j, 10j+10)) of some conversation.
    pieces = {
        t["tokens"][s : s + 10].tobytes(): t["loss_mask"][s : s + 10].tobytes()
        for t in tokenized
        for s in range(0, len(t["tokens"]), 10)
    }
    seen = 0
    for batch in take(iter(zj.Loader(ds)), 30):
        for r in range(4):
            segments = batch["tokens_segment_ids"][r]
            for s in range(1, segments.max() + 1):
                where = segments == s
                piece = batch["tokens"][r][where].tobytes()
                assert pieces[piece] == batch["loss_mask"][r][where].tobytes()
                seen += 1
            assert not batch["loss_mask"][r][segments == 0].any()
    assert seen > 100


# ----- with a staged, token-weighted mixture and a batch-size ramp ---------------------


def staged_pipeline() -> zj.BatchedDataset:
    """The pipeline above, mixed by tokens with a stage change at step 6 and a batch
    ramp from 4 to 8 rows at step 9."""
    text = (
        zj.Dataset.source([{"text": t} for t in tf.texts(300, seed=10)])
        .tokenize(tf.bpe_tokenizer(), eos_id=tf.EOS)
        .map(tf.with_full_loss_mask)
    )
    chat = zj.Dataset.source([{"messages": m} for m in tf.conversations(200, seed=11)])
    chat = chat.tokenize_chat(tf.hf_tokenizer(tf.MARKED_TEMPLATE))
    return (
        zj.Dataset.mix([text, chat], {0: [0.7, 0.3], 6: [0.2, 0.8]}, unit="tokens")
        .shuffle(seed=3)
        .split(SEQ_LEN)
        .pack(SEQ_LEN, num_bins=4)
        .window_shuffle(3, seed=4)
        .to_training()
        .batch({0: 4, 9: 8}, num_lanes=4)
    )


def test_staged_token_mixture_with_a_ramp_on_every_topology_and_resume():
    ds = staged_pipeline()
    steps = 16
    expected = take(iter(zj.Loader(ds)), steps)
    assert [b["inputs"].shape[0] for b in expected] == [4] * 9 + [8] * 7
    for process_count in (2, 4):
        assert_batches_equal(run_topology(ds, process_count, steps), expected)
    # Inside the first stage, across the stage change, across the ramp.
    for save_at, save_procs, restore_procs in [(3, 2, 4), (7, 1, 4), (10, 4, 2)]:
        resumed = resume_across(ds, steps, save_at, save_procs, restore_procs)
        assert_batches_equal(resumed, expected[save_at:])
