"""Object stores: s3:// on moto's server and gs:// on fake-gcs-server, both on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
from object_stores import GCS_BUCKET, S3_BUCKET, gcs_server, s3_server, upload_tree
from pipelines import assert_batches_equal, kernels_set, resume_across, run_topology

import zephon_jax as zj
from zephon_jax.engine.column_sources import StoreTokens
from zephon_jax.engine.lane import LanePlan
from zephon_jax.sources import (
    JsonlSource,
    ParquetSource,
    StorageError,
    TokenStore,
    TokenStoreError,
    write_token_store,
)
from zephon_jax.sources.storage import RetryPolicy, retry_call
from zephon_jax.tools.prepare import PrepareError, PrepareOptions, prepare

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small local corpus: two JSONL files and a Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("corpus")
    texts = []
    for k in range(2):
        with open(d / f"part-{k}.jsonl", "w") as f:
            for i in range(60):
                text = f"shard {k} doc {i} " + "abc" * (i % 17)
                f.write(json.dumps({"text": text, "i": i}) + "\n")
                texts.append(text)
    ptexts = [f"parquet row {i} " + "q" * (i % 9) for i in range(50)]
    pq.write_table(pa.table({"text": ptexts}), d / "table.parquet", row_group_size=16)
    return d, texts, ptexts


@pytest.fixture(scope="module")
def s3(corpus):
    with s3_server() as endpoint:
        upload_tree(corpus[0], f"s3://{S3_BUCKET}/corpus")
        yield endpoint


def to_tokens(record):
    return {"tokens": np.frombuffer(record["text"].encode(), dtype=np.uint8).astype(np.int32)}


def pipeline(jsonl, parquet, store):
    a = zj.Dataset.source(jsonl).map(to_tokens)
    b = zj.Dataset.source(parquet).map(to_tokens)
    c = zj.Dataset.source(store)
    return (
        zj.Dataset.mix([a, b, c], [0.5, 0.3, 0.2])
        .shuffle(seed=11)
        .split(64)
        .pack(64, method="first_fit", num_bins=3)
        .batch(6)
    )


def test_unsupported_schemes_raise_and_create_no_local_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("a document")
    for url in ("az://c/x", "hf://datasets/x", "http://host/x"):
        with pytest.raises(StorageError, match="unsupported URL scheme"):
            write_token_store(url, [[1, 2]])
        with pytest.raises(PrepareError, match="unsupported URL scheme"):
            prepare(PrepareOptions(("in.txt",), url, workers=0), None)
    assert [p.name for p in tmp_path.iterdir()] == ["in.txt"]


def test_retries_are_bounded_and_logged(caplog):
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("Connection reset by peer")
        return "ok"

    with caplog.at_level(logging.WARNING, logger="zephon_jax.storage"):
        assert retry_call(flaky, "s3://b/k", policy=RetryPolicy(initial_delay=0.001)) == "ok"
    assert len(calls) == 3 and len(caplog.records) == 2
    assert "s3://b/k" in caplog.records[0].getMessage() and "retry 1 of" in caplog.text

    def down():
        raise TimeoutError("timed out")

    with pytest.raises(StorageError, match=r"s3://b/k failed after 3 attempts in"):
        retry_call(down, "s3://b/k", policy=RetryPolicy(attempts=3, initial_delay=0.001))
    denied = []

    def forbidden():
        denied.append(1)
        raise PermissionError("Access Denied")

    with pytest.raises(StorageError, match="s3://b/k"):
        retry_call(forbidden, "s3://b/k", policy=RetryPolicy(initial_delay=0.001))
    assert len(denied) == 1  # a permanent error is not retried


def test_s3_sources_and_store_match_local_across_processes_and_resume(s3, corpus, tmp_path):
    d, texts, ptexts = corpus
    docs = [to_tokens({"text": t})["tokens"] for t in texts[:40]]
    local_store = write_token_store(tmp_path / "store", docs, dtype="int32")
    url = f"s3://{S3_BUCKET}/store"
    s3_store = write_token_store(url, docs, dtype="int32")
    assert not os.path.exists("s3:") and s3_store.fingerprint() == local_store.fingerprint()
    local = pipeline(JsonlSource(d), ParquetSource(d, columns=["text"]), local_store)
    remote_jsonl = JsonlSource(f"s3://{S3_BUCKET}/corpus/*.jsonl")
    remote_parquet = ParquetSource(f"s3://{S3_BUCKET}/corpus", columns=["text"])
    remote = pipeline(remote_jsonl, remote_parquet, TokenStore(url))
    assert remote.fingerprint() == local.fingerprint()  # the same data, wherever it is
    want = run_topology(local, 1, 8)
    assert_batches_equal(run_topology(remote, 1, 8), want)
    assert_batches_equal(run_topology(remote, 3, 8), want)
    assert_batches_equal(resume_across(remote, 8, 3, 2, 3), want[3:])
    # a state taken on local files restores on the copy in the bucket
    it = iter(zj.Loader(local))
    for _ in range(4):
        next(it)
    moved = iter(zj.Loader(remote))
    moved.set_state(it.get_state())
    assert_batches_equal([next(moved) for _ in range(4)], want[4:])


def test_s3_errors_name_the_url_and_storage_options_override_the_environment(
    s3, corpus, monkeypatch
):
    with pytest.raises(TokenStoreError, match=f"s3://{S3_BUCKET}/missing/meta.json"):
        TokenStore(f"s3://{S3_BUCKET}/missing")
    with pytest.raises(FileNotFoundError, match=f"s3://{S3_BUCKET}/corpus/nope.jsonl"):
        JsonlSource(f"s3://{S3_BUCKET}/corpus/nope.jsonl")
    for var in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    import fsspec

    fsspec.filesystem("s3").clear_instance_cache()
    options = {"endpoint_url": s3, "key": "testing", "secret": "testing"}
    url = f"s3://{S3_BUCKET}/explicit"
    store = write_token_store(url, [[1, 2, 3], [4]], storage_options=options)
    assert TokenStore(url, storage_options=options)[1]["tokens"].tolist() == [4]
    src = JsonlSource(f"s3://{S3_BUCKET}/corpus/part-1.jsonl", storage_options=options)
    assert src[0]["text"] == corpus[1][60]
    assert len(store) == 2


def test_prepare_reads_and_writes_s3_like_local(s3, corpus, tmp_path):
    d = corpus[0]
    local = prepare(PrepareOptions((str(d),), str(tmp_path / "out"), workers=0), None)
    out = f"s3://{S3_BUCKET}/prepared"
    remote = prepare(
        PrepareOptions((f"s3://{S3_BUCKET}/corpus",), out, workers=0, commit_every=1), None
    )
    assert (remote.documents, remote.tokens) == (local.documents, local.tokens)
    assert local.documents == 170
    a, b = TokenStore(tmp_path / "out"), TokenStore(out)
    assert np.array_equal(a.offsets, b.offsets)
    assert [x["tokens"].tobytes() for x in a.__getitems__(range(len(a)))] == [
        x["tokens"].tobytes() for x in b.__getitems__(range(len(b)))
    ]
    again = prepare(PrepareOptions((f"s3://{S3_BUCKET}/corpus",), out, workers=0), None)
    assert again.complete and again.documents == 170
    with pytest.raises(PrepareError, match="local output directory"):
        prepare(PrepareOptions((str(d),), f"s3://{S3_BUCKET}/ar", to="both", workers=0), None)


def test_gcs_sources_and_store(corpus):
    d, texts, ptexts = corpus
    with gcs_server():
        upload_tree(d, f"gs://{GCS_BUCKET}/corpus")
        src = JsonlSource(f"gs://{GCS_BUCKET}/corpus")
        assert len(src) == 120 and [r["text"] for r in src.__getitems__([0, 119])] == [
            texts[0],
            texts[119],
        ]
        table = ParquetSource(f"gs://{GCS_BUCKET}/corpus/table.parquet")
        assert table.__getitems__([49, 0, 17]) == [{"text": ptexts[i]} for i in (49, 0, 17)]
        docs = [np.arange(n, dtype=np.uint16) for n in range(30)]
        store = write_token_store(f"gs://{GCS_BUCKET}/store", docs, dtype="uint16")
        got = TokenStore(f"gs://{GCS_BUCKET}/store").__getitems__([29, 3, 3])
        assert [g["tokens"].tolist() for g in got] == [list(range(29)), [0, 1, 2], [0, 1, 2]]
        assert len(store) == 30


def test_s3_store_read_column_wise_equals_the_general_path(s3, tmp_path):
    """A TokenStore in a bucket takes the column path: each block's documents in one
    batched read; the batches are the per-record path's over the same store."""
    rng = np.random.default_rng(4)
    docs = [rng.integers(1, 500, int(rng.integers(0, 150))) for _ in range(80)]
    url = f"s3://{S3_BUCKET}/column-store"
    write_token_store(url, docs, dtype="int32")

    def run(steps: int) -> tuple:
        ds = zj.Dataset.source(TokenStore(url)).shuffle(seed=2).split(64).pack(64)
        ds = ds.to_training().batch(6)
        return LanePlan(ds).columnar, run_topology(ds, 1, steps)

    columnar, got = run(10)
    assert columnar is not None and isinstance(columnar.reader, StoreTokens)
    with kernels_set(False):
        columnar, want = run(10)
    assert columnar is None
    assert_batches_equal(got, want)
