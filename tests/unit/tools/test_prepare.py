"""``prepare``: formats, bad records, workers, interruption and resume, the built-in corpus."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from zephon_jax.sources import ArrayRecordTokens, TokenStore
from zephon_jax.sources.token_store import TokenStoreError
from zephon_jax.tools.prepare import (
    PrepareError,
    PrepareOptions,
    length_percentiles,
    prepare,
)
from zephon_jax.tools.tokenizers import byte_detokenize, byte_tokenize

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # full_disk.py


def write_inputs(tmp_path):
    """A JSONL file with two bad lines, a text file, a Parquet file with a null; expected texts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = []
    with open(tmp_path / "a.jsonl", "w") as f:
        for i in range(40):
            if i == 2:
                f.write('{"text": broken\n')  # line 3: invalid JSON
            elif i == 5:
                f.write(json.dumps({"body": "no text field"}) + "\n")  # line 6
            elif i == 9:
                f.write("\n")  # blank lines are not records
            else:
                text = f"doc {i} " + "é☃" * (i % 13)
                texts.append(text)
                f.write(json.dumps({"text": text, "id": i}) + "\n")
    (tmp_path / "b.txt").write_text("a whole file\nis one document\n")
    texts.append("a whole file\nis one document\n")
    column = [f"row {i} " * (i % 5 + 1) if i != 4 else None for i in range(30)]
    pq.write_table(pa.table({"text": column}), tmp_path / "c.parquet", row_group_size=8)
    texts.extend(t for t in column if t is not None)
    return [str(tmp_path / n) for n in ("a.jsonl", "b.txt", "c.parquet")], texts


def store_docs(path, allow_partial: bool = False) -> list[np.ndarray]:
    store = TokenStore(path, allow_partial=allow_partial)
    return [d["tokens"] for d in store.__getitems__(list(range(len(store))))]


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


def test_text_lines_mode_and_strict(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_bytes(b"first\nsecond\n\nbad \xff byte\nlast")
    out = tmp_path / "out"
    summary = prepare(
        PrepareOptions(inputs=(str(path),), output=str(out), lines=True, workers=0), None
    )
    assert [byte_detokenize(d) for d in store_docs(out)] == ["first", "second", "last"]
    assert summary.bad_records == 1
    with pytest.raises(PrepareError, match=r"lines\.txt:4: not UTF-8.*--strict"):
        prepare(
            PrepareOptions(
                inputs=(str(path),),
                output=str(tmp_path / "strict"),
                lines=True,
                strict=True,
                workers=0,
            ),
            None,
        )


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


def test_resume_refuses_other_options_and_skips_a_complete_job(tmp_path):
    inputs, texts = write_inputs(tmp_path)
    out = str(tmp_path / "out")
    prepare(PrepareOptions(tuple(inputs), out, workers=0), None)
    again = prepare(PrepareOptions(tuple(inputs), out, workers=0), None)
    assert again.complete and again.resumed and again.documents == len(texts)
    with pytest.raises(PrepareError, match="different 'append_eos'"):
        prepare(PrepareOptions(tuple(inputs), out, append_eos=True, workers=0), None)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("not ours")
    with pytest.raises(PrepareError, match="--overwrite"):
        prepare(PrepareOptions(tuple(inputs), str(tmp_path / "other"), workers=0), None)


def test_tokenizer_ids_must_fit_dtype(tmp_path, monkeypatch):
    path = tmp_path / "t.txt"
    path.write_text("hello")
    (tmp_path / "bigtok.py").write_text("def encode(text):\n    return [70000] * len(text)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PrepareError, match="do not fit dtype uint16"):
        prepare(
            PrepareOptions(
                (str(path),),
                str(tmp_path / "o"),
                tokenizer="bigtok:encode",
                dtype="uint16",
                workers=0,
            ),
            None,
        )


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


def test_builtin_corpus_is_cached_and_split_in_two(tmp_path):
    from zephon_jax.tools.corpus import builtin_corpus, stdlib_files

    lib = builtin_corpus("library", cache_dir=tmp_path, max_files=12, workers=0)
    tests = builtin_corpus("tests", cache_dir=tmp_path, max_files=12, workers=0)
    files = stdlib_files("library", 12)
    assert len(lib) <= 12 and len(tests) <= 12 and lib.dtype == np.uint16
    nonempty = [f for f in files if f.stat().st_size]
    assert byte_detokenize(lib[0]["tokens"]) == nonempty[0].read_text(encoding="utf-8")
    assert all("test" in str(f) for f in stdlib_files("tests", 12))
    before = os.path.getmtime(lib.path / "meta.json")
    again = builtin_corpus("library", cache_dir=tmp_path, max_files=12)
    assert os.path.getmtime(again.path / "meta.json") == before
    assert again.fingerprint() == lib.fingerprint()


# ----- a full disk ----------------------------------------------------------------------


def write_random_text(path, num_docs: int, seed: int) -> None:
    """JSONL of documents of random characters (they compress little)."""
    rng = np.random.default_rng(seed)
    alphabet = np.array(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,"))
    with open(path, "w") as f:
        for n in rng.integers(100, 1500, num_docs):
            f.write(json.dumps({"text": "".join(rng.choice(alphabet, int(n)))}) + "\n")


def files_of(directory) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("to", ["store", "both"])
def test_disk_full_fails_clearly_and_a_rerun_with_room_is_identical(tmp_path, to):
    """`prepare` onto a real filesystem that fills up (a 320 KB tmpfs; mounted as root, or
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
        "--small=320k",
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


def test_strict_commits_and_counts_the_documents_before_the_bad_record(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_bytes(b"first\nsecond\n\nbad \xff byte\nlast")
    out = str(tmp_path / "strict")
    opts = PrepareOptions((str(path),), out, lines=True, strict=True, workers=0)
    with pytest.raises(PrepareError, match=r"lines\.txt:4: not UTF-8.*the 2 documents before it"):
        prepare(opts, None)
    with pytest.raises(TokenStoreError, match="incomplete"):  # stopped: not a finished store
        store_docs(out)
    assert [byte_detokenize(d) for d in store_docs(out, allow_partial=True)] == ["first", "second"]
    # Resumed without --strict, the job continues at the bad record and skips it.
    summary = prepare(dataclasses.replace(opts, strict=False), None)
    assert summary.resumed and summary.bad_records == 1
    assert [byte_detokenize(d) for d in store_docs(out)] == ["first", "second", "last"]


def test_strict_on_the_first_record_says_no_document_came_before(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "one"}\n' + '{"body": "x"}\n' * 2)
    opts = PrepareOptions((str(path),), str(tmp_path / "o"), strict=True, workers=0)
    with pytest.raises(PrepareError, match=r"a\.jsonl:2: .*the 1 document before it is committed"):
        prepare(opts, None)


EOS_TOKENIZERS = """
class Tok:
    eos_token_id = 7

    def encode(self, text):
        return [ord(c) for c in text]


encode = Tok().encode


def plain(text):
    return [ord(c) for c in text]
"""


def test_append_eos_uses_the_tokenizer_eos_or_eos_id(tmp_path, monkeypatch):
    (tmp_path / "eostok.py").write_text(EOS_TOKENIZERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "t.txt"
    path.write_text("hi")

    def run(name, **kw):
        opts = PrepareOptions((str(path),), str(tmp_path / name), append_eos=True, workers=0, **kw)
        prepare(opts, None)
        return store_docs(tmp_path / name)[0].tolist()

    assert run("bytes") == [ord("h") + 2, ord("i") + 2, 1]
    assert run("bytes_257", eos_id=257) == [ord("h") + 2, ord("i") + 2, 257]
    assert run("hf_like", tokenizer="eostok:encode") == [104, 105, 7]
    assert run("given", tokenizer="eostok:plain", eos_id=3) == [104, 105, 3]
    with pytest.raises(PrepareError, match=r"eostok:plain does not say.*--eos-id ID"):
        run("unknown", tokenizer="eostok:plain")
    assert not (tmp_path / "unknown").exists()  # refused before writing anything
    with pytest.raises(PrepareError, match="does not fit dtype uint16"):
        run("too_big", eos_id=70000)
    with pytest.raises(PrepareError, match="add --append-eos"):
        prepare(PrepareOptions((str(path),), str(tmp_path / "x"), eos_id=3, workers=0), None)
    # A resume with another id is refused, like any other changed option.
    with pytest.raises(PrepareError, match="different 'eos_id'"):
        run("bytes", eos_id=257)


def test_a_directory_notes_the_files_it_skips(tmp_path):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.jsonl").write_text('{"text": "one"}\n')
    (data / "sub" / "notes.log").write_text("a log")
    (data / "b.csv").write_text("x,y")
    (data / ".hidden").write_text("never an input")
    stream = io.StringIO()
    summary = prepare(PrepareOptions((str(data),), str(tmp_path / "o"), workers=0), stream)
    assert summary.documents == 1
    (note,) = [line for line in stream.getvalue().splitlines() if line.startswith("note:")]
    assert note.startswith("note: skipped 2 files of the input directories for their extension")
    assert str(data / "sub" / "notes.log") in note and str(data / "b.csv") in note
    assert ".hidden" not in note and "name other files, or a glob, to read them" in note
    # Named directly, such a file is read as text.
    named = prepare(PrepareOptions((str(data / "b.csv"),), str(tmp_path / "n"), workers=0), None)
    assert named.documents == 1


def test_prepare_writes_its_records_with_the_umask_mode(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("hello")
    old = os.umask(0o022)
    try:
        prepare(PrepareOptions((str(path),), str(tmp_path / "o"), workers=0), None)
    finally:
        os.umask(old)
    for name in ("meta.json", "prepare.json"):
        assert (tmp_path / "o" / name).stat().st_mode & 0o777 == 0o644, name


def test_bad_records_not_listed_are_summarized_without_and_more(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "ok"}\n' + '{"body": 1}\n' * 3 + "[1]\n")
    stream = io.StringIO()
    opts = PrepareOptions((str(path),), str(tmp_path / "o"), workers=0, max_reported_bad=0)
    prepare(opts, stream)
    err = stream.getvalue()
    assert "more" not in err
    assert "skipped 4 bad records: 3 no 'text' field, 1 expected a JSON object" in err


def test_progress_off_a_terminal_is_whole_lines(tmp_path):
    inputs, _ = write_inputs(tmp_path)
    stream = io.StringIO()
    prepare(PrepareOptions(tuple(inputs), str(tmp_path / "o"), workers=0, chunk_records=2), stream)
    err = stream.getvalue()
    assert "\r" not in err and err.endswith("\n")
    progress = [line for line in err.splitlines() if line.startswith("prepare ")]
    assert len(progress) == 1 and "100.0%" in progress[0]  # a short job: its last line only


def test_status_line_rewrites_in_place_on_a_terminal_and_logs_lines_elsewhere(monkeypatch):
    from zephon_jax.core.status_line import StatusLine

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty = Terminal()
    line = StatusLine(tty, interval=0.0)
    line.show("a long first line")
    line.show("short")
    line.note("a note")
    line.done()
    assert tty.getvalue() == ("\ra long first line\rshort            \ra note           \n")
    log = io.StringIO()
    line = StatusLine(log, log_interval=0.0)
    line.show("one")
    line.note("a note")
    line.show("two")
    line.done()
    assert log.getvalue() == "one\na note\ntwo\n"
    line = StatusLine(log := io.StringIO(), log_interval=3600)
    line.show("too soon")
    line.show("forced", force=True)
    assert log.getvalue() == "forced\n"
