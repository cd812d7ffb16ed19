"""``Dataset.to_training``: shifted targets, loss mask, segments and positions of packed rows."""

from __future__ import annotations

import numpy as np
import pytest
import text_fixtures as tf

import zephon_jax as zj
from zephon_jax.transforms.to_training import ToTrainingTransform

FIELDS = ["inputs", "targets", "loss_mask", "segment_ids", "positions"]


def reference(row: dict, pad_id: int) -> dict:
    """The rules, one position at a time."""
    tokens, seg = row["tokens"], row["tokens_segment_ids"]
    mask = row.get("loss_mask")
    n = len(tokens)
    targets = np.full(n, pad_id, np.int32)
    loss = np.zeros(n, np.float32)
    for t in range(n):
        same = t + 1 < n and seg[t + 1] == seg[t] and seg[t] != 0
        if same:
            targets[t] = tokens[t + 1]
        if same and (mask is None or mask[t + 1] == 1):
            loss[t] = 1.0
    return {
        "inputs": tokens.astype(np.int32),
        "targets": targets,
        "loss_mask": loss,
        "segment_ids": seg.astype(np.int32),
        "positions": row["tokens_positions"].astype(np.int32),
    }


def tokens_mod_three(record: dict) -> dict:
    tokens = record["tokens"]
    return {"tokens": tokens, "loss_mask": (tokens % 3 != 0).astype(np.int32)}


def packed_pipeline(method: str, with_mask: bool, epochs: int | None = None) -> zj.Dataset:
    texts = [{"text": t} for t in tf.texts(300, seed=1, hi=12)]
    ds = zj.Dataset.source(texts).shuffle(2).repeat(epochs)
    ds = ds.tokenize(tf.char_codes, eos_id=tf.EOS)
    if with_mask:
        ds = ds.map(tokens_mod_three)
    ds = ds.split(40)
    if method == "concat":
        return ds.pack(40, method="concat")
    return ds.pack(40, method=method, num_bins=3)


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("method", ["best_fit", "first_fit", "concat"])
@pytest.mark.parametrize("pad_id", [0, 7])
def test_rows_follow_the_rules_position_by_position(method, with_mask, pad_id):
    packed = list(zj.Loader(packed_pipeline(method, with_mask, 1).batch(4)))
    trained = list(zj.Loader(packed_pipeline(method, with_mask, 1).to_training(pad_id).batch(4)))
    assert len(packed) == len(trained) > 5
    padding = 0
    for p, t in zip(packed, trained):
        assert list(t) == FIELDS
        for r in range(4):
            row = {k: v[r] for k, v in p.items()}
            want = reference(row, pad_id)
            for k in FIELDS:
                assert t[k].dtype == want[k].dtype, k
                assert t[k][r].tobytes() == want[k].tobytes(), (k, r)
        padding += int((p["tokens_segment_ids"] == 0).sum())
        assert t["loss_mask"].dtype == np.float32
    assert padding > 0  # also the last, partly filled row of concat packing


def test_loss_mask_follows_the_next_token_of_each_segment():
    row = {
        "tokens": np.array([5, 6, 7, 8, 9, 10, 0, 0], np.int32),
        "tokens_segment_ids": np.array([1, 1, 1, 2, 2, 2, 0, 0], np.int32),
        "tokens_positions": np.array([0, 1, 2, 0, 1, 2, 0, 0], np.int32),
        "loss_mask": np.array([0, 0, 1, 0, 1, 1, 0, 0], np.int32),
    }
    out = ToTrainingTransform(pad_id=-1).apply(row, (0, 1, 0))
    assert out["inputs"].tolist() == [5, 6, 7, 8, 9, 10, 0, 0]
    assert out["targets"].tolist() == [6, 7, -1, 9, 10, -1, -1, -1]
    assert out["loss_mask"].tolist() == [0, 1, 0, 1, 1, 0, 0, 0]
    assert out["segment_ids"].tolist() == [1, 1, 1, 2, 2, 2, 0, 0]
    assert out["positions"].tolist() == [0, 1, 2, 0, 1, 2, 0, 0]
    maxtext = ToTrainingTransform(pad_id=-1, field_names="maxtext").apply(row, (0, 1, 0))
    assert list(maxtext) == [
        "inputs",
        "inputs_segmentation",
        "inputs_position",
        "targets",
        "targets_segmentation",
        "targets_position",
    ]
    assert all(v.dtype == np.int32 for v in maxtext.values())
    assert maxtext["inputs_segmentation"].tolist() == [1, 1, 1, 2, 2, 2, 0, 0]
    assert maxtext["targets_segmentation"].tolist() == [0, 1, 0, 2, 2, 0, 0, 0]
    assert maxtext["targets_position"].tolist() == maxtext["inputs_position"].tolist()
    assert maxtext["targets"].tolist() == out["targets"].tolist()


def test_after_a_window_shuffle_of_packed_rows():
    base = packed_pipeline("best_fit", True).window_shuffle(5, seed=3)
    packed = zj.Loader(base.batch(4))
    trained = zj.Loader(base.to_training().batch(4))
    for p, t, _ in zip(packed, trained, range(10)):
        for r in range(4):
            want = reference({k: v[r] for k, v in p.items()}, 0)
            assert all(t[k][r].tobytes() == want[k].tobytes() for k in FIELDS)


def test_rows_that_are_not_packed_are_a_clear_error():
    docs = zj.Dataset.source([{"tokens": np.arange(1, 9, dtype=np.int32)}] * 4)
    with pytest.raises(zj.PipelineError, match=r"needs packed rows.*add \.pack\(seq_len\) before"):
        docs.to_training()
    with pytest.raises(
        zj.PipelineError, match=r"has split\(max_len=4, key='tokens'\) -> window_shuffle"
    ):
        docs.split(4).window_shuffle(2, seed=0).to_training()

    class Passthrough:
        def init(self):
            return 0

        def step(self, carry, record):
            return carry, [record]

        def flush(self, carry):
            return carry, []

    rows = docs.apply(Passthrough()).to_training().batch(2)
    with pytest.raises(zj.PipelineError, match=r"got fields \['tokens'\], without"):
        next(iter(zj.Loader(rows)))
    with pytest.raises(zj.PipelineError, match="field_names"):
        docs.split(4).pack(4).to_training(field_names="t5")


MAXTEXT_FIELDS = [
    "inputs",
    "inputs_segmentation",
    "inputs_position",
    "targets",
    "targets_segmentation",
    "targets_position",
]


def shift_data_reference(row: dict, pad_id: int) -> dict:
    """MaxText's Grain pipeline on a packed row, from its documented steps.

    Its packed ``targets`` column holds the token where it is trained on,
    ``pad_id`` on a masked prompt token and 0 on padding (Grain pads packed rows
    with 0); ``ShiftData(ignored_ids=[pad_id])`` moves ``targets`` one to the
    left (filling ``pad_id``) and ``targets_segmentation`` one to the left
    (filling 0), then sets ``targets_segmentation`` to 0 where the target is
    ``pad_id``. The other fields are the packed ones.
    """
    tokens, seg, pos = row["tokens"], row["tokens_segment_ids"], row["tokens_positions"]
    mask = row.get("loss_mask")
    n = len(tokens)
    column = []
    for t in range(n):
        if seg[t] == 0:
            column.append(0)
        elif mask is not None and mask[t] != 1:
            column.append(pad_id)
        else:
            column.append(int(tokens[t]))
    targets = column[1:] + [pad_id]
    weights = [int(s) for s in seg[1:]] + [0]
    weights = [0 if targets[t] == pad_id else weights[t] for t in range(n)]
    return {
        "inputs": tokens.astype(np.int32),
        "inputs_segmentation": seg.astype(np.int32),
        "inputs_position": pos.astype(np.int32),
        "targets": np.array(targets, np.int32),
        "targets_segmentation": np.array(weights, np.int32),
        "targets_position": pos.astype(np.int32),
    }


def random_packed_row(rng: np.random.Generator, with_mask: bool) -> dict:
    """A packed row: random pieces (tokens -1 to 5, so pad ids occur inside them), padding."""
    seq_len = int(rng.integers(2, 30))
    tokens, seg, pos, mask = [], [], [], []
    segment = 0
    while len(tokens) < seq_len and rng.random() < 0.85:
        length = int(rng.integers(1, seq_len - len(tokens) + 1))
        segment += 1
        tokens += rng.integers(-1, 6, length).tolist()
        seg += [segment] * length
        pos += list(range(length))
        mask += (rng.random(length) < 0.6).astype(int).tolist()
    pad = seq_len - len(tokens)
    row = {
        "tokens": np.array(tokens + [0] * pad, np.int32),
        "tokens_segment_ids": np.array(seg + [0] * pad, np.int32),
        "tokens_positions": np.array(pos + [0] * pad, np.int32),
    }
    if with_mask:
        row["loss_mask"] = np.array(mask + [0] * pad, np.int32)
    return row


@pytest.mark.parametrize("pad_id", [0, 3, -1])
def test_maxtext_convention_is_shift_data_on_random_rows(pad_id):
    rng = np.random.default_rng(100 + pad_id)
    seen = {"padding": 0, "pad_inside": 0, "across": 0, "prompt": 0}
    for i in range(400):
        row = random_packed_row(rng, with_mask=i % 2 == 1)
        want = shift_data_reference(row, pad_id)
        got = ToTrainingTransform(pad_id, "maxtext", "maxtext").apply(row, (0, 0, i))
        assert list(got) == MAXTEXT_FIELDS
        for k in MAXTEXT_FIELDS:
            assert got[k].dtype == np.int32, k
            assert got[k].tobytes() == want[k].tobytes(), (k, row)
        default_names = ToTrainingTransform(pad_id, convention="maxtext").apply(row, (0, 0, i))
        assert list(default_names) == FIELDS
        assert default_names["targets"].tobytes() == want["targets"].tobytes()
        assert default_names["loss_mask"].dtype == np.float32
        assert default_names["loss_mask"].tolist() == (want["targets_segmentation"] != 0).tolist()
        seg, tokens = row["tokens_segment_ids"], row["tokens"]
        seen["padding"] += int((seg == 0).sum())
        seen["pad_inside"] += int(((tokens == pad_id) & (seg != 0)).sum())
        seen["across"] += int(((seg[1:] != seg[:-1]) & (seg[:-1] != 0) & (seg[1:] != 0)).sum())
        seen["prompt"] += int(((row.get("loss_mask", seg) == 0) & (seg != 0)).sum())
    assert min(seen.values()) > 20, seen


def test_maxtext_convention_differs_from_the_default_where_documented():
    row = {
        "tokens": np.array([5, 0, 7, 8, 9, 10, 0, 0], np.int32),
        "tokens_segment_ids": np.array([1, 1, 1, 2, 2, 2, 0, 0], np.int32),
        "tokens_positions": np.array([0, 1, 2, 0, 1, 2, 0, 0], np.int32),
        "loss_mask": np.array([1, 1, 1, 0, 1, 1, 0, 0], np.int32),
    }
    default = ToTrainingTransform(pad_id=0, field_names="maxtext").apply(row, (0, 0, 0))
    maxtext = ToTrainingTransform(0, "maxtext", "maxtext").apply(row, (0, 0, 0))
    # Default: a target inside its own segment, the mask from loss_mask only.
    assert default["targets"].tolist() == [0, 7, 0, 9, 10, 0, 0, 0]
    assert default["targets_segmentation"].tolist() == [1, 1, 0, 2, 2, 0, 0, 0]
    # MaxText: target 0 (= pad_id) is not trained on, 7 -> the masked prompt token 8 is
    # pad_id, 10 -> padding is 0.
    assert maxtext["targets"].tolist() == [0, 7, 0, 9, 10, 0, 0, 0]
    assert maxtext["targets_segmentation"].tolist() == [0, 1, 0, 2, 2, 0, 0, 0]
    row["loss_mask"][3] = 1
    maxtext = ToTrainingTransform(0, "maxtext", "maxtext").apply(row, (0, 0, 0))
    assert maxtext["targets"].tolist() == [0, 7, 8, 9, 10, 0, 0, 0]
    assert maxtext["targets_segmentation"].tolist() == [0, 1, 2, 2, 2, 0, 0, 0]
    masked = ToTrainingTransform(-1, "maxtext", "maxtext").apply(
        {**row, "loss_mask": np.array([1, 1, 1, 0, 1, 1, 0, 0], np.int32)}, (0, 0, 0)
    )
    assert masked["targets"].tolist() == [0, 7, -1, 9, 10, 0, 0, -1]
    assert masked["targets_segmentation"].tolist() == [1, 1, 0, 2, 2, 0, 0, 0]


def chat_rows() -> zj.Dataset:
    """Conversations with assistant-only loss masks, packed."""
    records = [{"messages": m} for m in tf.conversations(80, seed=4)]
    ds = zj.Dataset.source(records).repeat(1).tokenize_chat(tf.hf_tokenizer()).split(48)
    return ds.pack(48, method="first_fit", num_bins=3)


def chat_pipeline(pad_id: int, convention: str) -> zj.BatchedDataset:
    return chat_rows().to_training(pad_id, field_names="maxtext", convention=convention).batch(4)


def test_maxtext_convention_on_chat_rows_through_the_loader():
    packed = list(zj.Loader(chat_rows().batch(4)))
    tokens = np.concatenate([b["tokens"].ravel() for b in packed])
    pad_id = int(np.bincount(tokens[tokens > 0]).argmax())  # a token inside many documents
    trained = list(zj.Loader(chat_pipeline(pad_id, "maxtext")))
    assert len(trained) == len(packed) > 5
    for p, t in zip(packed, trained):
        assert list(t) == MAXTEXT_FIELDS
        for r in range(4):
            want = shift_data_reference({k: v[r] for k, v in p.items()}, pad_id)
            for k in MAXTEXT_FIELDS:
                assert t[k][r].tobytes() == want[k].tobytes(), (k, r)
    default = list(zj.Loader(chat_pipeline(pad_id, "default")))
    assert any(
        a["targets_segmentation"].tobytes() != b["targets_segmentation"].tobytes()
        for a, b in zip(default, trained)
    )


def test_an_unknown_convention_is_a_clear_error():
    docs = zj.Dataset.source([{"tokens": np.arange(1, 9, dtype=np.int32)}] * 4)
    with pytest.raises(zj.PipelineError, match=r"convention='t5'.*one of \('default', 'maxtext'\)"):
        docs.split(4).pack(4).to_training(convention="t5")


def hugging_face_labels(batch: dict) -> np.ndarray:
    """The ``labels`` of a Hugging Face causal LM from ``targets`` and ``loss_mask`` (the docs')."""
    labels = np.full_like(batch["inputs"], -100)
    labels[:, 1:] = np.where(batch["loss_mask"][:, :-1] > 0, batch["targets"][:, :-1], -100)
    return labels


def test_hugging_face_labels_are_what_transformers_packs_for_the_same_documents():
    """transformers' DataCollatorWithFlattening, given each packed piece with its own labels
    (-100 on prompt tokens), gives the same ``labels`` and ``position_ids``; its causal-LM
    loss shifts them (``labels[t + 1]`` scores position ``t``), which gives back
    ``where(loss_mask, targets, -100)``."""
    from transformers import DataCollatorWithFlattening

    collator = DataCollatorWithFlattening(return_tensors="np")
    packed = list(zj.Loader(chat_rows().batch(4)))
    trained = list(zj.Loader(chat_rows().to_training(0).batch(4)))
    for p, t in zip(packed, trained):
        labels = hugging_face_labels(t)
        for r in range(4):
            seg, tokens, mask = (p[f][r] for f in ("tokens_segment_ids", "tokens", "loss_mask"))
            pieces = [
                {
                    "input_ids": tokens[seg == s].tolist(),
                    "labels": np.where(mask[seg == s] == 1, tokens[seg == s], -100).tolist(),
                }
                for s in range(1, int(seg.max()) + 1)
            ]
            want = collator(pieces)
            n = int((seg > 0).sum())
            assert labels[r, :n].tolist() == want["labels"][0].tolist()
            assert (labels[r, n:] == -100).all()
            assert t["positions"][r, :n].tolist() == want["position_ids"][0].tolist()
            shifted = np.append(labels[r, 1:], -100)  # what the loss scores at each position
            expected = np.where(t["loss_mask"][r] > 0, t["targets"][r], -100)
            assert shifted.tolist() == expected.tolist()
