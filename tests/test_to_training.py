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
