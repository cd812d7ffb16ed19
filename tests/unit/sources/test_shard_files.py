"""Reads of plain local TokenStores straight from their shard files
(zephon_jax.sources.shard_files) against TensorStore's reads of the same arrays."""

import json
import threading

import numpy as np
import pytest
import tensorstore as ts

from zephon_jax.core.compiled_kernels import tokens_at
from zephon_jax.sources import TokenStore, TokenStoreError, shard_files, write_token_store
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


def _at(addresses, lengths, dtype):
    like = np.empty(0, dtype)
    return [tokens_at(a, n, like).tobytes() for a, n in zip(addresses.tolist(), lengths)]


def test_span_addresses_read_in_place_or_from_a_copy_give_every_token(plain):
    """A plain store's spans are located where its shard files are mapped, those over
    unwritten chunks or chunks stored apart in a copy: every span's tokens, empty ones
    included (address 0), as TensorStore reads them."""
    store, path, _ = plain
    stream = tensorstore_tokens(path)
    total = int(store.offsets[-1])
    rng = np.random.default_rng(2)
    in_place = copied = 0
    for _ in range(20):
        starts = rng.integers(0, total, int(rng.integers(1, 100)))
        lengths = np.minimum(rng.integers(0, 40, starts.size), total - starts)
        addresses, held = store.span_addresses(starts, lengths)
        got = _at(addresses, lengths.tolist(), np.uint16)
        assert got == [stream[s : s + n].tobytes() for s, n in zip(starts, lengths)]
        assert (addresses[lengths == 0] == 0).all()
        maps = [np.frombuffer(h, np.uint8) for h in held if isinstance(h, memoryview)]
        for address, n in zip(addresses.tolist(), lengths.tolist()):
            if n and any(m.ctypes.data <= address < m.ctypes.data + m.size for m in maps):
                in_place += 1
            elif n:
                copied += 1
    assert in_place > copied > 0
    with pytest.raises(IndexError, match="token spans reach outside"):
        store.span_addresses([total - 1], [2])


def test_span_addresses_of_a_compressed_store_are_none(tmp_path):
    store = write_token_store(
        tmp_path / "zstd", docs_with_zero_runs(0), compression="zstd", **LAYOUT
    )
    assert store.span_addresses([0], [4]) is None  # read it with read_spans


def test_addresses_stay_valid_while_held_after_their_map_is_dropped(plain, monkeypatch):
    """At most ``_MAPS_KEPT`` maps stay open: a map dropped after its spans were located
    stays readable through what ``span_addresses`` said to hold; spans over more shards
    than can stay open at once are not located (None: read them instead)."""
    store, path, _ = plain
    stream = tensorstore_tokens(path)
    monkeypatch.setattr(shard_files, "_MAPS_KEPT", 2)
    direct = TokenStore(path)._s.direct
    shard_tokens = direct._layout.shard_tokens
    starts = np.array([1, shard_tokens + 1], np.int64)  # in shards 0 and 1
    located = direct.addresses(starts, starts + 3)
    assert located is not None
    addresses, held = located
    for shard in (2, 3, 4):
        direct._mapped(shard)  # shards 0 and 1 are dropped
    assert 0 not in direct._maps and 1 not in direct._maps
    assert _at(addresses, [3, 3], np.uint16) == [stream[s : s + 3].tobytes() for s in starts]
    three = np.array([1, shard_tokens + 1, 2 * shard_tokens + 1], np.int64)
    assert direct.addresses(three, three + 3) is None
    del held


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
