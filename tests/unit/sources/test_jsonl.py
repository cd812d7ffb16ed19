"""JSON Lines as a random-access source: the byte-offset index (lines and their ends),
its sidecar, batched reads in any order, pickling, and a fingerprint of the content."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest

from zephon_jax.sources import jsonl as jsonl_module
from zephon_jax.sources.jsonl import JsonlSource, build_index, load_or_build_index

DATA = b'{"a": 1}\n\n{"a": 22}\n  \n{"a": 3}'  # no newline at the end


def test_build_index_gives_line_starts_and_ends_without_blank_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(DATA)
    spans = build_index(str(path))
    # lines at bytes 0..8, 10..19 and 23..31 (the last one without a newline)
    assert spans.tolist() == [[0, 10, 23], [8, 19, 31]]
    empty = tmp_path / "e.jsonl"
    empty.write_bytes(b"\n \n")
    assert build_index(str(empty)).shape == (2, 0)


def test_load_or_build_index_writes_a_sidecar_and_reads_it_back(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(DATA)
    spans, built = load_or_build_index(str(path))
    assert built and spans.tolist() == [[0, 10, 23], [8, 19, 31]]
    sidecar = tmp_path / "d.jsonl.zjidx"
    header = json.loads(sidecar.read_bytes().partition(b"\n")[0])
    assert header["records"] == 3 and header["size"] == len(DATA)
    again, built = load_or_build_index(str(path))
    assert not built and again.tolist() == spans.tolist()
    sidecar.write_bytes(b"garbage")  # an unreadable sidecar is rebuilt
    again, built = load_or_build_index(str(path))
    assert built and again.tolist() == spans.tolist()


def test_getitems_in_any_order_with_repeats_and_range_checks(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(DATA)
    (tmp_path / "b.jsonl").write_text('{"b": 0}\n{"b": 1}\n')
    src = JsonlSource(tmp_path, progress=False)
    assert len(src) == 5 and repr(src) == "JsonlSource(2 files, 5 records)"
    assert src.__getitems__([4, 0, 4, 2]) == [{"b": 1}, {"a": 1}, {"b": 1}, {"a": 3}]
    assert src[3] == {"b": 0} and src.__getitems__([]) == []
    with pytest.raises(IndexError, match="index 5 out of range: valid indices are 0..4"):
        src[5]
    with pytest.raises(IndexError, match="index -1 out of range"):
        src.__getitems__([0, -1])


def test_separate_runs_of_lines_read_the_same(tmp_path, monkeypatch):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(20)))
    src = JsonlSource(path, progress=False)
    want = [{"i": i} for i in (19, 3, 4, 11)]
    assert src.__getitems__([19, 3, 4, 11]) == want
    monkeypatch.setattr(jsonl_module, "COALESCE_BYTES", 0)  # every line its own read
    assert src.__getitems__([19, 3, 4, 11]) == want


def test_pickles_and_fingerprint_ignores_the_directory(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    (one / "d.jsonl").write_bytes(DATA)
    src = JsonlSource(one, progress=False)
    copy = pickle.loads(pickle.dumps(src))
    assert copy.__getitems__([0, 1, 2]) == [{"a": 1}, {"a": 22}, {"a": 3}]
    shutil.copytree(one, two)
    assert JsonlSource(two, progress=False).fingerprint() == src.fingerprint()
    assert src.fingerprint().startswith("jsonl-1-3-")
    (two / "d.jsonl").write_bytes(DATA + b"\n{}")
    assert JsonlSource(two, progress=False).fingerprint() != src.fingerprint()
