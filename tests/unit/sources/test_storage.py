"""Storage: URL parsing (``split_url``, ``is_url``, ``join``), the retry budget
(``RetryPolicy``'s checks, its ``ZEPHON_JAX_STORAGE_RETRY`` form, the backoff schedule,
``retry_call``'s retries and errors, which errors are transient) and a local ``Location``."""

from __future__ import annotations

import errno
import os

import pytest

from zephon_jax.sources import storage
from zephon_jax.sources.storage import (
    RETRY_ENV,
    Location,
    RetryPolicy,
    ShortReadError,
    StorageError,
    backoff,
    is_no_space,
    is_transient,
    is_url,
    join,
    retry_call,
    retry_policy,
    set_retry_policy,
    split_url,
)


@pytest.mark.parametrize(
    "path, parts",
    [
        ("data/a.jsonl", (None, "data/a.jsonl")),
        ("/abs/x", (None, "/abs/x")),
        ("file:///abs/x", (None, "/abs/x")),
        ("s3://bucket/key/x", ("s3", "bucket/key/x")),
        ("gs://b/k", ("gs", "b/k")),
        ("GCS://b/k", ("gs", "b/k")),
    ],
)
def test_split_url(path, parts):
    assert split_url(path) == parts
    assert is_url(path) is (parts[0] is not None)


def test_unsupported_schemes_are_refused():
    with pytest.raises(StorageError, match=r"unsupported URL scheme 'http' in 'http://x/y'"):
        split_url("http://x/y")
    with pytest.raises(StorageError, match="must be a str or os.PathLike"):
        split_url(b"bytes")


def test_join_local_paths_and_urls():
    assert join("s3://b/dir/", "a", "b.json") == "s3://b/dir/a/b.json"
    assert join("gs://b", "x") == "gs://b/x"
    assert join("dir", "a", "b") == os.path.join("dir", "a", "b")


def test_retry_policy_defaults_and_checks():
    policy = RetryPolicy()
    assert (policy.attempts, policy.seconds, policy.timeout) == (6, 6.0, 10.0)
    for bad in (
        {"attempts": 0},
        {"attempts": True},
        {"attempts": 2.0},
        {"seconds": -1},
        {"timeout": 0},
        {"max_delay": float("inf")},
    ):
        with pytest.raises(StorageError, match=r"RetryPolicy\.\w+ must be"):
            RetryPolicy(**bad)


def test_retry_policy_env_form_round_trips():
    policy = RetryPolicy(attempts=3, seconds=1.5, timeout=2.0, initial_delay=0.0, max_delay=4.0)
    text = policy.to_env()
    assert text == "attempts=3,seconds=1.5,timeout=2.0,delay=0.0,max_delay=4.0"
    assert RetryPolicy.from_env(text) == policy
    assert RetryPolicy.from_env(" attempts=10 , seconds=60,") == RetryPolicy(
        attempts=10, seconds=60.0
    )
    assert RetryPolicy.from_env("") == RetryPolicy()


@pytest.mark.parametrize(
    "text, match",
    [
        ("attempts", "cannot read 'attempts'; write comma-separated KEY=VALUE"),
        ("tries=3", "cannot read 'tries=3'"),
        ("attempts=three", "attempts must be a number, got 'three'"),
        ("attempts=1.5", "attempts must be a number"),
        ("timeout=0", r"RetryPolicy\.timeout must be a finite number of seconds > 0"),
    ],
)
def test_retry_policy_env_errors_name_the_variable(text, match):
    with pytest.raises(StorageError, match=match) as caught:
        RetryPolicy.from_env(text)
    assert str(caught.value).startswith(f"{RETRY_ENV}={text!r}")


def test_retry_policy_follows_the_environment(monkeypatch):
    monkeypatch.delenv(RETRY_ENV, raising=False)
    assert retry_policy() == RetryPolicy()
    monkeypatch.setenv(RETRY_ENV, "attempts=2")
    assert retry_policy() == RetryPolicy(attempts=2)
    previous = set_retry_policy(seconds=9)
    assert previous == RetryPolicy(attempts=2)
    assert retry_policy() == RetryPolicy(attempts=2, seconds=9.0)
    assert RetryPolicy.from_env(os.environ[RETRY_ENV]) == RetryPolicy(attempts=2, seconds=9.0)


@pytest.mark.parametrize("jitter, factor", [(0.0, 0.5), (1.0, 1.0)])
def test_backoff_doubles_from_the_initial_delay_up_to_the_cap(monkeypatch, jitter, factor):
    monkeypatch.setattr(storage.random, "random", lambda: jitter)
    policy = RetryPolicy(initial_delay=0.1, max_delay=1.0)
    waits = [backoff(policy, retry) for retry in range(1, 7)]
    assert waits == pytest.approx([factor * d for d in (0.1, 0.2, 0.4, 0.8, 1.0, 1.0)])


@pytest.mark.parametrize(
    "error, transient",
    [
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (ShortReadError("short"), True),
        (OSError(errno.EBUSY, "SlowDown"), True),
        (RuntimeError("HTTP 503 from server"), True),
        (ValueError("UNAVAILABLE: try later"), True),
        (FileNotFoundError("x"), False),
        (PermissionError("x"), False),
        (OSError(errno.ENOENT, "gone"), False),
        (OSError(errno.ENOSPC, "No space left on device"), False),
        (ValueError("bad value"), False),
        (StorageError("unsupported"), False),
    ],
)
def test_is_transient(error, transient):
    assert is_transient(error) is transient


def test_transient_causes_and_full_disks_are_found_in_the_chain():
    outer = RuntimeError("wrapped")
    outer.__cause__ = ConnectionResetError()
    assert is_transient(outer)
    full = RuntimeError("write failed")
    full.__cause__ = OSError(errno.EDQUOT, "quota")
    assert is_no_space(full) and not is_no_space(RuntimeError("x")) and not is_no_space(None)


NO_WAIT = RetryPolicy(attempts=4, seconds=60, initial_delay=0.0, max_delay=0.0)


def _failing(errors, result="ok"):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return result

    return fn, calls


def test_retry_call_retries_transient_errors_within_the_budget():
    fn, calls = _failing([ConnectionResetError(), TimeoutError()])
    assert retry_call(fn, "s3://b/k", policy=NO_WAIT) == "ok"
    assert len(calls) == 3


def test_retry_call_stops_after_the_attempts_naming_the_fix():
    fn, calls = _failing([ConnectionResetError()] * 10)
    with pytest.raises(StorageError, match=r"reading s3://b/k failed after 4 attempts") as caught:
        retry_call(fn, "s3://b/k", policy=NO_WAIT)
    assert len(calls) == 4
    assert f"{RETRY_ENV}='attempts=10,seconds=60'" in str(caught.value)
    assert isinstance(caught.value.__cause__, ConnectionResetError)


def test_retry_call_stops_when_no_time_is_left_for_another_try():
    fn, calls = _failing([ConnectionResetError()] * 10)
    policy = RetryPolicy(attempts=10, seconds=0.05, initial_delay=1.0, max_delay=1.0)
    with pytest.raises(StorageError, match="failed after 1 attempt in"):
        retry_call(fn, "gs://b/k", policy=policy)
    assert len(calls) == 1


def test_retry_call_raises_permanent_errors_at_once():
    fn, calls = _failing([FileNotFoundError("404")])
    with pytest.raises(FileNotFoundError, match=r"listing gs://b/k: not found"):
        retry_call(fn, "gs://b/k", "listing", policy=NO_WAIT)
    fn, calls = _failing([PermissionError("denied")])
    with pytest.raises(StorageError, match=r"reading s3://b/k failed: PermissionError"):
        retry_call(fn, "s3://b/k", policy=NO_WAIT)
    assert len(calls) == 1
    fn, _ = _failing([OSError(errno.ENOSPC, "No space left on device")])
    with pytest.raises(StorageError, match="no space left on device") as caught:
        retry_call(fn, "/d/x", "writing", policy=NO_WAIT)
    assert caught.value.errno == errno.ENOSPC


def test_a_local_location_reads_writes_lists_and_deletes(tmp_path):
    where = Location(tmp_path / "store")
    assert repr(where) == f"Location({str(tmp_path / 'store')!r})"
    assert not where.exists() and where.names() == set() and where.read("a") is None
    where.write("a", b"one")
    where.write("a", b"two")  # replaced
    where.write("b", b"")
    assert where.exists() and where.names() == {"a", "b"}
    assert where.read("a") == b"two" and where.read("b") == b""
    assert where.child("a") == str(tmp_path / "store" / "a")
    assert not where.is_file() and Location(tmp_path / "store" / "a").is_file()
    where.delete_all()
    assert not where.exists()
    where.mkdir()
    assert where.exists() and where.names() == set()


def test_locations_of_urls_are_not_local():
    where = Location("s3://bucket/prefix")
    assert where.local is None and where.scheme == "s3"
    assert not where.is_file()
    assert where.child("x") == "s3://bucket/prefix/x"
    assert Location("file:///tmp/x").local is not None
