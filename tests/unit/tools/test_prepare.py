"""``prepare``: modes, bad records, resume checks, the built-in corpus, progress (in this
process; tests/integration/test_prepare_runs.py runs its worker pool, signals and a full disk)."""

from __future__ import annotations

import dataclasses
import io
import os

import numpy as np
import pytest
from prepare_inputs import store_docs, write_inputs

from zephon_jax.sources.token_store import TokenStoreError
from zephon_jax.tools.prepare import (
    PrepareError,
    PrepareOptions,
    pool_start_method,
    prepare,
)
from zephon_jax.tools.tokenizers import byte_detokenize


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


@pytest.mark.parametrize("loaded", [(), ("tensorstore",), ("jax",), ("jax", "tensorstore")])
def test_the_pool_forks_only_a_process_without_native_threads(monkeypatch, loaded):
    """Forking a process whose TensorStore or jax threads may hold a lock can hang a
    worker (the output store is open when the pool starts): those start a fork server."""
    import sys

    for name in ("jax", "tensorstore"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    for name in loaded:
        monkeypatch.setitem(sys.modules, name, object())
    assert pool_start_method() == ("forkserver" if loaded else "fork")


def test_compression_is_the_stores_and_both_read_the_same_documents(tmp_path):
    """``--compression``: none (default) writes plain tokens that a local reader maps,
    zstd compressed ones read through TensorStore; an unknown name is refused."""
    from zephon_jax.sources.token_store import TokenStore

    inputs, texts = write_inputs(tmp_path)
    plain, packed = str(tmp_path / "plain"), str(tmp_path / "zstd")
    prepare(PrepareOptions(tuple(inputs), plain, workers=0), None)
    prepare(PrepareOptions(tuple(inputs), packed, compression="zstd", workers=0), None)
    assert TokenStore(plain)._s.direct is not None and TokenStore(packed)._s.direct is None
    got = [[byte_detokenize(d) for d in store_docs(out)] for out in (plain, packed)]
    assert got[0] == got[1] == texts
    with pytest.raises(PrepareError, match="--compression 'lz4' is unknown"):
        prepare(PrepareOptions(tuple(inputs), str(tmp_path / "x"), compression="lz4"), None)
