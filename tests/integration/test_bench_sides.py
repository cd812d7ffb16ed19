"""The benchmark's Grain sides make what they claim: the same output as the other sides."""

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import corpus  # noqa: E402
import documented_pipelines as documented  # noqa: E402
import restore_probe  # noqa: E402
import tokenize_bench  # noqa: E402

import zephon_jax as zj  # noqa: E402


def test_grain_batched_encode_gives_the_batches_of_its_per_record_map():
    texts = tokenize_bench.make_lognormal_texts(300, seed=2)
    tokenizer = tokenize_bench.train_tokenizers(texts[:200], ("tokenizers",), vocab_size=400)[
        "tokenizers"
    ]
    records = [{"text": t} for t in texts]
    batched = tokenize_bench.grain_batched_pipeline(records, tokenizer, 256, 4, encode_batch=3)
    one_by_one = tokenize_bench.grain_pipeline(records, tokenizer, 256, 4, read_threads=0)
    for _ in range(30):  # many encode batches of 3 records
        a, b = next(batched), next(one_by_one)
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_record_weights_give_the_token_shares_in_expectation():
    stores = [
        SimpleNamespace(num_tokens=1000, num_docs=10),
        SimpleNamespace(num_tokens=50, num_docs=5),
    ]
    weights = documented.record_weights(stores, [0.7, 0.3])
    assert sum(weights) == pytest.approx(1.0)
    tokens = [w * s.num_tokens / s.num_docs for w, s in zip(weights, stores)]
    assert tokens[0] / sum(tokens) == pytest.approx(0.7)


def test_the_grain_llm_side_shifts_rows_as_to_training_does(tmp_path):
    docs = corpus.make_lognormal_corpus(300, mean_len=60, seed=0)
    other = corpus.make_corpus(300, max_len=64, seed=1)
    stores = documented.write_stores([docs, other], str(tmp_path))
    grain_batch = next(iter(documented.llm_grain(stores, 64, 4)))
    zephon_batch = next(iter(zj.Loader(documented.llm_zephon(stores, 64, 4))))
    assert grain_batch.keys() == zephon_batch.keys()
    for key in grain_batch:
        assert grain_batch[key].dtype == zephon_batch[key].dtype
        assert grain_batch[key].shape == zephon_batch[key].shape == (4, 64)
    seg, inputs, targets = (grain_batch[k] for k in ("segment_ids", "inputs", "targets"))
    same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, :-1] > 0)
    np.testing.assert_array_equal(targets[:, :-1][same], inputs[:, 1:][same])
    assert (targets[:, :-1][~same] == 0).all()


def test_the_restore_digest_sees_values_dtypes_and_fields():
    batch = {"tokens": np.arange(6, dtype=np.int32).reshape(2, 3)}
    digest = restore_probe.batch_digest(batch)
    assert digest == restore_probe.batch_digest({"tokens": batch["tokens"].copy()})
    changed = batch["tokens"].copy()
    changed[1, 2] = 9
    assert digest != restore_probe.batch_digest({"tokens": changed})
    assert digest != restore_probe.batch_digest({"tokens": batch["tokens"].astype(np.int64)})
    assert digest != restore_probe.batch_digest({"inputs": batch["tokens"]})
