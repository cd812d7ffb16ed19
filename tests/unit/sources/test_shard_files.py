"""Reads of plain local TokenStores straight from their shard files
(zephon_jax.sources.shard_files) against TensorStore's reads of the same arrays."""

import json
import threading

import numpy as np
import pytest
import tensorstore as ts

from zephon_jax.sources import TokenStore, TokenStoreError, write_token_store
from zephon_jax.sources.shard_files import shard_layout

LAYOUT = {"chunk_tokens": 64, "read_chunk_tokens": 16, "flush_tokens": 500}


def tensorstore_tokens(path) -> np.ndarray:
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path / "tokens")}}
    return ts.open(spec, read=True).result().read().result()


def docs_with_zero_runs(seed: int) -> list[np.ndarray]:
    """Random documents and runs of zeros (the fill value) long enough that whole read
    chunks and whole shards are never written."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(1, 60_000, int(rng.integers(0, 90))) for _ in range(300)]
    for at in (7, 150, 299):
        docs[at] = np.zeros(200, np.int64)
    return docs


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    path = tmp_path_factory.mktemp("plain") / "store"
    docs = docs_with_zero_runs(3)
    return write_token_store(path, docs, dtype="uint16", **LAYOUT), path, docs


def test_a_plain_local_store_is_read_from_its_files_and_a_compressed_one_is_not(tmp_path):
    docs = docs_with_zero_runs(0)
    plain = write_token_store(tmp_path / "plain", docs, **LAYOUT)
    packed = write_token_store(tmp_path / "zstd", docs, compression="zstd", **LAYOUT)
    assert plain._s.direct is not None and packed._s.direct is None
    ids = list(range(len(docs)))
    assert plain.read_flat(ids).tobytes() == packed.read_flat(ids).tobytes()


def test_spans_over_unwritten_chunks_and_shards_read_as_the_fill_value(plain):
    store, path, docs = plain
    stream = tensorstore_tokens(path)
    np.testing.assert_array_equal(stream, np.concatenate(docs).astype(np.uint16))
    total = int(store.offsets[-1])
    shards = {int(f.name) for f in (path / "tokens" / "c").iterdir()}
    assert len(shards) < -(-total // 64), "a shard of zeros only is never written"
    rng = np.random.default_rng(1)
    for _ in range(20):
        starts = rng.integers(0, total, int(rng.integers(1, 100)))
        lengths = np.minimum(rng.integers(1, 400, starts.size), total - starts)
        flat, at = store.read_spans(starts, lengths)
        for s, n, a in zip(starts.tolist(), lengths.tolist(), at.tolist()):
            assert flat[a : a + n].tobytes() == stream[s : s + n].tobytes()
    assert store.to_token_array().tokens.tobytes() == stream.tobytes()
    where = store._s.direct._where
    assert (where == -1).any() and (where >= 0).any() and not (where == -2).any()


def test_reads_from_many_threads_at_once_are_each_whole(tmp_path):
    docs = docs_with_zero_runs(5)
    store = write_token_store(tmp_path / "store", docs, dtype="uint16", **LAYOUT)
    want = [d.astype(np.uint16).tobytes() for d in docs]
    errors = []

    def read(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(30):
            ids = rng.integers(0, len(docs), 40).tolist()
            got = [g["tokens"].tobytes() for g in store.__getitems__(ids)]
            if got != [want[i] for i in ids]:
                errors.append(seed)

    threads = [threading.Thread(target=read, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_shard_index_that_does_not_fit_its_file_raises_naming_the_file(tmp_path):
    path = tmp_path / "store"
    write_token_store(path, [np.arange(1, 200)], dtype="uint16", **LAYOUT)
    shard = path / "tokens" / "c" / "1"
    raw = bytearray(shard.read_bytes())
    index_at = len(raw) - (16 * 4 + 4)
    raw[index_at : index_at + 8] = (len(raw) * 2).to_bytes(8, "little")  # chunk 0's offset
    shard.write_bytes(bytes(raw))
    store = TokenStore(path)
    flat, _ = store.read_spans([0], [64])
    assert flat.tolist() == list(range(1, 65))  # shard 0 is sound
    with pytest.raises(
        TokenStoreError, match=r"shard file .*c/1 is corrupt.*inner chunk 0.*rewrite"
    ):
        store.read_flat([0])
    shard.write_bytes(bytes(raw[index_at:]))  # the index alone, shorter than one chunk
    with pytest.raises(TokenStoreError, match=r"shard file .*c/1 is corrupt.*inner chunk 0"):
        TokenStore(path).read_flat([0])


def test_only_the_default_plain_sharded_layout_is_read_directly(plain):
    _, path, _ = plain
    metadata = json.loads((path / "tokens" / "zarr.json").read_text())
    assert shard_layout(metadata, path / "tokens") is not None
    dotted = {**metadata, "chunk_key_encoding": {"name": "v2"}}
    assert shard_layout(dotted, path / "tokens") is None
    codecs = json.loads(json.dumps(metadata["codecs"]))
    codecs[0]["configuration"]["codecs"].append({"name": "zstd", "configuration": {"level": 1}})
    assert shard_layout({**metadata, "codecs": codecs}, path / "tokens") is None


def test_an_unknown_compression_is_refused(tmp_path):
    with pytest.raises(TokenStoreError, match="unsupported compression 'lz4'.*None.*'zstd'"):
        write_token_store(tmp_path / "store", [np.arange(3)], compression="lz4")
