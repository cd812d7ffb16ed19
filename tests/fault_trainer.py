"""A training loop that checkpoints its loader with Orbax, started (and killed) by the tests.

Trains a one-number "model" (the running sum of every batch's tokens, as int32)
on :func:`make_pipeline` through ``Loader(sharding=...)`` on one CPU device, and
saves model and loader with ``CheckpointManager`` every ``--save-every`` steps,
synchronously or asynchronously. It handles SIGTERM the way ``docs/distributed.md``
recommends: the handler only sets a flag; the loop ends the step it is in, saves
that step (``force=True``), waits for every save and exits with status 0.

The save of step ``--stall-at`` is made to be in flight at a known moment: the
loader item's writer, replaced here, writes half of the lane files (``--stall-in
lanes``) or all of the item (``--stall-in finalize``: Orbax has not yet renamed the
step's temporary directory), prints ``MID-SAVE <step>`` and waits ``--stall-s``
seconds before it goes on. A test that reads that line knows a save is in flight
and sends its signal then.

Each step prints one JSON line: ``{"step": t, "digest": ..., "model": ...}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import sys
import threading
import time

import numpy as np

STEPS = 12


def make_pipeline():
    import zephon_jax as zj

    rng = np.random.default_rng(3)
    docs = [
        {"tokens": rng.integers(1, 1000, int(n), dtype=np.int32)} for n in rng.integers(1, 90, 400)
    ]
    return (
        zj.Dataset.source(docs)
        .shuffle(5)
        .split(32)
        .pack(32, method="best_fit", num_bins=4)
        .window_shuffle(4, seed=6)
        .batch(8)
    )


def digest(batch) -> str:
    h = hashlib.sha256()
    for name in sorted(batch):
        h.update(name.encode() + np.asarray(batch[name]).tobytes())
    return h.hexdigest()[:16]


def model_after(batches) -> int:
    """The model after training on ``batches`` (int32 wrap-around, as on the device)."""
    total = np.int32(0)
    for batch in batches:
        total = np.int32(total + np.asarray(batch["tokens"], np.int32).sum(dtype=np.int32))
    return int(total)


_SAY = threading.Lock()


def say(text: str) -> None:
    """Prints one whole line: the save thread of an async checkpoint prints too, and a
    plain ``print`` writes the text and its newline apart, so two lines could interleave."""
    with _SAY:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def stall_save(stall_at: int, stall_in: str, stall_s: float) -> None:
    """Makes the save of step ``stall_at`` stop in flight (see the module doc)."""
    import zephon_jax.checkpoint as zc

    write = zc.LoaderCheckpointHandler._write

    def stalling_write(directory, lanes, meta):
        if meta is None or meta["step"] != stall_at:
            write(directory, lanes, meta)
            return
        items = list(lanes.items())
        if stall_in == "lanes":
            write(directory, dict(items[: len(items) // 2]), None)
        else:
            write(directory, lanes, meta)
        say(f"MID-SAVE {stall_at}")
        time.sleep(stall_s)
        if stall_in == "lanes":
            write(directory, dict(items[len(items) // 2 :]), meta)

    zc.LoaderCheckpointHandler._write = staticmethod(stalling_write)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("directory")
    p.add_argument("--mode", choices=["sync", "async"], default="sync")
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--save-every", type=int, default=3)
    p.add_argument("--stall-at", type=int, default=0, help="0: no stall")
    p.add_argument("--stall-in", choices=["lanes", "finalize"], default="lanes")
    p.add_argument("--stall-s", type=float, default=600.0)
    args = p.parse_args()

    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from jax.sharding import NamedSharding, PartitionSpec

    import zephon_jax as zj
    import zephon_jax.checkpoint as zc

    if args.stall_at:
        stall_save(args.stall_at, args.stall_in, args.stall_s)
    # The recommended preemption pattern: note the signal, act on it between steps.
    preempted = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: preempted.set())

    mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
    it = iter(zj.Loader(make_pipeline(), sharding=NamedSharding(mesh, PartitionSpec("data"))))
    model = {"sum": jnp.zeros((), jnp.int32)}
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=args.save_every, enable_async_checkpointing=args.mode == "async"
    )
    with ocp.CheckpointManager(args.directory, options=options) as mngr:
        start = mngr.latest_step() or 0
        if start:
            restored = mngr.restore(
                start,
                args=ocp.args.Composite(model=ocp.args.StandardRestore(model), data=zc.Restore(it)),
            )
            model = restored["model"]
        for step in range(start + 1, args.steps + 1):
            batch = next(it)
            model = {"sum": model["sum"] + batch["tokens"].sum(dtype=jnp.int32)}
            stop = preempted.is_set()
            mngr.save(
                step,
                args=ocp.args.Composite(model=ocp.args.StandardSave(model), data=zc.Save(it)),
                force=stop,
            )
            line = {"step": step, "digest": digest(batch), "model": int(model["sum"])}
            say(json.dumps(line))
            if stop:
                break  # this step is saved (or being saved): leave
        mngr.wait_until_finished()
    it.close()
    say("PREEMPTED" if preempted.is_set() else "DONE")


if __name__ == "__main__":
    main()
