"""Object-store faults: one retry budget per read, and exact data or a clear error.

Reads go to moto's S3 server through a fault-injecting proxy (``fault_proxy.py``), both
on 127.0.0.1: throttling, slow answers, connection resets, truncated and short bodies,
and an outage (nothing listening).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from fault_proxy import FaultProxy, closed_port, timed
from object_stores import S3_BUCKET, patched_env, s3_server, upload_tree

import zephon_jax as zj
from zephon_jax.sources import (
    JsonlSource,
    ParquetSource,
    RetryPolicy,
    StorageError,
    TokenStore,
    set_retry_policy,
    write_token_store,
)
from zephon_jax.sources.storage import RETRY_ENV, retry_call, retry_policy

SLACK_S = 3.0  # process and thread scheduling on a busy machine
KINDS = ("tokens", "jsonl", "parquet")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Local copies: a TokenStore, two JSONL files and a Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("faults")
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 50_000, size=int(n), dtype=np.int32) for n in rng.integers(1, 90, 40)]
    write_token_store(d / "store", docs, dtype="int32")
    files = d / "files"
    files.mkdir()
    for k in range(2):
        with open(files / f"part-{k}.jsonl", "w") as f:
            for i in range(60):
                f.write(json.dumps({"text": f"file {k} line {i} " + "xyz" * (i % 13), "i": i}))
                f.write("\n")
    texts = [f"row {i} " + "p" * (i % 11) for i in range(50)]
    pq.write_table(pa.table({"text": texts}), files / "table.parquet", row_group_size=8)
    return d


@pytest.fixture(scope="module")
def s3(data, tmp_path_factory):
    cache = tmp_path_factory.mktemp("index-cache")
    with s3_server() as endpoint, patched_env({"ZEPHON_JAX_CACHE": str(cache)}):
        upload_tree(data / "store", f"s3://{S3_BUCKET}/faults/store")
        upload_tree(data / "files", f"s3://{S3_BUCKET}/faults/files")
        JsonlSource(f"s3://{S3_BUCKET}/faults/files/*.jsonl")  # writes the index sidecars
        yield endpoint


@pytest.fixture
def policy(monkeypatch):
    """Sets a retry policy for one test (the environment variable is restored after it)."""
    monkeypatch.delenv(RETRY_ENV, raising=False)

    def set_policy(**fields):
        set_retry_policy(RetryPolicy(**fields))
        return retry_policy()

    return set_policy


def open_source(kind: str, where: str, endpoint: str | None = None):
    """The source ``kind`` on the local copy (``where`` a directory) or on S3 via ``endpoint``."""
    options = None if endpoint is None else {"endpoint_url": endpoint}
    if kind == "tokens":
        return TokenStore(os.path.join(where, "store"), storage_options=options)
    if kind == "jsonl":
        return JsonlSource(os.path.join(where, "files", "*.jsonl"), storage_options=options)
    return ParquetSource(os.path.join(where, "files", "table.parquet"), storage_options=options)


def remote(kind: str, endpoint: str):
    return open_source(kind, f"s3://{S3_BUCKET}/faults", endpoint)


def as_bytes(kind: str, records: list) -> list[bytes]:
    """Each record's content as bytes, for an exact comparison."""
    if kind == "tokens":
        return [r["tokens"].dtype.str.encode() + r["tokens"].tobytes() for r in records]
    return [json.dumps(r, sort_keys=True).encode() for r in records]


def to_tokens(record):
    if "tokens" in record:
        return record
    return {"tokens": np.frombuffer(record["text"].encode(), dtype=np.uint8).astype(np.int32)}


def batches(source, steps: int = 3) -> list:
    ds = zj.Dataset.source(source).map(to_tokens).split(48).pack(48, method="first_fit", num_bins=2)
    it = iter(zj.Loader(ds.batch(4)))
    return [next(it) for _ in range(steps)]


def assert_same_data(kind: str, got_source, want_source) -> None:
    """Every record byte for byte, and the first batches of a packed pipeline."""
    n = len(want_source)
    assert len(got_source) == n
    order = list(range(n - 1, -1, -1))  # every record, in an order that spans all reads
    assert as_bytes(kind, got_source.__getitems__(order)) == as_bytes(
        kind, want_source.__getitems__(order)
    )
    for got, want in zip(batches(got_source), batches(want_source)):
        assert sorted(got) == sorted(want)
        for name in want:
            assert (
                got[name].dtype == want[name].dtype and got[name].tobytes() == want[name].tobytes()
            )


def fresh(kind: str, endpoint: str):
    """A source on S3 through ``endpoint``, opened (its open reads not counted as faults)."""
    import fsspec

    fsspec.filesystem("s3").clear_instance_cache()
    return remote(kind, endpoint)


# ----- the policy ----------------------------------------------------------------------------


def test_policy_from_the_environment_and_the_function(monkeypatch):
    monkeypatch.delenv(RETRY_ENV, raising=False)
    assert retry_policy() == RetryPolicy()
    monkeypatch.setenv(RETRY_ENV, "attempts=3, seconds=1.5")
    assert retry_policy() == RetryPolicy(attempts=3, seconds=1.5)
    previous = set_retry_policy(timeout=4)
    assert previous == RetryPolicy(attempts=3, seconds=1.5)
    assert retry_policy() == RetryPolicy(attempts=3, seconds=1.5, timeout=4.0)
    assert RetryPolicy.from_env(os.environ[RETRY_ENV]) == retry_policy()  # workers inherit it
    for bad, match in (
        ("attempts=0", "attempts must be an int >= 1"),
        ("tries=3", "keys among"),
        ("seconds=soon", "seconds must be a number"),
        ("timeout=0", "timeout must be a finite number of seconds > 0"),
        ("seconds=inf", "finite"),
    ):
        monkeypatch.setenv(RETRY_ENV, bad)
        with pytest.raises(StorageError, match=match) as info:
            retry_policy()
        assert RETRY_ENV in str(info.value)


def test_attempts_and_time_bound_every_read(policy):
    calls = []

    def down():
        calls.append(1)
        raise ConnectionResetError("Connection reset by peer")

    policy(attempts=3, seconds=30, initial_delay=0.01)
    with pytest.raises(StorageError, match=r"s3://b/k failed after 3 attempts in"):
        retry_call(down, "s3://b/k")
    assert len(calls) == 3
    calls.clear()
    policy(attempts=1000, seconds=0.5, initial_delay=0.01, max_delay=0.05)
    error, spent = timed(lambda: retry_call(down, "s3://b/k"))
    assert isinstance(error, StorageError) and spent < 0.5 + 0.5
    assert 5 < len(calls) < 1000


# ----- an outage -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_an_outage_is_reported_within_the_budget(s3, kind, policy):
    """Nothing listening: the error comes within the budget, naming the URL, tries and fix."""
    dead = f"http://127.0.0.1:{closed_port()}"
    for fields in ({}, {"attempts": 20, "seconds": 2.0}):
        # No retry starts after the budget's seconds, so the error comes within them plus
        # the last try: one try alone, timed now, says what a try costs on this machine.
        policy(attempts=1)
        one_try = timed(lambda: fresh(kind, dead))[1]
        budget = policy(**fields)
        error, spent = timed(lambda: fresh(kind, dead))
        assert isinstance(error, StorageError), repr(error)
        assert spent < budget.seconds + 2 * one_try + SLACK_S, (fields, spent, one_try)
        text = str(error)
        assert f"s3://{S3_BUCKET}/faults/" in text
        assert re.search(r"failed after \d+ attempts? in \d+\.\d s", text), text
        assert f"retry budget: {budget.attempts} attempts" in text
        assert "Check the credentials, the endpoint" in text and RETRY_ENV in text


def test_a_stopped_server_is_reported_within_the_budget(s3, policy):
    """A proxy that stops while a store is open: the next read fails within the budget."""
    budget = policy(attempts=50, seconds=1.5)
    with FaultProxy(s3) as proxy:
        store = fresh("tokens", proxy.url)
    error, spent = timed(lambda: store.__getitems__([0, 39]))
    assert isinstance(error, StorageError) and spent < budget.seconds + SLACK_S
    assert f"s3://{S3_BUCKET}/faults/store/tokens" in str(error)


# ----- faults the store recovers from, and faults that exhaust the budget -------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fault", ["slowdown", "reset", "truncate", "short", "delay"])
def test_a_few_faults_give_exact_data(s3, data, kind, fault, policy):
    """A few faults: the reads are retried and give exactly the local records and batches."""
    policy(attempts=8, seconds=20, timeout=3)
    local = open_source(kind, str(data))
    with FaultProxy(s3, delay_s=1.0) as proxy:
        source = fresh(kind, proxy.url)
        proxy.arm(fault, 3)
        assert_same_data(kind, source, local)
        # every fault was met and survived (slow answers need no retry: fewer requests)
        assert proxy.faults_sent == 3 or (fault == "delay" and proxy.faults_sent > 0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fault", ["slowdown", "reset", "truncate", "short"])
def test_persistent_faults_raise_within_the_budget(s3, kind, fault, policy):
    """Faults on every request: a clear error within the budget, never data."""
    budget = policy(attempts=4, seconds=3)
    with FaultProxy(s3) as proxy:
        source = fresh(kind, proxy.url)
        proxy.arm(fault, 1000)
        n = len(source)
        error, spent = timed(lambda: source.__getitems__(range(n)))
    if kind == "tokens" and fault == "short":
        # a lying server: the shard's checksum or the decoder rejects the bytes at once
        assert isinstance(error, StorageError) and "failed" in str(error), repr(error)
    else:
        assert isinstance(error, StorageError), repr(error)
        assert re.search(r"failed after \d+ attempts? in ", str(error)), str(error)
        assert f"s3://{S3_BUCKET}/faults/" in str(error)
    assert spent < budget.seconds + SLACK_S


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_answers_slower_than_the_timeout_fail_each_try(s3, kind, policy):
    budget = policy(attempts=3, seconds=2, timeout=1)
    with FaultProxy(s3) as proxy:
        source = fresh(kind, proxy.url)
        proxy.arm("delay", 1000, delay_s=5)
        n = len(source)
        error, spent = timed(lambda: source.__getitems__(range(n)))
    assert isinstance(error, StorageError), repr(error)
    assert "timeout" in str(error).lower() or "timed out" in str(error).lower()
    assert spent < budget.seconds + budget.timeout + SLACK_S


def test_a_token_store_abandons_answers_slower_than_the_timeout(s3, tmp_path):
    """TensorStore takes the timeout when a process first uses it: a fresh process."""
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
        from fault_proxy import FaultProxy, timed
        from zephon_jax.sources import StorageError, TokenStore
        with FaultProxy({s3!r}) as proxy:
            store = TokenStore("s3://{S3_BUCKET}/faults/store",
                               storage_options={{"endpoint_url": proxy.url}})
            proxy.arm("delay", 1000, delay_s=6)
            error, spent = timed(lambda: store.__getitems__(range(len(store))))
        assert isinstance(error, StorageError), repr(error)
        print(round(spent, 2), error)
        """
    )
    env = {**os.environ, RETRY_ENV: "attempts=3,seconds=2,timeout=1"}
    env.pop("TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS", None)
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    spent = float(out.stdout.split()[0])
    assert spent < 2 + 1 + SLACK_S, out.stdout
    assert re.search(r"failed after \d+ attempts? in ", out.stdout), out.stdout
