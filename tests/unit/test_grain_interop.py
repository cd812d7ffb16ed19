"""Grain interop: a pipeline as a grain.IterDataset, JSON-able states, Grain transforms."""

from __future__ import annotations

import json

import grain
import numpy as np
import pytest
from pipelines import assert_batches_equal, full_pipeline, make_docs, run_topology, take

import zephon_jax as zj
from zephon_jax.errors import StateError, StateMismatchError
from zephon_jax.grain_interop import (
    ZephonIterDataset,
    merge_grain_states,
    state_from_json,
    state_to_json,
)


def test_iter_dataset_gives_the_loader_batches_and_takes_grain_transforms():
    ds = full_pipeline()
    expected = take(iter(zj.Loader(ds)), 10)
    grain_ds = ZephonIterDataset(ds)
    assert isinstance(grain_ds, grain.IterDataset)
    assert_batches_equal(take(iter(grain_ds), 10), expected)
    summed = iter(grain_ds.map(lambda b: int(b["tokens"].sum())))
    assert [next(summed) for _ in range(10)] == [int(b["tokens"].sum()) for b in expected]
    rows = take(iter(ZephonIterDataset(ds, process_index=1, process_count=2)), 10)
    for part, full in zip(rows, expected):
        np.testing.assert_array_equal(part["tokens"], full["tokens"][4:])


def test_json_state_restores_on_another_topology():
    ds = full_pipeline()
    expected = take(iter(zj.Loader(ds)), 14)
    iterators = [iter(ZephonIterDataset(ds, process_index=p, process_count=2)) for p in range(2)]
    for _ in range(6):
        for it in iterators:
            next(it)
    states = [json.loads(json.dumps(it.get_state())) for it in iterators]  # what Grain writes
    assert all(isinstance(v, str) for s in states for v in s["zephon_jax"]["lanes"].values())
    merged = json.loads(json.dumps(merge_grain_states(states)))
    restored = [iter(ZephonIterDataset(ds, process_index=p, process_count=4)) for p in range(4)]
    for it in restored:
        it.set_state(merged)
    got = [
        {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        for parts in ([next(it) for it in restored] for _ in range(8))
    ]
    assert_batches_equal(got, expected[6:])
    # One process's state covers only its lanes: restoring it alone elsewhere is refused.
    single = iter(ZephonIterDataset(ds))
    with pytest.raises(StateError, match="merge the states of all processes"):
        single.set_state(states[0])


def test_grain_checkpoint_handler_saves_and_restores(tmp_path):
    import orbax.checkpoint as ocp

    ds = full_pipeline()
    expected = take(iter(zj.Loader(ds)), 9)
    it = iter(ZephonIterDataset(ds))
    take(it, 4)
    manager = ocp.CheckpointManager(tmp_path / "ckpt")
    manager.save(4, args=grain.checkpoint.CheckpointSave(it))
    manager.wait_until_finished()
    fresh = iter(ZephonIterDataset(ds))
    manager.restore(4, args=grain.checkpoint.CheckpointRestore(fresh))
    assert_batches_equal(take(fresh, 5), expected[4:])
    manager.close()


def test_state_of_another_pipeline_or_garbage_is_refused():
    it = iter(ZephonIterDataset(full_pipeline()))
    next(it)
    other = iter(ZephonIterDataset(full_pipeline(batch_size=16)))
    with pytest.raises(StateMismatchError, match="global_batch_size"):
        other.set_state(it.get_state())
    with pytest.raises(StateError, match="not made by a zephon_jax"):
        it.set_state({"parent": {}})
    with pytest.raises(StateError, match="JSON form"):
        state_from_json({"lanes": {"0": "not base64!"}})
    state = iter(zj.Loader(full_pipeline())).get_state()
    back = state_from_json(json.loads(json.dumps(state_to_json(state))))
    assert back["fingerprint"] == state["fingerprint"]
    for lane, data in state["lanes"].items():
        np.testing.assert_array_equal(back["lanes"][lane], data)


class ScaleMap(grain.transforms.Map):
    def map(self, element):
        return {"tokens": element["tokens"] * 3}


class NoiseMap(grain.transforms.RandomMap):
    def random_map(self, element, rng):
        return {"tokens": element["tokens"] + rng.integers(0, 5, len(element["tokens"]))}


class EvenLength(grain.transforms.Filter):
    def filter(self, element):
        return len(element["tokens"]) % 2 == 0


def test_grain_transforms_plug_in():
    docs = make_docs(120, 30, seed=4)
    ds = (
        zj.Dataset.source(docs)
        .map(ScaleMap())
        .filter(EvenLength())
        .random_map(NoiseMap(), seed=11)
        .split(8)
        .pack(8)
        .batch(4)
    )
    expected = take(iter(zj.Loader(ds)), 12)
    assert_batches_equal(run_topology(ds, 2, 12), expected)
    # The transforms do what they say: even-length documents only, scaled by 3 ...
    plain = zj.Dataset.source(docs).map(ScaleMap()).filter(EvenLength()).batch(1)
    for batch in take(iter(zj.Loader(plain)), 30):
        assert batch["tokens"].shape[1] % 2 == 0
        assert (batch["tokens"] % 3 == 0).all()
        assert any(np.array_equal(batch["tokens"][0], d["tokens"] * 3) for d in docs)
    # ... and the noise is drawn from the record's position, not from a global generator.
    again = take(iter(zj.Loader(ds)), 12)
    assert_batches_equal(again, expected)
    assert any(((b["tokens"] % 3) != 0).any() for b in expected)
