"""A Flax NNX transformer trained on zephon_jax batches, checkpointed and resumed with Orbax.

A tiny byte-level causal transformer trains on packed rows of synthetic text.
Each token attends only to earlier tokens of its own document
(``zj.segment_mask``), and the loss counts only the positions ``to_training``
marks. One Orbax ``CheckpointManager`` saves the model, the optimizer and the
loader position together every ``--save-every`` steps. Run it again with the
same ``--workdir`` and a larger ``--steps`` and it continues from the latest
checkpoint, on any number of devices, with exactly the batches (and, up to
float rounding, the losses) of an uninterrupted run::

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
        python examples/flax_nnx_train.py --workdir /tmp/nnx --steps 6
    XLA_FLAGS=--xla_force_host_platform_device_count=4 \\
        python examples/flax_nnx_train.py --workdir /tmp/nnx --steps 8

It first says whether it starts afresh or resumes; then each step prints one
JSON line: the step, the loss and a digest of the batch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zephon_jax as zj
import zephon_jax.checkpoint as zc

WORDS = "the a data loader packs rows of text into batches for every device in a mesh".split()
VOCAB = 256


def make_documents(num_docs: int, seed: int = 0) -> list[str]:
    """Synthetic sentences of 3 to 30 words."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(3, 30)))) + "." for _ in range(num_docs)]


def encode(text: str) -> dict[str, np.ndarray]:
    """Bytes of the text as int32 tokens (a byte-level vocabulary of 256)."""
    return {"tokens": np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int32)}


def make_dataset(batch_size: int, seq_len: int) -> zj.BatchedDataset:
    """Packed rows as inputs, targets, loss_mask, segment_ids and positions."""
    return (
        zj.Dataset.source(make_documents(2000))
        .shuffle(seed=0)
        .map(encode)
        .split(seq_len)
        .pack(seq_len, method="best_fit", num_bins=8)
        .to_training(pad_id=0)
        .batch(batch_size)
    )


class Block(nnx.Module):
    """Pre-norm self-attention and MLP."""

    def __init__(self, width: int, heads: int, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(width, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(
            num_heads=heads, in_features=width, decode=False, rngs=rngs
        )
        self.norm2 = nnx.LayerNorm(width, rngs=rngs)
        self.up = nnx.Linear(width, 4 * width, rngs=rngs)
        self.down = nnx.Linear(4 * width, width, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        x = x + self.attention(self.norm1(x), mask=mask)
        return x + self.down(nnx.gelu(self.up(self.norm2(x))))


class Transformer(nnx.Module):
    """Token and position embeddings, ``layers`` blocks, a projection to the vocabulary."""

    def __init__(self, seq_len: int, width: int, layers: int, heads: int, rngs: nnx.Rngs):
        self.tokens = nnx.Embed(VOCAB, width, rngs=rngs)
        self.positions = nnx.Embed(seq_len, width, rngs=rngs)
        self.blocks = nnx.List([Block(width, heads, rngs) for _ in range(layers)])
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.out = nnx.Linear(width, VOCAB, rngs=rngs)

    def __call__(self, batch: dict[str, jax.Array]) -> jax.Array:
        x = self.tokens(batch["inputs"]) + self.positions(batch["positions"])
        mask = zj.segment_mask(batch["segment_ids"])  # causal, within each document
        for block in self.blocks:
            x = block(x, mask)
        return self.out(self.norm(x))


def loss_fn(model: Transformer, batch: dict[str, jax.Array]) -> jax.Array:
    """Mean cross-entropy over the positions whose ``loss_mask`` is 1."""
    logits = model(batch)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
    mask = batch["loss_mask"]
    return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)


@nnx.jit
def train_step(model: Transformer, optimizer: nnx.Optimizer, batch: dict[str, jax.Array]):
    loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
    optimizer.update(model, grads)
    return loss


def make_model(args: argparse.Namespace) -> tuple[Transformer, nnx.Optimizer]:
    """The model and its optimizer, initialized from a fixed seed."""
    model = Transformer(args.seq_len, args.width, args.layers, args.heads, nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
    return model, optimizer


def batch_digest(batch: dict[str, jax.Array]) -> str:
    """A digest of the whole global batch."""
    h = hashlib.sha256()
    for name in sorted(batch):
        h.update(name.encode() + np.asarray(batch[name]).tobytes())
    return h.hexdigest()[:16]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True, help="checkpoints go to WORKDIR/checkpoints")
    p.add_argument("--steps", type=int, default=8, help="train until this step")
    p.add_argument("--save-every", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    mesh = zj.data_mesh()  # one Auto axis over every device
    loader = zj.Loader(make_dataset(args.batch_size, args.seq_len), sharding=(mesh, P("data")))
    it = iter(loader)
    model, optimizer = make_model(args)
    replicated = NamedSharding(mesh, P())
    state = jax.device_put(nnx.state((model, optimizer)), replicated)
    nnx.update((model, optimizer), state)

    options = ocp.CheckpointManagerOptions(save_interval_steps=args.save_every, max_to_keep=2)
    directory = Path(args.workdir).absolute() / "checkpoints"
    with ocp.CheckpointManager(directory, options=options) as mngr:
        start = mngr.latest_step()
        where = f"{jax.device_count()} device(s)"
        if start is None:
            print(f"no checkpoint in {directory}: training from step 1 on {where}")
        else:
            print(f"resumed from step {start} in {directory} on {where}")
            abstract = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                nnx.state((model, optimizer)),
            )
            restored = mngr.restore(
                start,
                args=ocp.args.Composite(
                    model=ocp.args.StandardRestore(abstract), data=zc.Restore(it)
                ),
            )
            nnx.update((model, optimizer), restored["model"])
        for step in range((start or 0) + 1, args.steps + 1):
            batch = next(it)
            loss = train_step(model, optimizer, batch)
            mngr.save(
                step,
                args=ocp.args.Composite(
                    model=ocp.args.StandardSave(nnx.state((model, optimizer))),
                    data=zc.Save(it),
                ),
                force=step == args.steps,
            )
            line = {"step": step, "loss": float(loss), "batch": batch_digest(batch)}
            print(json.dumps(line), flush=True)
        mngr.wait_until_finished()
    it.close()


if __name__ == "__main__":
    main()
