"""A plain-JAX training loop that checkpoints its model and its zephon_jax loader together.

A byte-level next-token predictor (an embedding and a linear layer) trains on
packed rows of synthetic text. Every ``--save-every`` steps one Orbax
``CheckpointManager`` saves the parameters and the loader position. Run it
again with the same ``--workdir`` and a larger ``--steps`` and it continues
from the latest checkpoint, on any number of devices or processes, with exactly
the batches the uninterrupted run would have seen::

    python examples/train_loop.py --workdir /tmp/run --steps 6
    XLA_FLAGS=--xla_force_host_platform_device_count=4 \\
        python examples/train_loop.py --workdir /tmp/run --steps 10

It first says whether it starts afresh or resumes (and from which step, on how
many devices); then each step prints one JSON line: the step, the loss and a
digest of the batch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zephon_jax as zj
import zephon_jax.checkpoint as zc

WORDS = "the a data loader packs rows of text into batches for every device in a mesh".split()


def make_documents(num_docs: int, seed: int = 0) -> list[str]:
    """Synthetic sentences of 3 to 40 words."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(3, 40)))) + "." for _ in range(num_docs)]


def encode(text: str) -> dict[str, np.ndarray]:
    """Bytes of the text as int32 tokens (a byte-level vocabulary of 256)."""
    return {"tokens": np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int32)}


def make_dataset(batch_size: int, seq_len: int) -> zj.BatchedDataset:
    return (
        zj.Dataset.source(make_documents(2000))
        .shuffle(seed=0)
        .map(encode)
        .split(seq_len)
        .pack(seq_len, method="best_fit", num_bins=8)
        .window_shuffle(16, seed=1)
        .batch(batch_size)
    )


def init_params(key: jax.Array, width: int) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {
        "embed": jax.random.normal(k1, (256, width)) * 0.1,
        "out": jax.random.normal(k2, (width, 256)) * 0.1,
    }


def loss_fn(params: dict[str, jax.Array], batch: dict[str, jax.Array]) -> jax.Array:
    """Mean cross-entropy of each next byte within the same packed segment."""
    tokens, segments = batch["tokens"], batch["tokens_segment_ids"]
    inputs = jax.nn.one_hot(tokens[:, :-1], 256)  # a matmul, which shards like the batch
    logits = inputs @ params["embed"] @ params["out"]
    targets = tokens[:, 1:]
    mask = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] > 0)
    log_probs = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1)


@jax.jit
def train_step(params, batch, learning_rate=4.0):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    params = jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)
    return params, loss


def batch_digest(batch: dict[str, jax.Array]) -> str | None:
    """A digest of the whole global batch (None if this process does not hold all of it)."""
    if not all(getattr(a, "is_fully_addressable", True) for a in batch.values()):
        return None
    h = hashlib.sha256()
    for name in sorted(batch):
        h.update(name.encode() + np.asarray(batch[name]).tobytes())
    return h.hexdigest()[:16]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True, help="checkpoints go to WORKDIR/checkpoints")
    p.add_argument("--steps", type=int, default=8, help="train until this step")
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--width", type=int, default=32)
    args = p.parse_args(argv)

    mesh = zj.data_mesh()  # one Auto "data" axis over every device
    batch_sharding = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())
    loader = zj.Loader(make_dataset(args.batch_size, args.seq_len), sharding=batch_sharding)
    it = iter(loader)
    params = jax.device_put(init_params(jax.random.key(0), args.width), replicated)

    options = ocp.CheckpointManagerOptions(save_interval_steps=args.save_every, max_to_keep=2)
    directory = Path(args.workdir).absolute() / "checkpoints"
    with ocp.CheckpointManager(directory, options=options) as mngr:
        start = mngr.latest_step()
        where = f"{jax.device_count()} device(s), {jax.process_count()} process(es)"
        if jax.process_index() == 0:
            if start is None:
                print(f"no checkpoint in {directory}: training from step 1 on {where}")
            elif start >= args.steps:
                print(f"the checkpoint in {directory} is at step {start}: nothing to do")
            else:
                print(
                    f"resumed from the checkpoint of step {start} in {directory} on {where}: "
                    f"continuing with step {start + 1}, the batches of an uninterrupted run"
                )
        if start is not None:
            abstract = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), params
            )
            restored = mngr.restore(
                start,
                args=ocp.args.Composite(
                    params=ocp.args.StandardRestore(abstract), data=zc.Restore(it)
                ),
            )
            params = restored["params"]
        for step in range((start or 0) + 1, args.steps + 1):
            batch = next(it)
            params, loss = train_step(params, batch)
            mngr.save(
                step,
                args=ocp.args.Composite(params=ocp.args.StandardSave(params), data=zc.Save(it)),
                force=step == args.steps,
            )
            if jax.process_index() == 0:
                line = {"step": step, "loss": float(loss), "batch": batch_digest(batch)}
                print(json.dumps(line), flush=True)
        mngr.wait_until_finished()
    it.close()


if __name__ == "__main__":
    main()
