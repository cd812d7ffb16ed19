"""One process of a multi-process (or multi-device) zephon_jax run, started by the tests.

Runs the packing pipeline of :func:`make_pipeline` through ``Loader(sharding=...)``
on a mesh over every process's CPU devices, and writes to ``--out`` (JSON), for
every step, the digest of every row each addressable shard holds. Optionally
saves through ``orbax.checkpoint.CheckpointManager`` at ``--save-at`` and then
waits to be killed (``--hold``), or resumes from ``--resume-from``.

The device count must be set before jax starts, so this is a script of its own::

    python mp_worker.py --devices 2 --process-id 0 --num-processes 4 --port 1234 ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

GLOBAL_BATCH = 16
SEQ_LEN = 24
# With --schedule: the staged token-weighted mixture pipeline of pipelines.py, ramped up.
SCHEDULE_SIZES = {0: 8, 4: 16, 9: 32}


def make_pipeline(num_epochs: int | None = None):
    """A mixture -> shuffle -> split -> pack -> window_shuffle pipeline, batch 16.

    With ``num_epochs`` the sources are read that many times and the stream ends.
    """
    import zephon_jax as zj

    rng = np.random.default_rng(7)
    long_docs = [
        {"tokens": rng.integers(1, 30_000, int(n), dtype=np.int32)}
        for n in rng.integers(1, 60, 300)
    ]
    short_docs = [
        {"tokens": rng.integers(1, 30_000, int(n), dtype=np.int32)}
        for n in rng.integers(1, 12, 200)
    ]
    mixed = zj.Dataset.mix(
        [zj.Dataset.source(long_docs), zj.Dataset.source(short_docs)], [0.6, 0.4]
    )
    return (
        mixed.shuffle(11)
        .repeat(num_epochs)
        .split(SEQ_LEN)
        .pack(SEQ_LEN, method="best_fit", num_bins=4)
        .window_shuffle(5, seed=3)
        .batch(GLOBAL_BATCH)
    )


def row_digest(fields: dict[str, np.ndarray]) -> str:
    """Digest of one row: every field's name, dtype, shape and bytes."""
    h = hashlib.sha256()
    for name in sorted(fields):
        value = np.ascontiguousarray(fields[name])
        h.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
        h.update(value.tobytes())
    return h.hexdigest()[:24]


def batch_digests(batch: dict[str, np.ndarray]) -> list[str]:
    """Row digests of a whole numpy batch."""
    n = len(next(iter(batch.values())))
    return [row_digest({k: v[r] for k, v in batch.items()}) for r in range(n)]


def shard_digests(batch) -> tuple[dict[int, list[str]], dict[int, list[int]]]:
    """Digests of the rows held by this process's devices (replicas each count)."""
    per_device: dict[int, dict[int, dict[str, np.ndarray]]] = {}
    for name, array in batch.items():
        for shard in array.addressable_shards:
            if shard.data.shape[1:] != array.shape[1:]:
                raise AssertionError(f"field {name}: trailing axes are sharded, not expected here")
            rows = range(array.shape[0])[shard.index[0]]
            data = np.asarray(shard.data)
            held = per_device.setdefault(shard.device.id, {})
            for i, r in enumerate(rows):
                held.setdefault(r, {})[name] = data[i]
    digests: dict[int, list[str]] = {}
    device_rows: dict[int, list[int]] = {}
    for device, rows in sorted(per_device.items()):
        device_rows[device] = sorted(rows)
        for r, fields in rows.items():
            digests.setdefault(r, []).append(row_digest(fields))
    return digests, device_rows


def parse_mesh(text: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``"data=4,tensor=2"`` -> ``((4, 2), ("data", "tensor"))``."""
    names, sizes = [], []
    for part in text.split(","):
        name, size = part.split("=")
        names.append(name)
        sizes.append(int(size))
    return tuple(sizes), tuple(names)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, required=True, help="CPU devices of this process")
    p.add_argument("--process-id", type=int, default=0)
    p.add_argument("--num-processes", type=int, default=1)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--mesh", required=True, help="e.g. data=2,fsdp=2,tensor=2")
    p.add_argument("--batch-axes", required=True, help="mesh axes the rows are split over")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--workers", type=int, default=0, help="loader worker processes")
    p.add_argument("--fresh", action="store_true", help="run steps 1..steps from the start")
    p.add_argument("--ckpt", help="CheckpointManager directory")
    p.add_argument("--save-at", type=int, help="save at this step (with --fresh)")
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--hold", action="store_true", help="after saving, wait to be killed")
    p.add_argument("--resume", action="store_true", help="restore the latest step of --ckpt")
    p.add_argument("--epochs", type=int, help="read the sources this many times, then stop")
    p.add_argument("--schedule", action="store_true", help="staged mixture + batch ramp-up")
    p.add_argument("--from-state", help="a state file (zj.save_state) to continue from")
    p.add_argument("--skip", type=int, default=0, help="with --from-state: skip this many")
    p.add_argument("--to-end", action="store_true", help="run a finite input (--epochs) out")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if args.num_processes > 1:
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{args.port}",
            num_processes=args.num_processes,
            process_id=args.process_id,
            initialization_timeout=120,
        )
    import orbax.checkpoint as ocp
    from jax.sharding import NamedSharding, PartitionSpec

    import zephon_jax as zj
    import zephon_jax.checkpoint as zc

    assert jax.process_count() == args.num_processes and len(jax.local_devices()) == args.devices
    shape, names = parse_mesh(args.mesh)
    mesh = jax.make_mesh(shape, names, devices=jax.devices())
    batch_axes = tuple(args.batch_axes.split(","))
    spec = PartitionSpec(batch_axes if len(batch_axes) > 1 else batch_axes[0])
    sharding = NamedSharding(mesh, spec)
    if args.schedule:
        from pipelines import schedule_pipeline

        dataset = schedule_pipeline(sizes=SCHEDULE_SIZES)
    else:
        dataset = make_pipeline(args.epochs)
    params_sharding = NamedSharding(mesh, PartitionSpec(spec[0]))
    params = {
        "w": jax.make_array_from_callback(
            (8,), params_sharding, lambda index: np.arange(8, dtype=np.float32)[index]
        )
    }
    out: dict = {"process": jax.process_index(), "runs": {}}

    def loader():
        return zj.Loader(
            dataset,
            sharding=sharding,
            device_prefetch=args.prefetch,
            num_workers=args.workers,
            worker_timeout_s=60.0,
        )

    def record(it, run: str, first: int) -> None:
        steps = {}
        for step in range(first, args.steps + 1):
            batch = next(it, None)
            if batch is None:
                break
            assert it.step == step
            digests, device_rows = shard_digests(batch)
            steps[step] = digests
            if step == first:
                out["device_rows"] = device_rows
            if args.save_at == step:
                manager.save(
                    step,
                    args=ocp.args.Composite(state=ocp.args.StandardSave(params), data=zc.Save(it)),
                )
                if args.hold:
                    break
        out["runs"][run] = steps

    manager = None
    if args.ckpt:
        options = ocp.CheckpointManagerOptions(enable_async_checkpointing=args.async_save)
        manager = ocp.CheckpointManager(args.ckpt, options=options)
    if args.fresh:
        it = iter(loader())
        out["rows"] = list(it.loader.rows_at(it.step))
        out["lanes"] = it.loader.lanes
        out["lanes_to_save"] = it.loader.lanes_to_save()
        record(it, "fresh", 1)
    if args.resume:
        it = iter(loader())
        out["rows"] = list(it.loader.rows_at(it.step))
        step = manager.latest_step()
        abstract = {"w": jax.ShapeDtypeStruct((8,), np.float32, sharding=params_sharding)}
        restored = manager.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), data=zc.Restore(it)),
        )
        assert restored["data"] is it and it.step == step
        local = [np.asarray(s.data) for s in restored["state"]["w"].addressable_shards]
        expected = [np.arange(8, dtype=np.float32)[s.index] for s in params["w"].addressable_shards]
        out["params_restored"] = all(np.array_equal(a, b) for a, b in zip(local, expected))
        out["restored_step"] = step
        record(it, "resumed", step + 1)
    if args.from_state:  # restore, skip, run on, report the accounting
        it = iter(loader())
        it.set_state(zj.load_state(args.from_state))
        it.skip(args.skip)
        record(it, "from_state", it.step + 1)
        out["accounting"] = it.accounting()
    if args.to_end:  # the state and accounting after the last batch and after the end
        it = iter(loader())
        out["rows"] = list(it.loader.rows_at(it.step))
        for _ in it:
            zj.save_state(it.get_state(), args.out + ".last.zjs")
            out["last"] = {"step": it.step, "accounting": it.accounting()}
        zj.save_state(it.get_state(), args.out + ".after.zjs")
        out["after"] = {
            "step": it.step,
            "accounting": it.accounting(),
            "provenance": it.provenance(),  # still that of the last batch
        }
    if manager is not None:
        manager.wait_until_finished()
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, args.out)
    if args.hold:
        while True:  # the test kills this process: nothing after the save may be needed
            time.sleep(1)
    if manager is not None:
        manager.close()
    if args.num_processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
