"""Checks of a batch-size ramp-up through ``Loader(sharding=...)`` on 8 simulated CPU devices.

``tests/integration/test_schedules.py`` runs this script in a subprocess (the device count is
fixed when jax starts); it writes ``{check name: "ok" or the traceback}`` as
JSON to the path given as its argument.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback

import numpy as np

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import zephon_jax as zj  # noqa: E402
import zephon_jax.checkpoint as zc  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pipelines import schedule_pipeline  # noqa: E402

STEPS = 16
SIZES = {0: 8, 5: 16, 11: 32}
DATASET = schedule_pipeline(sizes=SIZES)
REFERENCE = [b for _, b in zip(range(STEPS), zj.Loader(DATASET))]
CHECKS = {}


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def data_sharding(shards: int, model: int = 1) -> NamedSharding:
    devices = np.array(jax.devices()[: shards * model]).reshape(shards, model)
    mesh = jax.sharding.Mesh(devices, ("data", "model"))
    return NamedSharding(mesh, P("data"))


def assert_equal_to_reference(batches, first: int = 0) -> None:
    for t, batch in enumerate(batches, start=first):
        ref = REFERENCE[t]
        assert sorted(batch) == sorted(ref), (sorted(batch), sorted(ref))
        for name, array in batch.items():
            assert isinstance(array, jax.Array), type(array)
            assert array.shape == (SIZES[max(s for s in SIZES if s <= t)], 48), array.shape
            got = np.asarray(array)
            assert got.dtype == ref[name].dtype and got.shape == ref[name].shape, name
            assert got.tobytes() == ref[name].tobytes(), f"step {t}, field {name}"


@check
def meshes_of_one_to_eight_devices():
    for shards in (1, 2, 4, 8):
        for prefetch in (0, 2):
            loader = zj.Loader(DATASET, sharding=data_sharding(shards), device_prefetch=prefetch)
            assert_equal_to_reference([next(it) for it in [iter(loader)] for _ in range(STEPS)])


@check
def replicated_model_axis():
    it = iter(zj.Loader(DATASET, sharding=data_sharding(4, model=2)))
    batches = [next(it) for _ in range(STEPS)]
    assert_equal_to_reference(batches)
    shard = batches[12]["tokens"].addressable_shards[0]
    assert shard.data.shape == (8, 48)  # 32 rows over 4 data shards


@check
def state_from_eight_devices_resumes_on_two_across_a_size_change():
    for save_at in (4, 5, 11):
        it = iter(zj.Loader(DATASET, sharding=data_sharding(8), device_prefetch=2))
        for _ in range(save_at):
            next(it)
        state = it.get_state()
        other = iter(zj.Loader(DATASET, sharding=data_sharding(2)))
        other.set_state(state)
        assert_equal_to_reference([next(other) for _ in range(STEPS - save_at)], first=save_at)


@check
def orbax_checkpoint_on_eight_restores_on_two_and_numpy():
    with tempfile.TemporaryDirectory() as tmp:
        it = iter(zj.Loader(DATASET, sharding=data_sharding(8), device_prefetch=2))
        with ocp.CheckpointManager(tmp) as mngr:
            for step in range(1, 12):
                next(it)
                if step in (5, 10):
                    mngr.save(step, args=ocp.args.Composite(data=zc.Save(it)))
            mngr.wait_until_finished()
            for step in (5, 10):
                restored = iter(zj.Loader(DATASET, sharding=data_sharding(2), device_prefetch=2))
                mngr.restore(step, args=ocp.args.Composite(data=zc.Restore(restored)))
                assert restored.step == step
                assert_equal_to_reference([next(restored) for _ in range(4)], first=step)
            plain = iter(zj.Loader(DATASET, process_index=1, process_count=2))
            mngr.restore(10, args=ocp.args.Composite(data=zc.Restore(plain)))
            for t in range(10, 14):
                half = SIZES[max(s for s in SIZES if s <= t)] // 2
                got = next(plain)
                assert got["tokens"].tobytes() == REFERENCE[t]["tokens"][half:].tobytes()


@check
def size_not_divisible_by_shards_is_rejected():
    ds = schedule_pipeline(sizes={0: 8, 5: 12}, num_lanes=4)
    try:
        zj.Loader(ds, sharding=data_sharding(8))
    except zj.PipelineError as e:
        assert "does not divide global_batch_size=12" in str(e), str(e)
    else:
        raise AssertionError("a ramp size of 12 over 8 shards was accepted")


def main() -> None:
    results = {}
    for name, fn in CHECKS.items():
        try:
            fn()
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc()
    with open(sys.argv[1], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
