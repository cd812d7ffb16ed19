"""Packed batches are written into the arrays of dropped batches, never of kept ones.

``RowProducer`` assembles packed batches into arrays from an ``OutputPool``,
which hands an array out again only when nothing else references it. Every
test here compares what a caller kept, after 20 more batches were made, with
copies taken the moment each batch was handed out.
"""

from __future__ import annotations

import numpy as np
import pytest
from pipelines import assert_batch_equal

import zephon_jax as zj
from zephon_jax.core.packed import OutputPool

STEPS = 20


def copied(batch) -> dict[str, np.ndarray]:
    return {name: np.array(value, copy=True) for name, value in batch.items()}


def addresses(batch) -> set[int]:
    return {value.ctypes.data for value in batch.values()}


@pytest.fixture(scope="module")
def fresh(dataset):
    it = iter(zj.Loader(dataset))
    return [copied(next(it)) for _ in range(STEPS)]


def test_dropped_batches_arrays_are_reused(dataset, fresh):
    it = iter(zj.Loader(dataset))
    seen: set[int] = set()
    reused = 0
    for want in fresh:
        batch = next(it)
        assert_batch_equal(batch, want)
        reused += len(addresses(batch) & seen)
        seen |= addresses(batch)
        del batch
    assert reused == 3 * (STEPS - 1)  # every field of every batch after the first


def test_kept_batches_are_never_overwritten(dataset, fresh):
    it = iter(zj.Loader(dataset))
    kept = [next(it) for _ in range(STEPS)]
    assert len(set().union(*map(addresses, kept))) == 3 * STEPS
    for got, want in zip(kept, fresh):
        assert_batch_equal(got, want)


def test_kept_views_and_slices_are_never_overwritten(dataset, fresh):
    """The batch dicts are dropped; only parts of them are kept."""
    it = iter(zj.Loader(dataset))
    kept = []
    for _ in range(STEPS):
        batch = next(it)
        kept.append(
            (
                batch["tokens"][2:5],
                batch["tokens"][1:][::2],
                memoryview(batch["tokens_segment_ids"]),
                batch["tokens_positions"].reshape(-1),
            )
        )
        del batch
    for (rows, strided, segment_ids, positions), want in zip(kept, fresh):
        assert rows.tobytes() == want["tokens"][2:5].tobytes()
        assert strided.tobytes() == want["tokens"][1:][::2].tobytes()
        assert np.asarray(segment_ids).tobytes() == want["tokens_segment_ids"].tobytes()
        assert positions.tobytes() == want["tokens_positions"].tobytes()


def test_kept_global_arrays_are_never_overwritten(dataset, fresh, sharding):
    """jax on CPU may alias a numpy array zero-copy: the jax array keeps it referenced."""
    for prefetch in (0, 2):
        it = iter(zj.Loader(dataset, sharding=sharding, device_prefetch=prefetch))
        kept = [next(it) for _ in range(STEPS)]
        it.close()
        for got, want in zip(kept, fresh):
            assert_batch_equal(got, want)


def test_worker_batches_are_unchanged(dataset, fresh):
    it = iter(zj.Loader(dataset, num_workers=2))
    try:
        kept = [next(it) for _ in range(STEPS)]
    finally:
        it.close()
    for got, want in zip(kept, fresh):
        assert_batch_equal(got, want)


def test_with_workers_the_loader_reuses_dropped_batches_arrays_and_keeps_kept_ones(dataset, fresh):
    """The loader process gathers the workers' rows into pooled arrays too."""
    it = iter(zj.Loader(dataset, num_workers=2))
    pool = it._producer.pool
    try:
        seen: set[int] = set()
        reused = 0
        kept = []
        for step, want in enumerate(fresh):
            batch = next(it)
            assert_batch_equal(batch, want)
            pooled = {id(a) for arrays in pool._arrays.values() for a in arrays}
            assert {id(v) for v in batch.values()} <= pooled
            reused += len(addresses(batch) & seen)
            seen |= addresses(batch)
            if step % 3 == 0:
                kept.append((step, batch))
            del batch
    finally:
        it.close()
    assert reused > 0
    for step, batch in kept:
        assert_batch_equal(batch, fresh[step])


def test_several_fields_and_cast_values():
    """Two fields, int64 values cast to int32: each output array its own, all kept intact."""
    rng = np.random.default_rng(3)
    docs = [
        {"tokens": rng.integers(0, 1000, n).astype(np.int64), "mask": rng.random(n) < 0.5}
        for n in rng.integers(1, 12, 200)
    ]
    ds = zj.Dataset.source(docs).shuffle(0).pack(16).batch(8)
    it = iter(zj.Loader(ds))
    want = [copied(next(it)) for _ in range(10)]
    it = iter(zj.Loader(ds))
    kept = []
    for step in range(10):
        batch = next(it)
        if step % 2:
            kept.append(batch)
        else:
            assert_batch_equal(batch, want[step])
        del batch
    assert len(set().union(*map(addresses, kept))) == 6 * len(kept)
    for got, step in zip(kept, range(1, 10, 2)):
        assert_batch_equal(got, want[step])


def test_pool_hands_out_only_unreferenced_arrays():
    import jax

    pool = OutputPool(size=2)
    first = pool.empty("x", (4, 8), np.dtype(np.int32))
    view = first[1:3]
    address = first.ctypes.data
    del first
    assert pool.empty("x", (4, 8), np.dtype(np.int32)).ctypes.data != address  # view holds it
    del view
    again = pool.empty("x", (4, 8), np.dtype(np.int32))
    assert again.ctypes.data == address
    again[...] = 5
    on_device = jax.device_put(again)  # may alias the numpy memory on CPU
    del again
    other = pool.empty("x", (4, 8), np.dtype(np.int32))
    other[...] = 7
    assert np.asarray(on_device).tolist() == [[5] * 8] * 4
    assert pool.empty("y", (4, 8), np.dtype(np.int32)).ctypes.data != other.ctypes.data


def _training_mixture() -> zj.BatchedDataset:
    """A mixture by tokens, split, pack and to_training: on the column path, gathered and
    shifted into pooled arrays (the shift's new fields as well)."""
    rng = np.random.default_rng(4)
    docs = [rng.integers(1, 500, int(rng.integers(1, 120)), dtype=np.int32) for _ in range(300)]
    sources = [zj.Dataset.source([{"tokens": d} for d in docs[k::2]]) for k in range(2)]
    ds = zj.Dataset.mix(sources, [0.6, 0.4], unit="tokens").shuffle(2).split(64).pack(64)
    return ds.to_training(pad_id=0).batch(8)


def test_training_fields_are_pooled_and_kept_ones_never_overwritten():
    ds = _training_mixture()
    it = iter(zj.Loader(ds))
    want = [copied(next(it)) for _ in range(STEPS)]
    it = iter(zj.Loader(ds))
    held: set[int] = set()  # the addresses of the arrays kept so far
    seen: set[int] = set()
    reused = 0
    kept = []
    for k in range(STEPS):
        batch = next(it)
        assert_batch_equal(batch, want[k])
        assert not addresses(batch) & held
        if k % 2:  # the whole batch is kept
            part = batch
        else:  # two of its fields are kept; the others may be reused
            part = {"targets": batch["targets"], "loss_mask": batch["loss_mask"]}
        reused += len(addresses(batch) & seen)  # arrays of fields dropped before
        seen |= addresses(batch)
        held |= addresses(part)
        kept.append((k, part))
        del batch
    assert reused >= 3 * (STEPS // 2 - 1)  # inputs, segment_ids, positions
    for k, got in kept:
        for name, value in got.items():
            assert value.tobytes() == want[k][name].tobytes(), (k, name)
