import json
import pickle

import grain
import numpy as np
import pytest
import tensorstore as ts
from hypothesis import given, settings
from hypothesis import strategies as st

import zephon_jax.sources.token_store as token_store_module
from zephon_jax.sources import (
    TokenStore,
    TokenStoreError,
    TokenStoreWriter,
    commit_token_store,
    create_token_store,
    write_token_range,
    write_token_store,
)

SMALL = {"chunk_tokens": 1024, "read_chunk_tokens": 256, "flush_tokens": 700}


def random_docs(seed: int, n: int, max_len: int = 300, high: int = 50_000) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, max_len, n)
    lengths[rng.random(n) < 0.1] = 0
    return [rng.integers(0, high, int(k)) for k in lengths]


def assert_store_equals(store: TokenStore, docs: list[np.ndarray]) -> None:
    assert len(store) == store.num_docs == len(docs)
    assert store.num_tokens == sum(len(d) for d in docs)
    np.testing.assert_array_equal(store.doc_lengths, [len(d) for d in docs])
    for i, doc in enumerate(docs):
        got = store[i]["tokens"]
        assert got.dtype == store.dtype and got.ndim == 1
        np.testing.assert_array_equal(got, doc)


def ts_array(path, name: str) -> ts.TensorStore:
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path / name)}}
    return ts.open(spec, read=True, write=True).result()


def edit_meta(path, **changes) -> None:
    meta = json.loads((path / "meta.json").read_text())
    meta.update(changes)
    (path / "meta.json").write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory) -> tuple[TokenStore, list[np.ndarray]]:
    docs = random_docs(0, 400)
    path = tmp_path_factory.mktemp("shared") / "store"
    return write_token_store(path, docs, **SMALL), docs


@pytest.fixture
def store_path(tmp_path):
    path = tmp_path / "store"
    write_token_store(path, random_docs(1, 50), **SMALL)
    return path


def test_roundtrip_with_empty_docs(shared_store):
    store, docs = shared_store
    assert any(len(d) == 0 for d in docs)
    assert store.dtype == np.uint32
    assert_store_equals(store, docs)
    assert store.offsets[0] == 0 and store.offsets[-1] == store.num_tokens


@pytest.mark.parametrize(("dtype", "low", "high"), [("uint16", 0, 65536), ("int32", -5, 2**31 - 1)])
def test_roundtrip_dtypes(tmp_path, dtype, low, high):
    rng = np.random.default_rng(2)
    docs = [rng.integers(low, high, int(k)) for k in rng.integers(0, 100, 30)]
    store = write_token_store(tmp_path / "s", docs, dtype=dtype)
    assert store.dtype == np.dtype(dtype)
    assert_store_equals(store, docs)


def test_empty_store(tmp_path):
    store = write_token_store(tmp_path / "s", [])
    assert len(store) == 0 and store.num_tokens == 0
    assert store.__getitems__([]) == []
    assert store.read_range(0, 0) == []
    with pytest.raises(IndexError):
        store[0]


def test_getitems_matches_getitem(shared_store):
    store, _ = shared_store
    rng = np.random.default_rng(3)
    indices = list(rng.integers(0, len(store), 200)) + [5, 5, 0, len(store) - 1, 5]
    batch = store.__getitems__(indices)
    assert len(batch) == len(indices)
    for i, item in zip(indices, batch, strict=True):
        np.testing.assert_array_equal(item["tokens"], store[i]["tokens"])
    assert (
        store._getitems(indices[:3])[2]["tokens"].tolist() == store[indices[2]]["tokens"].tolist()
    )


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 399), max_size=64))
def test_getitems_property(shared_store, indices):
    store, docs = shared_store
    batch = store.__getitems__(indices)
    assert [b["tokens"].tolist() for b in batch] == [docs[i].tolist() for i in indices]


def test_getitems_returns_independent_arrays(shared_store):
    store, docs = shared_store
    i = next(k for k, d in enumerate(docs) if len(d) > 0)
    a, b, c = store.__getitems__([i, i, i + 1])
    a["tokens"][:] = 0
    np.testing.assert_array_equal(b["tokens"], docs[i])
    np.testing.assert_array_equal(c["tokens"], docs[i + 1])


@pytest.fixture(scope="module", params=[None, "zstd"])
def scattered_store(tmp_path_factory, request) -> tuple[TokenStore, list[np.ndarray]]:
    """Documents of 0..80 tokens in read chunks of 16 and stored shards of 64 tokens: most
    documents span read chunks, many span shards, and a random pick rarely coalesces.
    Plain (read from the shard files) and compressed (read through TensorStore)."""
    docs = random_docs(7, 600, max_len=80)
    path = tmp_path_factory.mktemp("scattered") / "store"
    opts = {"chunk_tokens": 64, "read_chunk_tokens": 16, "flush_tokens": 500}
    store = write_token_store(path, docs, dtype="uint16", compression=request.param, **opts)
    assert (store._s.direct is None) == (request.param == "zstd")
    return store, docs


def one_by_one(store: TokenStore, indices) -> list[np.ndarray]:
    return [store[int(i)]["tokens"] for i in indices]


@pytest.mark.parametrize("layers", [1024, 3])
def test_batched_reads_are_byte_identical_to_one_by_one_reads(scattered_store, layers, monkeypatch):
    """Random ids with duplicates, empty documents, documents spanning read chunks and
    shards, and the last document; one virtual concatenation or several per read."""
    monkeypatch.setattr(token_store_module, "_CONCAT_LAYERS", layers)
    store, docs = scattered_store
    empty = [i for i, d in enumerate(docs) if len(d) == 0][:3]
    spanning_shards = [
        i for i in range(len(docs)) if store.offsets[i] // 64 != (store.offsets[i + 1] - 1) // 64
    ]
    assert empty and spanning_shards
    rng = np.random.default_rng(11)
    for _ in range(10):
        ids = rng.integers(0, len(store), int(rng.integers(1, 300))).tolist()
        ids += empty + spanning_shards[:5] + [len(store) - 1, 0, ids[0]]
        rng.shuffle(ids)
        want = one_by_one(store, ids)
        got = store.__getitems__(ids)
        assert [g["tokens"].dtype for g in got] == [store.dtype] * len(ids)
        assert [g["tokens"].tobytes() for g in got] == [w.tobytes() for w in want]
        assert [w.tobytes() for w in want] == [docs[i].astype(np.uint16).tobytes() for i in ids]
        flat = store.read_flat(np.asarray(ids))
        assert flat.dtype == store.dtype
        assert flat.tobytes() == b"".join(w.tobytes() for w in want)


def test_read_flat_of_a_sequential_run_empty_ids_and_only_empty_documents(scattered_store):
    store, docs = scattered_store
    run = list(range(100, 260))
    assert store.read_flat(run).tobytes() == b"".join(w.tobytes() for w in one_by_one(store, run))
    assert store.read_flat([]).dtype == store.dtype and store.read_flat([]).size == 0
    empty = [i for i, d in enumerate(docs) if len(d) == 0]
    assert store.read_flat(empty + empty).size == 0
    assert [g["tokens"].size for g in store.__getitems__(empty)] == [0] * len(empty)


def test_read_flat_returns_a_new_writable_array(scattered_store):
    store, docs = scattered_store
    ids = [i for i, d in enumerate(docs) if len(d) > 0][:4]
    first = store.read_flat(ids)
    first[:] = 0
    assert store.read_flat(ids).tobytes() == b"".join(
        docs[i].astype(np.uint16).tobytes() for i in ids
    )


def test_read_flat_refuses_bad_indices(scattered_store):
    store, _ = scattered_store
    with pytest.raises(IndexError, match="out of range"):
        store.read_flat([0, len(store)])
    with pytest.raises(TypeError, match="1-D sequence of ints"):
        store.read_flat([0.5])


def test_out_of_range_indices(shared_store):
    store, _ = shared_store
    for bad in (-1, len(store)):
        with pytest.raises(IndexError, match="out of range"):
            store[bad]
        with pytest.raises(IndexError, match="out of range"):
            store.__getitems__([0, bad])
    with pytest.raises(IndexError, match="out of range"):
        store.read_range(3, len(store) + 1)


def test_read_range(shared_store):
    store, docs = shared_store
    got = store.read_range(17, 83)
    assert [g["tokens"].tolist() for g in got] == [d.tolist() for d in docs[17:83]]


def test_fingerprint(tmp_path, store_path):
    store = TokenStore(store_path)
    assert store.fingerprint() == TokenStore(store_path).fingerprint()
    other = write_token_store(tmp_path / "other", random_docs(1, 51), **SMALL)
    assert other.fingerprint() != store.fingerprint()
    with TokenStoreWriter(store_path, resume=True) as writer:
        writer.append([1, 2, 3])
    assert TokenStore(store_path).fingerprint() != store.fingerprint()


def test_resume_after_interrupted_writer(tmp_path):
    docs = random_docs(4, 120)
    reference = write_token_store(tmp_path / "ref", docs, **SMALL)

    path = tmp_path / "resumed"
    writer = TokenStoreWriter(path, attrs={"name": "x"}, **SMALL)
    writer.extend(docs[:50])
    assert writer.commit() == 50
    writer.extend(docs[50:90])
    writer.extend([[7] * 999] * 3)
    committed_tokens = sum(len(d) for d in docs[:50])
    assert ts_array(path, "tokens").shape[0] > committed_tokens  # uncommitted data was flushed
    del writer

    assert len(TokenStore(path)) == 50
    with TokenStoreWriter(path, resume=True, **SMALL) as writer:
        assert (writer.num_docs, writer.num_tokens) == (50, committed_tokens)
        writer.extend(docs[50:])
    resumed = TokenStore(path)
    assert_store_equals(resumed, docs)
    assert resumed.fingerprint() == reference.fingerprint()
    assert resumed.attrs == {"name": "x"}
    for name in ("tokens", "offsets"):
        assert ts_array(path, name).shape == ts_array(tmp_path / "ref", name).shape


def test_resume_on_fresh_path_creates(tmp_path):
    with TokenStoreWriter(tmp_path / "new", resume=True) as writer:
        writer.append([1, 2])
    assert TokenStore(tmp_path / "new")[0]["tokens"].tolist() == [1, 2]


def test_exception_in_context_discards_uncommitted(tmp_path):
    path = tmp_path / "s"
    with pytest.raises(RuntimeError), TokenStoreWriter(path) as writer:
        writer.append([1])
        writer.commit()
        writer.append([2])
        raise RuntimeError
    assert len(TokenStore(path)) == 1


def test_pickle_roundtrip(shared_store):
    store, docs = shared_store
    clone = pickle.loads(pickle.dumps(store))
    assert clone.__getstate__() == {"path": str(store.path)}
    assert clone.fingerprint() == store.fingerprint()
    assert_store_equals(clone, docs)


def test_grain_source(shared_store):
    store, docs = shared_store
    assert isinstance(store, grain.sources.RandomAccessDataSource)
    ds = grain.MapDataset.source(store)
    assert len(ds) == len(docs)
    np.testing.assert_array_equal(ds[3]["tokens"], docs[3])
    got = [e["tokens"].tolist() for e in ds.slice(slice(0, 10)).to_iter_dataset()]
    assert got == [d.tolist() for d in docs[:10]]


# Error cases


def test_missing_directory(tmp_path):
    with pytest.raises(TokenStoreError, match="does not exist.*TokenStoreWriter"):
        TokenStore(tmp_path / "nope")


def test_a_file_is_not_a_token_store_and_the_error_says_how_to_make_one(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"text": "a"}\n')
    with pytest.raises(TokenStoreError) as info:
        TokenStore(path)
    message = str(info.value)
    assert f"{str(path)!r} is a file, and a TokenStore is a directory" in message
    assert f"`zephon-jax prepare {path} -o STORE_DIR`" in message
    assert "does not exist" not in message


def test_missing_meta(store_path):
    (store_path / "meta.json").unlink()
    with pytest.raises(TokenStoreError, match="meta.json.*missing.*TokenStoreWriter"):
        TokenStore(store_path)


def test_corrupt_meta(store_path):
    (store_path / "meta.json").write_text("{not json")
    with pytest.raises(TokenStoreError, match="corrupt meta.json"):
        TokenStore(store_path)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"format": "other"}, "format 'other'"),
        ({"version": 99}, "unsupported TokenStore version 99"),
        ({"num_docs": "3"}, "'num_docs' is '3'"),
        ({"dtype": "float32"}, "dtype 'float32'"),
        ({"dtype": "int32"}, "meta.json says dtype 'int32' but the tokens array is 'uint32'"),
        ({"num_docs": 10_000}, "offsets array has .* entries"),
    ],
)
def test_bad_meta_fields(store_path, changes, match):
    edit_meta(store_path, **changes)
    with pytest.raises(TokenStoreError, match=match):
        TokenStore(store_path)


def test_offsets_not_monotonic(store_path):
    arr = ts_array(store_path, "offsets")
    arr[10].write(arr[9].read().result() - 1).result()
    with pytest.raises(TokenStoreError, match="non-decreasing: first bad index 10"):
        TokenStore(store_path)


def test_offsets_not_starting_at_zero(store_path):
    ts_array(store_path, "offsets")[0].write(1).result()
    with pytest.raises(TokenStoreError, match=r"offsets\[0\] is 1, expected 0"):
        TokenStore(store_path)


def test_last_offset_mismatch(store_path):
    meta = json.loads((store_path / "meta.json").read_text())
    edit_meta(store_path, num_tokens=meta["num_tokens"] - 1)
    with pytest.raises(TokenStoreError, match="last offset is .* num_tokens="):
        TokenStore(store_path)


def test_truncated_tokens(store_path):
    arr = ts_array(store_path, "tokens")
    arr.resize(exclusive_max=[arr.shape[0] - 5]).result()
    with pytest.raises(TokenStoreError, match="truncated TokenStore"):
        TokenStore(store_path)


def test_missing_array(store_path):
    (store_path / "offsets" / "zarr.json").unlink()
    with pytest.raises(TokenStoreError, match="cannot open the 'offsets' array"):
        TokenStore(store_path)


@pytest.mark.parametrize(
    ("dtype", "doc", "match"),
    [
        ("uint16", [1, 65536], "do not fit the store dtype uint16"),
        ("uint32", [-1], "do not fit the store dtype uint32"),
        ("int32", [2**31], "do not fit the store dtype int32"),
        ("uint32", [[1, 2]], "1-D"),
        ("uint32", [1.5], "integers"),
    ],
)
def test_append_rejects_bad_docs(tmp_path, dtype, doc, match):
    with TokenStoreWriter(tmp_path / "s", dtype=dtype) as writer:
        with pytest.raises(TokenStoreError, match=match):
            writer.append(doc)
        assert writer.num_docs == 0


def test_unsupported_dtype(tmp_path):
    with pytest.raises(TokenStoreError, match="unsupported dtype 'float32'"):
        TokenStoreWriter(tmp_path / "s", dtype="float32")


def test_existing_dir_without_resume(store_path, tmp_path):
    with pytest.raises(TokenStoreError, match="pass resume=True.*or choose another path"):
        TokenStoreWriter(store_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("x")
    with pytest.raises(TokenStoreError, match="holds no TokenStore"):
        TokenStoreWriter(tmp_path / "other", resume=True)
    TokenStoreWriter(tmp_path / "empty_dir", resume=False).close()


def test_resume_with_wrong_dtype(store_path):
    with pytest.raises(TokenStoreError, match="pass dtype='uint32'"):
        TokenStoreWriter(store_path, dtype="uint16", resume=True)


def test_closed_writer(tmp_path):
    writer = TokenStoreWriter(tmp_path / "s")
    assert writer.close() == 0
    with pytest.raises(TokenStoreError, match="closed"):
        writer.append([1])


# ----- writing a store of known size shard by shard ----------------------------------------


def tree_bytes(root) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes)."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def write_in_shards(path, docs, dtype, chunk_tokens, read_chunk_tokens, seed=0) -> int:
    """Writes ``docs`` with create / write_token_range / commit, one stored shard at a time in
    a shuffled order (as independent workers would); returns commit's num_docs."""
    lengths = [len(d) for d in docs]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    create_token_store(
        path, offsets, dtype, chunk_tokens=chunk_tokens, read_chunk_tokens=read_chunk_tokens
    )
    tokens = np.concatenate(docs)
    shards = list(range(-(-tokens.size // chunk_tokens)))
    np.random.default_rng(seed).shuffle(shards)
    for shard in shards:
        lo = shard * chunk_tokens
        write_token_range(path, lo, tokens[lo : lo + chunk_tokens])
    return commit_token_store(path)


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "int32"])
def test_shard_writer_api_is_byte_equal_to_write_token_store(tmp_path, dtype):
    docs = random_docs(7, 120, high=30_000)
    sizes = {"chunk_tokens": 1024, "read_chunk_tokens": 256}
    write_token_store(tmp_path / "appended", docs, dtype=dtype, **sizes)
    assert write_in_shards(tmp_path / "sharded", docs, dtype, **sizes) == len(docs)
    store = TokenStore(tmp_path / "sharded")
    assert_store_equals(store, docs)
    assert store.dtype == np.dtype(dtype) and store.attrs == {}
    assert tree_bytes(tmp_path / "sharded") == tree_bytes(tmp_path / "appended")


def test_shard_writer_api_is_invisible_until_committed(tmp_path):
    create_token_store(tmp_path / "s", [0, 3, 5], "uint16")
    with pytest.raises(TokenStoreError, match="meta.json' is missing"):
        TokenStore(tmp_path / "s")
    write_token_range(tmp_path / "s", 0, np.arange(5))
    assert commit_token_store(tmp_path / "s", attrs={"tokenizer": "bytes"}) == 2
    store = TokenStore(tmp_path / "s")
    assert_store_equals(store, [np.arange(3), np.arange(3, 5)])
    assert store.attrs == {"tokenizer": "bytes"}


@pytest.mark.parametrize(
    ("offsets", "match"),
    [
        ([], "non-empty 1-D array of ints"),
        ([0.0, 1.5], "non-empty 1-D array of ints"),
        ([1, 4], "start at 0 and never decrease"),
        ([0, 4, 2], "start at 0 and never decrease"),
    ],
)
def test_create_token_store_refuses_bad_offsets(tmp_path, offsets, match):
    with pytest.raises(TokenStoreError, match=match):
        create_token_store(tmp_path / "s", offsets)


def test_create_token_store_refuses_a_committed_store(store_path):
    with pytest.raises(TokenStoreError, match="already holds a committed TokenStore"):
        create_token_store(store_path, [0, 1])


def test_write_token_range_refuses_bad_ranges_and_values(tmp_path):
    create_token_store(tmp_path / "s", [0, 4], "uint16")
    with pytest.raises(TokenStoreError, match="within its 4 tokens"):
        write_token_range(tmp_path / "s", 2, [1, 2, 3])
    with pytest.raises(TokenStoreError, match="within its 4 tokens"):
        write_token_range(tmp_path / "s", -1, [1])
    with pytest.raises(TokenStoreError, match="do not fit the store dtype uint16"):
        write_token_range(tmp_path / "s", 0, [70_000])


@pytest.mark.parametrize("layers", [1024, 3])
def test_read_spans_reads_any_token_spans_in_one_read(scattered_store, monkeypatch, layers):
    """Spans of the token stream, in any order, repeated, overlapping, across documents and
    shards, empty: each is the stream's tokens there."""
    monkeypatch.setattr(token_store_module, "_CONCAT_LAYERS", layers)
    store, docs = scattered_store
    stream = np.concatenate([d.astype(np.uint16) for d in docs])
    total = int(store.offsets[-1])
    rng = np.random.default_rng(5)
    for _ in range(10):
        starts = rng.integers(0, total, int(rng.integers(1, 200)))
        lengths = np.minimum(rng.integers(0, 300, len(starts)), total - starts)
        starts = np.concatenate([starts, starts[:3], [0, total - 1]])
        lengths = np.concatenate([lengths, lengths[:3] // 2, [total, 1]])
        flat, at = store.read_spans(starts, lengths)
        assert flat.dtype == store.dtype
        got = [flat[a : a + n].tobytes() for a, n in zip(at.tolist(), lengths.tolist())]
        assert got == [
            stream[s : s + n].tobytes() for s, n in zip(starts.tolist(), lengths.tolist())
        ]
    assert store.read_spans([], [])[0].size == 0
    with pytest.raises(IndexError, match=f"outside the {total} tokens"):
        store.read_spans([total - 1], [2])
