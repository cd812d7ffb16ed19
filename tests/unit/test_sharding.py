"""``Loader(sharding=...)``: global jax.Arrays, device prefetch and the state it reports.

Tests here run on whatever devices this process has (one CPU device usually);
the 8-device meshes run in tests/integration/test_eight_devices.py.
"""

from __future__ import annotations

import subprocess
import sys

import jax
import numpy as np
import pytest
from pipelines import assert_batch_equal

import zephon_jax as zj

STEPS = 10


@pytest.fixture(scope="module")
def reference(dataset):
    it = iter(zj.Loader(dataset))
    batches, states = [], [it.get_state()]
    for _ in range(STEPS):
        batches.append(next(it))
        states.append(it.get_state())
    return batches, states


def assert_same_state(got, want) -> None:
    assert got["step"] == want["step"] and got["fingerprint"] == want["fingerprint"]
    assert sorted(got["lanes"]) == sorted(want["lanes"])
    for lane in want["lanes"]:
        assert np.array_equal(got["lanes"][lane], want["lanes"][lane]), lane


def test_import_does_not_start_jax():
    code = "import sys, zephon_jax; assert 'jax' not in sys.modules and 'orbax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_global_arrays_equal_numpy_loader(dataset, reference, sharding, prefetch):
    it = iter(zj.Loader(dataset, sharding=sharding, device_prefetch=prefetch))
    for want in reference[0]:
        batch = next(it)
        assert all(isinstance(v, jax.Array) and v.sharding == sharding for v in batch.values())
        assert_batch_equal(batch, want)
    it.close()


def test_state_describes_handed_out_batches_not_prefetched(dataset, reference, sharding):
    batches, states = reference
    it = iter(zj.Loader(dataset, sharding=sharding, device_prefetch=3))
    assert_same_state(it.get_state(), states[0])
    for step in range(1, 7):
        next(it)
        # the thread has produced up to three batches more than were handed out
        assert_same_state(it.get_state(), states[step])
    it.close()


def test_set_state_rewinds_while_prefetching(dataset, reference, sharding):
    batches, states = reference
    it = iter(zj.Loader(dataset, sharding=sharding, device_prefetch=2))
    for _ in range(6):
        next(it)
    it.set_state(states[2])
    assert it.step == 2
    assert_same_state(it.get_state(), states[2])
    for want in batches[2:]:
        assert_batch_equal(next(it), want)
    it.close()


def test_rejected_state_leaves_iterator_unchanged(dataset, reference, sharding):
    batches, states = reference
    it = iter(zj.Loader(dataset, sharding=sharding))
    for _ in range(3):
        next(it)
    other = zj.Dataset.source([{"tokens": np.arange(5, dtype=np.int32)}] * 4).pack(24).batch(16)
    with pytest.raises(zj.StateMismatchError) as e:
        it.set_state(iter(zj.Loader(other)).get_state())
    assert e.value.field == "sources"
    partial = dict(states[5], lanes={k: v for k, v in states[5]["lanes"].items() if k != "3"})
    with pytest.raises(zj.StateError, match="lane 3"):
        it.set_state(partial)
    assert_same_state(it.get_state(), states[3])
    for want in batches[3:]:
        assert_batch_equal(next(it), want)


def test_end_of_data_and_errors_reach_the_caller(sharding):
    docs = [{"tokens": np.arange(i % 15 + 1, dtype=np.int32) + 100 * i} for i in range(600)]
    finite = zj.Dataset.source(docs).repeat(1).pack(16, num_bins=2).batch(4)
    expected = list(zj.Loader(finite))
    got = list(zj.Loader(finite, sharding=sharding, device_prefetch=2))
    assert len(got) == len(expected) > 0
    for g, e in zip(got, expected):
        assert_batch_equal(g, e)

    def fail_late(record):
        if record["tokens"][0] == 100 * 450:  # read well after the first blocks
            raise ValueError("bad record")
        return record

    failing = zj.Dataset.source(docs).repeat(1).map(fail_late).pack(16, num_bins=2).batch(4)
    it = iter(zj.Loader(failing, sharding=sharding, device_prefetch=2))
    delivered = 0
    with pytest.raises(zj.RecordError, match="bad record"):
        while True:
            next(it)
            delivered += 1
    assert delivered > 0 and it.get_state()["step"] == delivered
    with pytest.raises(zj.RecordError):
        next(it)
    it.close()


def test_sharding_arguments_are_checked(dataset, sharding):
    with pytest.raises(zj.PipelineError, match="NamedSharding"):
        zj.Loader(dataset, sharding="data")
    with pytest.raises(zj.PipelineError, match="process_index=1"):
        zj.Loader(dataset, sharding=sharding, process_index=1)
    with pytest.raises(zj.PipelineError, match="device_prefetch"):
        zj.Loader(dataset, sharding=sharding, device_prefetch=-1)
    it = iter(zj.Loader(dataset, sharding={"tokens": sharding}))
    with pytest.raises(zj.PipelineError, match="does not match the batch"):
        next(it)


def test_pair_and_pytree_forms_equal_named_sharding(dataset, reference, sharding):
    fields = sorted(reference[0][0])
    forms = [(sharding.mesh, sharding.spec), {f: sharding for f in fields}]
    for form in forms:
        it = iter(zj.Loader(dataset, sharding=form, device_prefetch=0))
        for want in reference[0][:3]:
            assert_batch_equal(next(it), want)


def test_loader_workers_feed_the_device_ring(dataset, reference, sharding):
    """Worker processes behind a sharded loader: same arrays, same states."""
    pytest.importorskip("zephon_jax.workers.producer")
    batches, states = reference
    it = iter(zj.Loader(dataset, sharding=sharding, num_workers=2, device_prefetch=2))
    try:
        for step in range(1, 5):
            assert_batch_equal(next(it), batches[step - 1])
        assert_same_state(it.get_state(), states[4])
        it.set_state(states[2])
        for want in batches[2:6]:
            assert_batch_equal(next(it), want)
    finally:
        it.close()


def test_device_prefetch_fetches_worker_states_only_for_get_state(
    dataset, reference, sharding, monkeypatch
):
    """The prefetch thread notes where the workers keep each batch's state; the lanes'
    snapshots cross processes only when a state (or provenance) is asked for."""
    from zephon_jax.workers.producer import WorkerRowProducer

    asked = []
    ask = WorkerRowProducer._ask_states

    def counting(self, worker, index):
        asked.append(index)
        return ask(self, worker, index)

    monkeypatch.setattr(WorkerRowProducer, "_ask_states", counting)
    batches, states = reference
    it = iter(zj.Loader(dataset, sharding=sharding, num_workers=2, device_prefetch=3))
    try:
        for step in range(1, 6):
            assert_batch_equal(next(it), batches[step - 1])
        assert asked == []
        assert_same_state(it.get_state(), states[5])
        assert asked == [5, 5]  # one question per worker, about the batch handed out
        rows = it.provenance()
        assert len(rows) == dataset.global_batch_size and all(rows)
        for step in range(6, 9):  # the workers ran ahead meanwhile; the state did not
            assert_batch_equal(next(it), batches[step - 1])
            assert_same_state(it.get_state(), states[step])
    finally:
        it.close()
