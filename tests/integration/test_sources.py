"""Real sources in pipelines: TokenStore and Grain's ArrayRecordDataSource."""

from __future__ import annotations

import numpy as np
from pipelines import assert_batches_equal, make_docs, resume_across, run_topology, take

import zephon_jax as zj
from zephon_jax.sources import write_token_store


def parse_record(raw: bytes) -> dict:
    return {"tokens": np.frombuffer(raw, dtype=np.int32).copy()}


def test_token_store_pipeline_is_identical_across_topologies(tmp_path):
    docs = make_docs(300, 120, seed=3)
    store = write_token_store(tmp_path / "store", [d["tokens"] for d in docs], dtype="int32")
    ds = zj.Dataset.source(store).shuffle(4).split(64).pack(64).batch(8)
    expected = take(iter(zj.Loader(ds)), 20)
    assert_batches_equal(run_topology(ds, 4, 20), expected)
    assert_batches_equal(resume_across(ds, 20, 6, save_procs=2, restore_procs=8), expected[6:])
    # The same pipeline over the same documents held in memory gives the same batches.
    in_memory = zj.Dataset.source(docs).shuffle(4).split(64).pack(64).batch(8)
    fields = ("tokens_segment_ids", "tokens_positions")
    for a, b in zip(take(iter(zj.Loader(in_memory)), 20), expected):
        assert all(np.array_equal(a[f], b[f]) for f in fields)
        np.testing.assert_array_equal(a["tokens"], b["tokens"])


def test_array_record_source_plugs_in(tmp_path):
    import grain
    from array_record.python.array_record_module import ArrayRecordWriter

    docs = make_docs(100, 50, seed=8)
    path = str(tmp_path / "docs.array_record")
    writer = ArrayRecordWriter(path, "group_size:1")
    for d in docs:
        writer.write(d["tokens"].tobytes())
    writer.close()
    source = grain.sources.ArrayRecordDataSource([path])
    ds = zj.Dataset.source(source).shuffle(1).map(parse_record).pack(64, method="concat").batch(4)
    expected = take(iter(zj.Loader(ds)), 12)
    assert_batches_equal(run_topology(ds, 2, 12), expected)
    assert_batches_equal(resume_across(ds, 12, 5, save_procs=4, restore_procs=1), expected[5:])
    # concat packing leaves no padding.
    assert all((b["tokens_segment_ids"] > 0).all() for b in expected)
