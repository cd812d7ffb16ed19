"""``prepare --engine beam`` (DirectRunner) writes the local engine's TokenStore, byte for byte."""

from __future__ import annotations

import hashlib
import json
import os

import fsspec
import pytest
from object_stores import S3_BUCKET, s3_server, upload_tree

from zephon_jax.sources import JsonlSource, TokenStore
from zephon_jax.tools.cli import main
from zephon_jax.tools.prepare import PrepareOptions, expand_inputs, prepare
from zephon_jax.tools.prepare_beam import prepare_beam

pytest.importorskip("apache_beam")

STORE_FILES = ("meta.json", "tokens/", "offsets/")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Over 1M byte tokens (two stored shards of the tokens array), bad and blank lines."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("beam_corpus")
    for k in range(3):
        with open(d / f"part-{k}.jsonl", "w") as f:
            for i in range(1400):
                f.write(json.dumps({"text": f"{k}:{i} " + "lorem ipsum " * (i % 41)}) + "\n")
                if i % 500 == 7:
                    f.write("{broken\n\n")
    pq.write_table(
        pa.table({"text": [f"row {i} " * (i % 23) for i in range(900)]}),
        d / "rows.parquet",
        row_group_size=200,
    )
    JsonlSource(d)  # leaves index sidecars in the input directory
    assert any(p.name.endswith(".zjidx") for p in d.iterdir())
    assert not [f for f in expand_inputs([str(d / "*")]) if f.endswith(".zjidx")]
    return d


def store_digests(fs, root):
    out = {}
    for path in fs.find(root):
        rel = path[len(root.rstrip("/")) + 1 :]
        if rel.startswith(STORE_FILES):
            out[rel] = hashlib.sha256(fs.cat_file(path)).hexdigest()
    return out


@pytest.fixture(scope="module")
def local_engine(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "out"
    summary = prepare(PrepareOptions((str(corpus),), str(out), workers=0), None)
    assert summary.tokens > 1 << 20 and summary.bad_records == 9
    digests = store_digests(fsspec.filesystem("file"), str(out))
    assert {"tokens/c/0", "tokens/c/1"} <= set(digests)
    return digests, summary


def test_beam_one_worker_from_the_cli_equals_local(corpus, local_engine, tmp_path, capsys):
    out = tmp_path / "beam"
    args = ["prepare", str(corpus), "-o", str(out), "--engine", "beam", "--num-workers", "1"]
    assert main([*args, "--", "--direct_running_mode=in_memory"]) == 0
    assert store_digests(fsspec.filesystem("file"), str(out)) == local_engine[0]
    assert TokenStore(out).num_docs == local_engine[1].documents
    captured = capsys.readouterr()
    assert "load it" in captured.out and "invalid JSON" in captured.err
    assert not (out / "_beam_tmp").exists()


def test_beam_two_workers_from_s3_to_s3_equals_local(corpus, local_engine):
    with s3_server():
        upload_tree(corpus, f"s3://{S3_BUCKET}/in")
        out = f"s3://{S3_BUCKET}/out"
        opts = PrepareOptions((f"s3://{S3_BUCKET}/in",), out)
        prepare_beam(opts, num_workers=2, unit_bytes=150_000, stream=None)
        fs = fsspec.filesystem("s3")
        fs.invalidate_cache()
        assert store_digests(fs, f"{S3_BUCKET}/out") == local_engine[0]
        assert len(TokenStore(out)) == local_engine[1].documents
        assert os.environ["AWS_EC2_METADATA_DISABLED"] == "true"
