"""``ArrayRecordTokens``: records are raw little-endian token ids of the given dtype, read
from ``.array_record`` files or a ``prepare`` output (its ``prepare.json``), incomplete
outputs refused unless ``allow_partial``."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordWriter

from zephon_jax.errors import PipelineError
from zephon_jax.sources.array_record import ARRAY_RECORD_DIR, MANIFEST, ArrayRecordTokens

DOCS = [[1, 2, 3], [70000], [], [5, 6]]


def _write(path, docs, dtype="<u4"):
    writer = ArrayRecordWriter(str(path), "group_size:1")
    for doc in docs:
        writer.write(np.asarray(doc, dtype).tobytes())
    writer.close()


def _prepared(root, shards, complete=True):
    (root / ARRAY_RECORD_DIR).mkdir(parents=True)
    for i, docs in enumerate(shards):
        _write(root / ARRAY_RECORD_DIR / f"part-{i:05d}.array_record", docs)
    manifest = {
        "complete": complete,
        "committed": {"shards": len(shards)},
        "job": {"dtype": "uint32"},
    }
    (root / MANIFEST).write_text(json.dumps(manifest))
    return root


def test_records_are_the_token_ids_written(tmp_path):
    path = tmp_path / "a.array_record"
    _write(path, DOCS)
    source = ArrayRecordTokens(str(path), dtype="uint32")
    assert len(source) == 4
    assert source[1]["tokens"].tolist() == [70000]
    assert source[0]["tokens"].dtype == np.uint32
    got = source.__getitems__([3, 0, 2])
    assert [r["tokens"].tolist() for r in got] == [[5, 6], [1, 2, 3], []]
    assert source.lengths().tolist() == [3, 1, 0, 2]


def test_big_endian_dtype_names_read_little_endian(tmp_path):
    path = tmp_path / "a.array_record"
    _write(path, [[1, 258]], dtype="<u2")
    source = ArrayRecordTokens([str(path)], dtype=">u2")
    assert source[0]["tokens"].tolist() == [1, 258]


def test_a_prepare_output_reads_its_committed_shards_in_order(tmp_path):
    root = _prepared(tmp_path / "out", [DOCS[:2], DOCS[2:]])
    source = ArrayRecordTokens(root)
    assert source.dtype == np.dtype("<u4")
    assert [source[i]["tokens"].tolist() for i in range(len(source))] == DOCS
    assert repr(source) == "ArrayRecordTokens(2 files, dtype=uint32)"


def test_an_incomplete_prepare_output_is_refused_unless_partial(tmp_path):
    root = _prepared(tmp_path / "out", [DOCS], complete=False)
    with pytest.raises(
        PipelineError, match="incomplete `zephon-jax prepare` output.*allow_partial"
    ):
        ArrayRecordTokens(root)
    assert len(ArrayRecordTokens(root, allow_partial=True)) == 4


def test_files_need_a_dtype(tmp_path):
    with pytest.raises(PipelineError, match="needs dtype= when given files"):
        ArrayRecordTokens(str(tmp_path / "a.array_record"))


def test_fingerprint_and_pickling(tmp_path):
    a, b = tmp_path / "a.array_record", tmp_path / "b.array_record"
    _write(a, DOCS)
    _write(b, DOCS[:3])
    source = ArrayRecordTokens([str(a)], dtype="uint32")
    assert source.fingerprint().startswith("ar-4-uint32-1:")
    assert source.fingerprint() != ArrayRecordTokens([str(b)], dtype="uint32").fingerprint()
    assert source.fingerprint() != ArrayRecordTokens([str(a)], dtype="uint16").fingerprint()
    again = pickle.loads(pickle.dumps(source))
    assert again.dtype == source.dtype and again[0]["tokens"].tolist() == [1, 2, 3]
