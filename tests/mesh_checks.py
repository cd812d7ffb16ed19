"""Checks of ``Loader(sharding=...)`` on 8 simulated CPU devices in one process.

The device count must be set before jax starts, so
``tests/integration/test_eight_devices.py`` runs this script in a subprocess; it writes ``{check name: "ok" or the traceback}``
as JSON to the path given as its argument.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import numpy as np

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import zephon_jax as zj  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_worker import make_pipeline  # noqa: E402

STEPS = 12
DATASET = make_pipeline()
REFERENCE = [b for _, b in zip(range(STEPS), zj.Loader(DATASET))]
CHECKS = {}


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def assert_equal_to_reference(batches, first: int = 0) -> None:
    for t, batch in enumerate(batches, start=first):
        ref = REFERENCE[t]
        assert sorted(batch) == sorted(ref), (sorted(batch), sorted(ref))
        for name, array in batch.items():
            assert isinstance(array, jax.Array), type(array)
            got = np.asarray(array)
            assert got.dtype == ref[name].dtype and got.shape == ref[name].shape, name
            assert got.tobytes() == ref[name].tobytes(), f"batch {t + 1}, field {name}"


def take(it, n: int) -> list:
    return [next(it) for _ in range(n)]


@check
def data_tensor_mesh():
    """("data", "tensor") = (4, 2): tensor-parallel devices hold the same rows, bit for bit."""
    mesh = jax.make_mesh((4, 2), ("data", "tensor"))
    loader = zj.Loader(DATASET, sharding=NamedSharding(mesh, P("data")))
    assert list(loader.rows) == list(range(16))
    batches = take(iter(loader), STEPS)
    assert_equal_to_reference(batches)
    for batch in batches:
        for array in batch.values():
            by_rows: dict = {}
            for shard in array.addressable_shards:
                rows = range(16)[shard.index[0]]
                assert len(rows) == 4
                by_rows.setdefault((rows.start, rows.stop), []).append(np.asarray(shard.data))
            assert len(by_rows) == 4
            for copies in by_rows.values():
                assert len(copies) == 2 and copies[0].tobytes() == copies[1].tobytes()
            for d in range(4):  # both devices of data group d hold rows [4d, 4d+4)
                pair = mesh.devices[d]
                held = {
                    s.device: range(16)[s.index[0]]
                    for s in array.addressable_shards
                    if s.device in set(pair)
                }
                assert held[pair[0]] == held[pair[1]] == range(4 * d, 4 * d + 4)


@check
def three_axis_mesh_pair_form():
    """("data", "fsdp", "tensor") with rows over ("data", "fsdp"), given as (mesh, spec)."""
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"))
    it = iter(zj.Loader(DATASET, sharding=(mesh, P(("data", "fsdp"))), device_prefetch=3))
    batches = take(it, STEPS)
    assert_equal_to_reference(batches)
    shard = batches[0]["tokens"].addressable_shards[0]
    assert shard.data.shape == (4, REFERENCE[0]["tokens"].shape[1])


@check
def per_field_shardings():
    """A dict of shardings: one field also split along its sequence axis, one replicated."""
    mesh = jax.make_mesh((4, 2), ("data", "tensor"))
    shardings = {
        "tokens": NamedSharding(mesh, P("data", "tensor")),
        "tokens_segment_ids": NamedSharding(mesh, P("data")),
        "tokens_positions": (mesh, P()),
    }
    batches = take(iter(zj.Loader(DATASET, sharding=shardings)), STEPS)
    assert_equal_to_reference(batches)
    seq = REFERENCE[0]["tokens"].shape[1]
    assert batches[0]["tokens"].addressable_shards[0].data.shape == (4, seq // 2)
    assert batches[0]["tokens_positions"].addressable_shards[0].data.shape == (16, seq)


@check
def state_from_mesh_restores_on_one_device():
    """A state taken on 8 devices with prefetch continues on the numpy loader, and back."""
    mesh = jax.make_mesh((8,), ("data",))
    it = iter(zj.Loader(DATASET, sharding=NamedSharding(mesh, P("data")), device_prefetch=3))
    take(it, 5)
    state = it.get_state()
    assert state["step"] == 5 and sorted(int(k) for k in state["lanes"]) == list(range(16))
    plain = iter(zj.Loader(DATASET))
    plain.set_state(state)
    sixth = next(plain)
    assert all(sixth[k].tobytes() == REFERENCE[5][k].tobytes() for k in REFERENCE[5])
    take(plain, 2)
    other = iter(zj.Loader(DATASET, sharding=NamedSharding(mesh, P("data"))))
    other.set_state(plain.get_state())
    assert_equal_to_reference(take(other, STEPS - 8), first=8)


@check
def batch_not_divisible_by_shards():
    mesh = jax.make_mesh((8,), ("data",))
    dataset = make_pipeline().dataset.batch(12, num_lanes=4)
    try:
        zj.Loader(dataset, sharding=NamedSharding(mesh, P("data")))
    except zj.PipelineError as e:
        assert "8 shards" in str(e) and "global_batch_size=12" in str(e), str(e)
    else:
        raise AssertionError("a batch of 12 rows over 8 shards was accepted")


def main(out_path: str) -> None:
    assert jax.device_count() == 8, jax.devices()
    results = {}
    for name, fn in CHECKS.items():
        try:
            fn()
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc()
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
