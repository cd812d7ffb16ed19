"""``prepare`` end to end: its worker pool, interruption by a signal and resume, a full disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from prepare_inputs import files_of, store_docs, write_inputs, write_random_text

from zephon_jax.sources import ArrayRecordTokens, TokenStore
from zephon_jax.tools.prepare import PrepareOptions, length_percentiles, prepare
from zephon_jax.tools.tokenizers import byte_detokenize, byte_tokenize

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # full_disk.py


def test_prepare_formats_bad_records_and_both_outputs(tmp_path, capsys):
    inputs, texts = write_inputs(tmp_path)
    out = tmp_path / "out"
    opts = PrepareOptions(
        inputs=tuple(inputs), output=str(out), to="both", chunk_records=6, commit_every=2, workers=2
    )
    summary = prepare(opts)
    err = capsys.readouterr().err
    assert f"{inputs[0]}:3: invalid JSON" in err
    assert f"{inputs[0]}:6: no 'text' field" in err
    assert f"{inputs[2]}: row 4: column 'text' is null" in err
    assert "ETA" in err and "MB/s" in err
    assert (summary.documents, summary.bad_records, summary.complete) == (len(texts), 3, True)
    docs = store_docs(out)
    assert [byte_detokenize(d) for d in docs] == texts
    for doc, text in zip(docs, texts):
        np.testing.assert_array_equal(doc, byte_tokenize(text))
        assert doc.dtype == np.uint16
    assert summary.tokens == sum(len(t.encode()) for t in texts)
    lengths = np.array([len(t.encode()) for t in texts])
    assert summary.length_percentiles == length_percentiles(lengths)
    assert summary.length_percentiles["max"] == lengths.max()
    records = ArrayRecordTokens(out)
    assert len(records) == len(texts)
    for i, doc in enumerate(docs):
        np.testing.assert_array_equal(records[i]["tokens"], doc)
    np.testing.assert_array_equal(records.lengths(), lengths)


def test_output_does_not_depend_on_workers_or_chunking(tmp_path):
    inputs, _ = write_inputs(tmp_path)
    a = prepare(
        PrepareOptions(tuple(inputs), str(tmp_path / "a"), workers=0, chunk_records=100), None
    )
    b = prepare(
        PrepareOptions(tuple(inputs), str(tmp_path / "b"), workers=2, chunk_records=3), None
    )
    assert (a.documents, a.tokens, a.bad_records) == (b.documents, b.tokens, b.bad_records)
    for x, y in zip(store_docs(tmp_path / "a"), store_docs(tmp_path / "b"), strict=True):
        np.testing.assert_array_equal(x, y)


SLOW_TOKENIZER = """
import time

def encode(text):
    time.sleep(0.015)
    return [ord(c) + 1000 for c in text]
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_then_resumed_equals_uninterrupted(tmp_path, sig):
    inputs, texts = write_inputs(tmp_path)
    (tmp_path / "slowtok.py").write_text(SLOW_TOKENIZER)
    common = ["--tokenizer", "slowtok:encode", "--to", "both", "--chunk-records", "2"]
    cmd = [
        sys.executable,
        "-m",
        "zephon_jax.tools.cli",
        "prepare",
        *inputs,
        *common,
        "--commit-every",
        "1",
    ]
    env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "resumed"
    proc = subprocess.Popen([*cmd, "-o", str(out)], cwd=tmp_path, env=env, stderr=subprocess.PIPE)
    manifest = out / "prepare.json"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if json.loads(manifest.read_text())["committed"]["docs"] >= 6:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == (130 if sig == signal.SIGINT else -signal.SIGKILL), err.decode()
    partial = json.loads(manifest.read_text())
    assert not partial["complete"]
    assert 6 <= TokenStore(out, allow_partial=True).num_docs < len(texts)
    with pytest.raises(ValueError, match="incomplete `zephon-jax prepare` output"):
        TokenStore(out)
    if sig == signal.SIGINT:
        assert b"run the same command again to resume" in err
    done = subprocess.run(
        [*cmd, "-o", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "resuming" in done.stderr and "(resumed)" in done.stdout
    # The same job in one uninterrupted run, in this process.
    sys.path.insert(0, str(tmp_path))
    try:
        whole = tmp_path / "whole"
        prepare(
            PrepareOptions(
                tuple(inputs),
                str(whole),
                to="both",
                tokenizer="slowtok:encode",
                workers=0,
                chunk_records=5,
            ),
            None,
        )
    finally:
        sys.path.remove(str(tmp_path))
    a, b = store_docs(out), store_docs(whole)
    assert len(a) == len(b) == len(texts)
    for x, y, text in zip(a, b, texts):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, np.array([ord(c) + 1000 for c in text], dtype=np.uint32))
    ra, rb = ArrayRecordTokens(out), ArrayRecordTokens(whole)
    assert len(ra) == len(rb) == len(texts)
    for i in range(len(texts)):
        np.testing.assert_array_equal(ra[i]["tokens"], rb[i]["tokens"])
    final = json.loads(manifest.read_text())["committed"]
    assert final["bad"] == 3 and final["docs"] == len(texts)


DYING_TOKENIZER = """
import os
import signal

def encode(text):
    flag = os.environ["DIE_ONCE_FLAG"]
    if text.startswith("doc 21 ") and os.path.exists(flag):
        os.remove(flag)
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer would
    return [ord(c) for c in text]
"""


def test_a_dead_worker_fails_clearly_and_a_rerun_is_identical(tmp_path):
    """A tokenizing worker killed mid-job (SIGKILL, as by the out-of-memory killer): the
    job ends at once with an error that says so and keeps what was committed (it used to
    wait forever for the dead worker's chunk); the same command rerun finishes a store
    identical to an uninterrupted run's."""
    inputs, texts = write_inputs(tmp_path)
    (tmp_path / "dyingtok.py").write_text(DYING_TOKENIZER)
    flag = tmp_path / "die-once"
    flag.touch()
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "zephon_jax.tools.cli", "prepare", *inputs, "-o", str(out)]
    cmd += ["--tokenizer", "dyingtok:encode", "--to", "both", "--chunk-records", "3"]
    cmd += ["--commit-every", "1", "--workers", "2"]
    path = str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env = dict(os.environ, PYTHONPATH=path, DIE_ONCE_FLAG=str(flag))
    died = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert died.returncode == 1, died.stderr
    error = died.stderr.strip().splitlines()[-1]
    assert "a tokenizing worker process died" in error
    assert "rerun the same command" in error
    assert not flag.exists()
    committed = json.loads((out / "prepare.json").read_text())["committed"]["docs"]
    assert 0 < committed < len(texts)
    assert len(TokenStore(out, allow_partial=True)) == committed

    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "resuming" in again.stderr
    a = store_docs(out)
    assert len(a) == len(texts)
    for doc, text in zip(a, texts):
        np.testing.assert_array_equal(doc.astype(np.int64), [ord(c) for c in text])
    assert len(ArrayRecordTokens(out)) == len(texts)


@pytest.mark.parametrize("to", ["store", "both"])
def test_disk_full_fails_clearly_and_a_rerun_with_room_is_identical(tmp_path, to):
    """`prepare` onto a real filesystem that fills up (a 900 KB tmpfs; mounted as root, or
    in a user and mount namespace otherwise: tests/full_disk.py): an error naming ENOSPC,
    the output and the fix, fast (no retries); readers refuse the partial output; the same
    command rerun once the filesystem has room finishes a store byte-identical to an
    uninterrupted run's."""
    import shutil

    source = tmp_path / "in.jsonl"
    write_random_text(source, 600, seed=0)
    args = [str(source), "--to", to, "--chunk-records", "50", "--commit-every", "2"]
    driver = [
        sys.executable,
        os.path.join(TESTS, "full_disk.py"),
        str(tmp_path / "mnt"),
        str(tmp_path),
        "--small=900k",
        "--big=64m",
        f"--pythonpath={os.path.dirname(TESTS)}",
        "--",
        *args,
    ]
    if os.geteuid() != 0:  # mounting needs root, or a namespace of one's own
        assert shutil.which("unshare"), "needs root or unshare(1) to mount a small filesystem"
        driver = ["unshare", "--user", "--map-root-user", "--mount", *driver]
    subprocess.run(driver, check=True, timeout=300)
    report = json.loads((tmp_path / "report.json").read_text())
    out = str(tmp_path / "mnt" / "out")

    full = report["full"]
    assert full["returncode"] == 1, full
    error = full["stderr"].strip().splitlines()[-1]
    assert error.startswith(
        f"zephon-jax prepare: no space left on device (ENOSPC) while writing {out}"
    )
    assert "documents committed before it are kept" in error
    assert "rerun the same command" in error
    assert "retry" not in full["stderr"]  # a full disk is not retried as a network error
    partial = tmp_path / "partial"
    record = json.loads((partial / "prepare.json").read_text())
    assert not record["complete"] and record["committed"]["docs"] > 0
    with pytest.raises(ValueError, match="incomplete `zephon-jax prepare` output.*allow_partial"):
        TokenStore(partial)
    if to == "both":
        with pytest.raises(ValueError, match="incomplete `zephon-jax prepare` output.*allow_part"):
            ArrayRecordTokens(partial)
    assert len(TokenStore(partial, allow_partial=True)) == record["committed"]["docs"]

    again = report["again"]
    assert again["returncode"] == 0, again["stderr"]
    assert "resuming" in again["stderr"] and "(resumed)" in again["stdout"]
    whole = tmp_path / "whole"
    prepare(
        PrepareOptions((str(source),), str(whole), to="both", workers=0, chunk_records=100), None
    )
    done = files_of(tmp_path / "done")
    expected = files_of(whole)
    store_files = [n for n in expected if n.split("/")[0] in ("tokens", "offsets", "meta.json")]
    assert store_files and {n: done.get(n) for n in store_files} == {
        n: expected[n] for n in store_files
    }
    if to == "store":
        return
    a, b = ArrayRecordTokens(tmp_path / "done"), ArrayRecordTokens(whole)
    assert len(a) == len(b) == 600
    assert all(np.array_equal(a[i]["tokens"], b[i]["tokens"]) for i in range(len(b)))
