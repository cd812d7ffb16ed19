"""Writes the example notebooks from the cell sources below, optionally executing them.

Usage::

    python notebooks/_build_notebooks.py              # write the notebooks, no outputs
    python notebooks/_build_notebooks.py --execute    # write, then run each at full size
    python notebooks/_build_notebooks.py --execute 02_elastic_resume.ipynb
    python notebooks/_build_notebooks.py --execute --figures   # also docs/_static/*.png
    python notebooks/_build_notebooks.py --keep-outputs   # new sources, committed outputs

Edit the notebooks here, not in Jupyter, so that they stay easy to review. Every
notebook reads ``ZEPHON_NB_STEPS`` to choose its size; the tests run them small.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

COLAB_INSTALL = """\
# Installs zephon_jax only when it is missing (in Colab, for example): from the package
# index once it is released there; until then from ZEPHON_JAX_SOURCE, a wheel path
# ("/content/zephon_jax-0.1.0-py3-none-any.whl") or a VCS URL
# ("git+https://github.com/OWNER/zephon_jax"). Set it below and run this cell.
import importlib.util
import subprocess
import sys

ZEPHON_JAX_SOURCE = ""


class ZephonJaxMissing(Exception):
    def _render_traceback_(self):  # Jupyter and Colab show this message, no traceback
        return [f"ZephonJaxMissing: {self}"]


if importlib.util.find_spec("zephon_jax") is not None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        print(f"zephon_jax {version('zephon_jax')} is installed")
    except PackageNotFoundError:
        print("zephon_jax is importable from", importlib.util.find_spec("zephon_jax").origin)
else:
    requirement = ZEPHON_JAX_SOURCE.strip() or "zephon_jax"
    print(f"installing {requirement} ...")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-color", requirement]
    result = subprocess.run(pip, capture_output=True, text=True)
    if result.returncode != 0:
        if ZEPHON_JAX_SOURCE.strip():
            hint = f"check ZEPHON_JAX_SOURCE = {ZEPHON_JAX_SOURCE!r} (a wheel path or a VCS URL)"
        else:
            hint = (
                "it may not be on the package index yet: set ZEPHON_JAX_SOURCE in this cell "
                "to a wheel path or a VCS URL and run the cell again"
            )
        pip_said = [line for line in result.stderr.splitlines() if line.strip()] or ["nothing"]
        message = f"pip could not install it; {hint}. pip said: {pip_said[-1].strip()}"
        raise ZephonJaxMissing(message)  # stops "run all" here
    importlib.invalidate_caches()
    print(f"installed zephon_jax from {requirement}")
"""

# Notebook 04 also needs a tokenizer library and Jinja (its chat template): the same
# packages as the `notebooks` extra, installed by its install cell when missing.
LLM_SFT_NEEDS = """
# This notebook also trains a tokenizer (tokenizers), wraps it for chat (transformers)
# and renders its chat template (jinja2): installed here when missing.
needs = {
    "tokenizers": "tokenizers>=0.19",
    "transformers": "transformers>=4.45",
    "jinja2": "jinja2>=3.1",
}
missing = [req for module, req in needs.items() if importlib.util.find_spec(module) is None]
if missing:
    print(f"installing {' '.join(missing)} ...")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-color", *missing]
    result = subprocess.run(pip, capture_output=True, text=True)
    if result.returncode != 0:
        pip_said = [line for line in result.stderr.splitlines() if line.strip()] or ["nothing"]
        message = f"pip could not install {' '.join(missing)}. pip said: {pip_said[-1].strip()}"
        raise ZephonJaxMissing(message)  # stops "run all" here
    importlib.invalidate_caches()
    print(f"installed {' '.join(missing)}")
"""


def _devices_cell(default_steps: int, extra: str = "") -> str:
    return (
        f"""\
import os

# Eight simulated CPU devices; this must happen before jax is imported.
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

# Size of the run; the test suite sets ZEPHON_NB_STEPS to run the notebook small.
STEPS = int(os.environ.get("ZEPHON_NB_STEPS", {default_steps}))
"""
        + extra
    )


# --------------------------------------------------------------------------------------
# 01: quickstart
# --------------------------------------------------------------------------------------
QUICKSTART = [
    (
        "md",
        """\
        # zephon_jax quickstart

        A source, a pipeline with packing, a loader that yields global `jax.Array`s
        sharded over a device mesh, and a checkpoint taken on 8 devices and restored on
        4, in a few cells. The batches after the restore are the same, bit for bit.
        """,
    ),
    ("code", COLAB_INSTALL),
    ("code", _devices_cell(40)),
    (
        "code",
        """\
        import sys

        import jax
        import numpy as np
        import orbax.checkpoint as ocp
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        import zephon_jax as zj
        import zephon_jax.checkpoint
        from zephon_jax.tools.corpus import builtin_corpus
        from zephon_jax.tools.tokenizers import byte_detokenize

        print(jax.devices())
        """,
    ),
    (
        "md",
        """\
        ## A source

        Any random-access source works (`__len__` and `__getitem__`): a list of dicts,
        a `grain.sources.ArrayRecordDataSource`, or a `TokenStore`. The built-in corpus
        is the Python standard library's own source files, tokenized byte-level into a
        `TokenStore`, so this runs offline. It is prepared on first use (about ten
        seconds, with a progress bar) and read from a cache afterwards.
        """,
    ),
    (
        "code",
        """\
        source = builtin_corpus(stream=sys.stdout)  # progress while it is prepared
        print(f"{len(source)} documents, {source.num_tokens:,} tokens")
        print(byte_detokenize(source[0]["tokens"][:200]))
        """,
    ),
    (
        "md",
        """\
        ## A pipeline with packing

        Shuffle the documents, cut those longer than a row into pieces, and pack the
        pieces into rows of 256 tokens with best-fit over 16 open rows per lane. Every
        step is either a pure function of a record position or an operator with an
        explicit, bounded carry; nothing depends on the devices.
        """,
    ),
    (
        "code",
        """\
        SEQ_LEN, GLOBAL_BATCH = 256, 16

        dataset = (
            zj.Dataset.source(source)
            .shuffle(seed=0)
            .split(SEQ_LEN)
            .pack(SEQ_LEN, method="best_fit", num_bins=16)
            .batch(GLOBAL_BATCH)
        )
        dataset
        """,
    ),
    (
        "md",
        """\
        ## A sharded loader

        Give the loader the batch sharding. Each process loads exactly the rows its
        devices hold and the loader returns global `jax.Array`s.
        """,
    ),
    (
        "code",
        """\
        def data_sharding(num_devices):
            mesh = Mesh(np.array(jax.devices()[:num_devices]), ("data",))
            return NamedSharding(mesh, PartitionSpec("data"))


        it = iter(zj.Loader(dataset, sharding=data_sharding(8)))
        batch = next(it)
        for name, array in batch.items():
            print(f"{name:20s} {array.shape} {array.dtype} {array.sharding.spec}")
        rows_of = batch["tokens"].sharding.devices_indices_map((GLOBAL_BATCH, SEQ_LEN))
        print(
            "rows per device:",
            {device.id: (index[0].start, index[0].stop) for device, index in rows_of.items()},
        )
        """,
    ),
    (
        "code",
        """\
        # A few more steps. Most rows are 256-token pieces of long files; the last
        # pieces of files share rows, and padding fills what is left.
        fill = []
        for _ in range(STEPS - 1):
            batch = next(it)
            fill.append(np.mean(np.asarray(batch["tokens_segment_ids"]) > 0))
        print(f"after {it.step} steps: fill {np.mean(fill):.2%} (real tokens / row tokens)")
        print("row 0 of the last batch:")
        print(byte_detokenize(np.asarray(batch["tokens"][0]))[:300])
        """,
    ),
    (
        "md",
        """\
        ## Checkpoint on 8 devices, restore on 4

        `zephon_jax.checkpoint.Save` / `Restore` are Orbax checkpoint arguments: the
        loader's position goes into the same `CheckpointManager` as the model. The
        checkpoint holds one small file per lane and nothing about processes or
        devices, so it restores onto any topology.
        """,
    ),
    (
        "code",
        """\
        import tempfile

        manager = ocp.CheckpointManager(tempfile.mkdtemp())
        manager.save(it.step, args=ocp.args.Composite(data=zephon_jax.checkpoint.Save(it)))
        manager.wait_until_finished()
        lanes = it.get_state()["lanes"]
        print(f"saved at step {it.step}: {len(lanes)} lanes, {sum(v.nbytes for v in lanes.values())} bytes")

        # What the 8-device run sees next.
        expected = [np.asarray(next(it)["tokens"]) for _ in range(3)]
        """,
    ),
    (
        "code",
        """\
        restored = iter(zj.Loader(dataset, sharding=data_sharding(4)))
        manager.restore(
            manager.latest_step(), args=ocp.args.Composite(data=zephon_jax.checkpoint.Restore(restored))
        )
        print("restored at step", restored.step)

        for want in expected:
            got = next(restored)["tokens"]
            assert got.sharding.mesh.devices.size == 4
            assert np.array_equal(np.asarray(got), want)
        print("the next 3 global batches on 4 devices are identical to those on 8 devices")
        """,
    ),
    (
        "md",
        """\
        Without Orbax, `it.get_state()` returns the same position as plain data (a dict
        of numpy arrays) and `it.set_state(state)` restores it; on several processes,
        `zj.merge_states` combines their states into one that restores anywhere.
        """,
    ),
    (
        "code",
        """\
        state = restored.get_state()
        again = iter(zj.Loader(dataset, sharding=data_sharding(2)))
        again.set_state(state)
        assert np.array_equal(np.asarray(next(again)["tokens"]), np.asarray(next(restored)["tokens"]))
        print(
            "state: step",
            state["step"],
            "|",
            len(state["lanes"]),
            "lanes,",
            sum(v.nbytes for v in state["lanes"].values()),
            "bytes",
        )
        """,
    ),
]


# --------------------------------------------------------------------------------------
# 02: elastic resume, the headline experiment
# --------------------------------------------------------------------------------------
ELASTIC = [
    (
        "md",
        """\
        # Resuming on fewer devices: zephon_jax against a standard pipeline

        We train a small byte-level language model on 8 devices, interrupt it at step
        `k`, and resume it on 4 and on 2 devices, twice: once with zephon_jax and once
        with a standard Grain pipeline that shards the documents by host and packs on
        each host (the recipe MaxText uses). Each resumed loss curve is compared with
        its own uninterrupted reference.

        * With zephon_jax every global batch after the resume is identical to the one
          the uninterrupted run saw, so the resumed curves lie on the reference; what
          remains is the order of floating-point reductions over a different number of
          devices, and we measure it.
        * With the standard pipeline, a different number of hosts means different
          per-host shards and different packed rows, so the data order changes at the
          resume and the curves drift apart.

        Devices are simulated on the CPU. Both loaders run the way they would on a
        cluster with one device per host: one loader per simulated host, each producing
        that host's rows of every global batch, which are assembled in host order into
        a global `jax.Array` sharded over the mesh.
        """,
    ),
    ("code", COLAB_INSTALL),
    (
        "code",
        _devices_cell(
            200,
            """\
RESUME_AT = STEPS // 2  # the interruption, step k
GLOBAL_BATCH, SEQ_LEN = 16, 128
""",
        ),
    ),
    (
        "code",
        """\
        import sys

        import grain
        import grain.experimental
        import jax
        import jax.numpy as jnp
        import matplotlib.pyplot as plt
        import numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        import zephon_jax as zj
        from zephon_jax.tools.corpus import builtin_corpus

        print(len(jax.devices()), "devices")
        # The standard library's sources, byte-level tokens; prepared on first use, with progress.
        source = builtin_corpus(stream=sys.stdout)
        print(f"{len(source)} documents, {source.num_tokens:,} tokens")
        """,
    ),
    (
        "md",
        """\
        ## The two pipelines

        Both shuffle the documents with the same seed, cut them into pieces of at most
        `SEQ_LEN` tokens, pack the pieces first-fit over 8 open rows and form global
        batches of 16 rows.

        A simulated host `h` of `n` holds rows `[h*16/n, (h+1)*16/n)` of every global
        batch.
        """,
    ),
    (
        "code",
        """\
        FIELDS = ("tokens", "tokens_segment_ids", "tokens_positions")


        def mesh_sharding(num_devices, spec=None):
            \"\"\"Rows split over the first ``num_devices`` devices, or ``spec`` if given.\"\"\"
            mesh = Mesh(np.array(jax.devices()[:num_devices]), ("data",))
            return NamedSharding(mesh, PartitionSpec("data") if spec is None else spec)


        class SimulatedHosts:
            \"\"\"One loader per host, one device per host; a global batch is their rows in host order.\"\"\"

            def __init__(self, host_iterators):
                self.hosts = host_iterators
                self.sharding = mesh_sharding(len(host_iterators))

            def __next__(self):
                parts = [next(host) for host in self.hosts]
                batch = {f: np.concatenate([p[f] for p in parts]) for f in FIELDS}
                return jax.device_put(batch, self.sharding)
        """,
    ),
    (
        "md",
        """\
        **zephon_jax** defines the pipeline once; every host runs a `Loader` for its
        process index. A checkpoint merges the hosts' states (`zj.merge_states`; the
        Orbax integration does this for you, see the quickstart) and every host of the
        new topology restores from it.
        """,
    ),
    (
        "code",
        """\
        zephon_dataset = (
            zj.Dataset.source(source)
            .shuffle(seed=0)
            .split(SEQ_LEN)
            .pack(SEQ_LEN, method="first_fit", num_bins=8)
            .batch(GLOBAL_BATCH)
        )


        class ZephonLoader(SimulatedHosts):
            def __init__(self, num_hosts, state=None):
                super().__init__(
                    [
                        iter(zj.Loader(zephon_dataset, process_index=h, process_count=num_hosts))
                        for h in range(num_hosts)
                    ]
                )
                if state is not None:
                    for host in self.hosts:
                        host.set_state(state)

            def get_state(self):
                return zj.merge_states([host.get_state() for host in self.hosts])
        """,
    ),
    (
        "md",
        """\
        **The standard pipeline** runs one Grain pipeline per host, as MaxText does:
        the host takes its shard of the shuffled documents, splits and packs them
        locally, and contributes `GLOBAL_BATCH / num_hosts` rows to each global batch.
        Grain checkpoints one file per process and restores only onto the same process
        count, so on a new host count the pipelines are rebuilt for the new hosts and
        each skips the `k` batches already trained on.
        """,
    ),
    (
        "code",
        """\
        class SplitPieces(grain.experimental.FlatMapTransform):
            max_fan_out = 1 << 16

            def flat_map(self, record):
                tokens = record["tokens"]
                return [{"tokens": tokens[i : i + SEQ_LEN]} for i in range(0, len(tokens), SEQ_LEN)]


        def grain_host_pipeline(host, num_hosts):
            ds = grain.MapDataset.source(source).shuffle(seed=0).repeat()
            ds = ds[host::num_hosts].to_iter_dataset()  # this host's shard of the documents
            ds = grain.experimental.FlatMapIterDataset(ds, SplitPieces())
            ds = grain.experimental.FirstFitPackIterDataset(
                ds, length_struct={"tokens": SEQ_LEN}, num_packing_bins=8
            )
            return iter(ds.batch(GLOBAL_BATCH // num_hosts))


        class StandardLoader(SimulatedHosts):
            def __init__(self, num_hosts, skip=0):
                super().__init__([grain_host_pipeline(h, num_hosts) for h in range(num_hosts)])
                for _ in range(skip):
                    next(self)
        """,
    ),
    (
        "md",
        """\
        ## The model

        A one-layer transformer over bytes (embedding width 64, 4 heads), with attention
        restricted to each packed segment and positions restarting in every segment,
        trained with Adam written out by hand. The parameters are replicated and the
        batch is sharded over the `data` axis, so the loss and the gradients are
        reduced across devices.
        """,
    ),
    (
        "code",
        """\
        VOCAB, WIDTH, HEADS = 258, 64, 4


        def init_params(key):
            k = jax.random.split(key, 6)

            def normal(key, shape, scale):
                return jax.random.normal(key, shape, jnp.float32) * scale

            return {
                "embed": normal(k[0], (VOCAB, WIDTH), 0.02),
                "pos": normal(k[1], (SEQ_LEN, WIDTH), 0.02),
                "qkv": normal(k[2], (WIDTH, 3 * WIDTH), WIDTH**-0.5),
                "out": normal(k[3], (WIDTH, WIDTH), WIDTH**-0.5),
                "up": normal(k[4], (WIDTH, 4 * WIDTH), WIDTH**-0.5),
                "down": normal(k[5], (4 * WIDTH, WIDTH), (4 * WIDTH) ** -0.5),
            }


        def layer_norm(x):
            return (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)


        def logits_fn(p, tokens, segments, positions):
            x = p["embed"][tokens] + p["pos"][positions]
            b, t, _ = x.shape
            causal = jnp.tril(jnp.ones((t, t), bool))
            mask = causal[None, None] & (segments[:, None, :, None] == segments[:, None, None, :])
            q, k, v = (a.reshape(b, t, HEADS, -1) for a in jnp.split(layer_norm(x) @ p["qkv"], 3, -1))
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(WIDTH // HEADS)
            attention = jax.nn.softmax(jnp.where(mask, scores, -1e9), -1)
            x = x + jnp.einsum("bhqk,bkhd->bqhd", attention, v).reshape(b, t, WIDTH) @ p["out"]
            x = x + jax.nn.gelu(layer_norm(x) @ p["up"]) @ p["down"]
            return layer_norm(x) @ p["embed"].T


        def loss_fn(p, batch):
            tokens = batch["tokens"].astype(jnp.int32)
            segments, positions = batch["tokens_segment_ids"], batch["tokens_positions"]
            logits = logits_fn(p, tokens[:, :-1], segments[:, :-1], positions[:, :-1])
            # Predict the next token only inside a segment.
            valid = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] != 0)
            nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1)[..., 0]
            return jnp.sum(nll * valid) / jnp.maximum(valid.sum(), 1)


        LEARNING_RATE, BETA1, BETA2 = 3e-3, 0.9, 0.99


        @jax.jit
        def train_step(state, batch):
            params, mu, nu, count = state
            loss, grads = jax.value_and_grad(loss_fn)(params, batch)
            count = count + 1
            mu = jax.tree.map(lambda m, g: BETA1 * m + (1 - BETA1) * g, mu, grads)
            nu = jax.tree.map(lambda v, g: BETA2 * v + (1 - BETA2) * g * g, nu, grads)
            params = jax.tree.map(
                lambda p, m, v: (
                    p - LEARNING_RATE * (m / (1 - BETA1**count)) / (jnp.sqrt(v / (1 - BETA2**count)) + 1e-8)
                ),
                params,
                mu,
                nu,
            )
            return (params, mu, nu, count), loss


        def train(loader, state, num_devices, steps):
            \"\"\"Runs ``steps`` steps on the first ``num_devices`` devices; returns state, losses, batches.\"\"\"
            state = jax.device_put(state, mesh_sharding(num_devices, PartitionSpec()))
            losses, seen = [], []
            for _ in range(steps):
                batch = next(loader)
                assert batch["tokens"].sharding.mesh.devices.size == num_devices
                seen.append(np.asarray(batch["tokens"]))
                state, loss = train_step(state, batch)
                losses.append(float(loss))
            return state, np.array(losses), seen


        params = init_params(jax.random.key(0))
        zeros = jax.tree.map(jnp.zeros_like, params)
        initial_state = (params, zeros, zeros, jnp.zeros((), jnp.int32))
        print(sum(x.size for x in jax.tree.leaves(params)), "parameters")
        """,
    ),
    (
        "md",
        """\
        ## zephon_jax: train on 8 devices, interrupt at step k, resume on 4 and on 2

        The uninterrupted reference runs all steps on 8 devices. At step `k` we keep the
        model state and the loader state (in a real job both go into one Orbax
        checkpoint, see the quickstart); each resumed run builds fresh loaders for its
        hosts, restores the loader state and continues on its smaller mesh.
        """,
    ),
    (
        "code",
        """\
        loader = ZephonLoader(num_hosts=8)
        state_at_k, losses_a, batches_a = train(loader, initial_state, 8, RESUME_AT)
        loader_state_at_k = loader.get_state()
        _, losses_b, batches_b = train(loader, state_at_k, 8, STEPS - RESUME_AT)
        zephon_reference = np.concatenate([losses_a, losses_b])
        zephon_reference_batches = batches_a + batches_b

        zephon_resumed = {}
        for num_devices in (4, 2):
            resumed = ZephonLoader(num_hosts=num_devices, state=loader_state_at_k)
            _, losses, batches = train(resumed, state_at_k, num_devices, STEPS - RESUME_AT)
            identical = all(
                np.array_equal(a, b) for a, b in zip(batches, zephon_reference_batches[RESUME_AT:])
            )
            assert identical, "zephon_jax batches differ after the resume"
            zephon_resumed[num_devices] = losses
            gap = np.abs(losses - zephon_reference[RESUME_AT:]).max()
            print(
                f"resumed on {num_devices} hosts: batches identical: {identical}; max |loss - reference| = {gap:.2e}"
            )
        """,
    ),
    (
        "md",
        """\
        ## The standard pipeline: the same experiment
        """,
    ),
    (
        "code",
        """\
        loader = StandardLoader(num_hosts=8)
        state_at_k, losses_a, batches_a = train(loader, initial_state, 8, RESUME_AT)
        _, losses_b, batches_b = train(loader, state_at_k, 8, STEPS - RESUME_AT)
        standard_reference = np.concatenate([losses_a, losses_b])
        standard_reference_batches = batches_a + batches_b

        standard_resumed = {}
        for num_devices in (4, 2):
            resumed = StandardLoader(num_hosts=num_devices, skip=RESUME_AT)
            _, losses, batches = train(resumed, state_at_k, num_devices, STEPS - RESUME_AT)
            rows_same = np.mean(
                [
                    np.mean(np.all(a == b, axis=1))
                    for a, b in zip(batches, standard_reference_batches[RESUME_AT:])
                ]
            )
            assert rows_same < 0.5, "expected the standard pipeline's batches to change with the host count"
            standard_resumed[num_devices] = losses
            gap = np.abs(losses - standard_reference[RESUME_AT:])
            print(
                f"resumed on {num_devices} hosts: rows equal to the reference: {rows_same:.1%}; "
                f"|loss - reference| mean {gap.mean():.3f}, max {gap.max():.3f}"
            )
        """,
    ),
    (
        "md",
        """\
        ## The picture

        Top: each resumed loss curve over its own uninterrupted reference. Bottom: the
        absolute per-step difference from the reference, on a log scale shared by both
        loaders; an exact zero is drawn on the line marked 0. A float32 loss near 2.5
        has a spacing of about 2.4e-7, so for zephon_jax every difference is either
        zero or a few units in the last place.
        """,
    ),
    (
        "code",
        """\
        steps = np.arange(1, STEPS + 1)
        resumed_steps = steps[RESUME_AT:]
        colors = {4: "tab:orange", 2: "tab:green"}
        floor = 1e-9

        fig, axes = plt.subplots(
            2, 2, figsize=(11, 6.2), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
        )
        panels = [
            ("zephon_jax", zephon_reference, zephon_resumed),
            (
                "standard Grain pipeline (shard by host, pack per host)",
                standard_reference,
                standard_resumed,
            ),
        ]
        for col, (title, reference, resumed) in enumerate(panels):
            top, bottom = axes[0, col], axes[1, col]
            top.plot(steps, reference, color="black", lw=1.6, label="uninterrupted, 8 devices")
            for n, losses in resumed.items():
                style = "--" if n == 4 else ":"
                top.plot(
                    resumed_steps, losses, style, color=colors[n], lw=1.4, label=f"resumed on {n} devices"
                )
                gap = np.maximum(np.abs(losses - reference[RESUME_AT:]), floor)
                marker = "o" if n == 4 else "x"
                bottom.plot(
                    resumed_steps, gap, marker, color=colors[n], ms=3, alpha=0.8, label=f"{n} devices"
                )
            for ax in (top, bottom):
                ax.axvline(RESUME_AT, color="gray", lw=0.8)
            top.set_title(title, fontsize=11)
            top.set_ylabel("training loss")
            top.legend(fontsize=8, loc="upper right")
            bottom.set_yscale("log")
            bottom.set_ylim(floor * 0.3, 10)
            ticks = [floor, 1e-7, 1e-5, 1e-3, 1e-1, 10]
            bottom.set_yticks(ticks, ["0"] + [f"1e{int(np.log10(t))}" for t in ticks[1:]])
            bottom.legend(fontsize=8, loc="center right")
            bottom.set_ylabel("|loss - reference|")
            bottom.set_xlabel(f"step (interrupted at step {RESUME_AT})")
        low = min(
            min(r.min() for r in zephon_resumed.values()), min(r.min() for r in standard_resumed.values())
        )
        for ax in axes[0]:
            ax.set_ylim(low - 0.1, max(zephon_reference[5:].max(), standard_reference[5:].max()) + 0.1)
        fig.tight_layout()

        # The documentation's figure is written only when asked, by a full-size run of
        # `python notebooks/_build_notebooks.py --execute --figures` (ZEPHON_NB_FIGURES=1).
        if os.environ.get("ZEPHON_NB_FIGURES") == "1":
            fig.savefig("../docs/_static/elastic_resume.png", dpi=110)
        plt.show()
        """,
    ),
    (
        "code",
        """\
        for name, reference, resumed in [
            ("zephon_jax", zephon_reference, zephon_resumed),
            ("standard", standard_reference, standard_resumed),
        ]:
            for n, losses in resumed.items():
                gap = np.abs(losses - reference[RESUME_AT:])
                print(
                    f"{name:10s} resumed on {n}: mean |loss - reference| = {gap.mean():.2e}, max = {gap.max():.2e}"
                )

        zephon_gap = max(np.abs(l - zephon_reference[RESUME_AT:]).max() for l in zephon_resumed.values())
        standard_gap = min(
            np.abs(l - standard_reference[RESUME_AT:]).mean() for l in standard_resumed.values()
        )
        assert zephon_gap < 1e-3 < standard_gap
        """,
    ),
    (
        "md",
        """\
        The zephon_jax runs see the same global batches as the reference; their loss
        differs from it only by the order in which a different number of devices sums
        the loss and the gradients, a few units in the last place of float32. The
        standard pipeline's runs see different data from the resume on, and their
        losses differ from the reference by as much as the loss varies from batch to
        batch. Over a long run those differences do not average out: they change which
        documents the model has seen by any given step.
        """,
    ),
]


# --------------------------------------------------------------------------------------
# 03: packing and mixtures
# --------------------------------------------------------------------------------------
PACKING = [
    (
        "md",
        """\
        # Packing and mixtures, visualized

        What packed rows look like, how full each packing method fills them, and how a
        weighted mixture spreads its sources over steps and lanes. All data comes from
        the built-in corpus (the standard library's sources, byte-level tokens).
        """,
    ),
    ("code", COLAB_INSTALL),
    ("code", _devices_cell(100)),
    (
        "code",
        """\
        import sys
        import time

        import matplotlib.pyplot as plt
        import numpy as np

        import zephon_jax as zj
        from zephon_jax.tools.corpus import builtin_sources
        from zephon_jax.tools.tokenizers import BYTE_OFFSET

        # {"library": TokenStore, "tests": TokenStore}; prepared on first use, with progress.
        sources = builtin_sources(stream=sys.stdout)
        for name, store in sources.items():
            print(f"{name:8s} {len(store):5d} files {store.num_tokens:12,d} tokens")
        """,
    ),
    (
        "md",
        """\
        ## Records of very different lengths

        Whole files are long, so we cut each file into its top-level blocks (a
        function, a class, a group of imports) with a pure `flat_map`, and keep the
        blocks that fit a row of 1024 tokens (a longer block would be split into full
        rows, which need no packing). That gives the many short records of very
        different lengths that packing is for.
        """,
    ),
    (
        "code",
        """\
        NEWLINE, SPACE = ord("\\n") + BYTE_OFFSET, ord(" ") + BYTE_OFFSET


        def top_level_blocks(record):
            \"\"\"Cuts a file where an unindented line follows a blank line.\"\"\"
            t = record["tokens"]
            starts = (
                np.flatnonzero(
                    (t[:-2] == NEWLINE) & (t[1:-1] == NEWLINE) & (t[2:] != NEWLINE) & (t[2:] != SPACE)
                )
                + 2
            )
            cuts = [0, *starts.tolist(), len(t)]
            return [{"tokens": t[a:b]} for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


        SEQ_LEN, GLOBAL_BATCH = 1024, 16


        def fits_a_row(record):
            return len(record["tokens"]) <= SEQ_LEN


        library = (
            zj.Dataset.source(sources["library"])
            .shuffle(seed=0)
            .flat_map(top_level_blocks)
            .filter(fits_a_row)
        )
        lengths = np.array(
            [
                len(b["tokens"])
                for i in range(100)
                for b in top_level_blocks(sources["library"][i])
                if fits_a_row(b)
            ]
        )
        print(
            "block lengths, percentiles 10/50/90/99:", np.percentile(lengths, [10, 50, 90, 99]).astype(int)
        )

        fig, ax = plt.subplots(figsize=(7, 2.6))
        ax.hist(lengths, bins=64, color="tab:blue")
        ax.set_xlabel("block length in tokens")
        ax.set_ylabel("blocks")
        fig.tight_layout()
        plt.show()
        """,
    ),
    (
        "md",
        """\
        ## Packed rows

        A global batch of 16 rows of 1024 tokens, packed best-fit over 16 open rows per
        lane (the tenth batch, once the open rows have filled up). Each colour is one segment (one record or piece of a record); white
        is padding. `tokens_segment_ids` numbers the segments of a row from 1 and
        `tokens_positions` restarts at 0 in each, as Grain's packers do.
        """,
    ),
    (
        "code",
        """\
        packed = library.pack(SEQ_LEN, method="best_fit", num_bins=16).batch(GLOBAL_BATCH)
        it = iter(zj.Loader(packed))
        for _ in range(10):
            batch = next(it)
        segment_ids = batch["tokens_segment_ids"]

        colors = np.where(
            segment_ids > 0, (segment_ids * 0.618) % 1.0, np.nan
        )  # neighbours get distinct hues
        fig, ax = plt.subplots(figsize=(10, 3.4))
        cmap = plt.get_cmap("tab20").copy()
        cmap.set_bad("white")
        ax.imshow(colors, aspect="auto", interpolation="nearest", cmap=cmap)
        for r in range(GLOBAL_BATCH):
            ax.text(
                SEQ_LEN + 8,
                r,
                f"{segment_ids[r].max():2d} segments, {np.mean(segment_ids[r] > 0):.0%}",
                va="center",
                fontsize=7,
            )
        ax.set_xlim(-0.5, SEQ_LEN + 200)
        ax.set_xlabel("token position in the row")
        ax.set_ylabel("row of the global batch")
        ax.set_title("one packed global batch: segments per row and fill")
        fig.tight_layout()
        plt.show()
        """,
    ),
    (
        "md",
        """\
        ## Fill ratio per method

        The fraction of a row's tokens that are real (not padding), over `STEPS` global
        batches, for `best_fit` and `first_fit` with 1 to 64 open rows per lane, and
        `concat` (concat-then-split, which never pads but cuts records at row
        boundaries). More open rows fill better; the carry grows with them, but only by
        one pointer per record held.
        """,
    ),
    (
        "code",
        """\
        def fill_and_rate(method, num_bins):
            ds = library.pack(SEQ_LEN, method=method, num_bins=num_bins).batch(GLOBAL_BATCH)
            it = iter(zj.Loader(ds))
            start = time.perf_counter()
            real = sum(int(np.count_nonzero(next(it)["tokens_segment_ids"])) for _ in range(STEPS))
            elapsed = time.perf_counter() - start
            state_bytes = sum(v.nbytes for v in it.get_state()["lanes"].values())
            return real / (STEPS * GLOBAL_BATCH * SEQ_LEN), real / elapsed, state_bytes


        BINS = [1, 2, 4, 8, 16, 32, 64]
        results = {(m, b): fill_and_rate(m, b) for m in ("best_fit", "first_fit") for b in BINS}
        results[("concat", None)] = fill_and_rate("concat", None)

        print(f"{'method':10s} {'bins':>4s} {'fill':>7s} {'tokens/s':>12s} {'state bytes':>12s}")
        for (m, b), (fill, rate, size) in results.items():
            print(f"{m:10s} {b if b else '-':>4} {fill:7.2%} {rate:12,.0f} {size:12,d}")
        """,
    ),
    (
        "code",
        """\
        fig, ax = plt.subplots(figsize=(7, 3.4))
        for method, marker in (("best_fit", "o"), ("first_fit", "s")):
            ax.plot(BINS, [results[(method, b)][0] for b in BINS], marker=marker, label=method)
        ax.axhline(results[("concat", None)][0], color="gray", ls="--", label="concat")
        ax.set_xscale("log", base=2)
        ax.set_xticks(BINS, [str(b) for b in BINS])
        ax.set_xlabel("open rows per lane (num_bins)")
        ax.set_ylabel("fill ratio (real tokens / row tokens)")
        ax.set_title(f"fill ratio over {STEPS} global batches of {GLOBAL_BATCH} x {SEQ_LEN}")
        ax.legend()
        fig.tight_layout()
        plt.show()
        """,
    ),
    (
        "md",
        """\
        ## Mixture proportions per step and per lane

        Three sources mixed with weights 0.6 / 0.3 / 0.1: the library's files, the test
        suites' files, and a small rare source (the 40 shortest library files). A `map`
        on each component tags its records with the source id, so each row of a batch
        says where it came from. Each lane draws its own schedule whose counts are exact
        over every block of 1024 draws, so the per-step proportions stay close to the
        weights, and every lane receives every source, the rare one included, in
        proportion.
        """,
    ),
    (
        "code",
        """\
        WEIGHTS = (0.6, 0.3, 0.1)
        NAMES = ("library", "tests", "rare")
        shortest = np.argsort(sources["library"].doc_lengths)[:40]
        rare = [sources["library"][int(i)] for i in shortest]


        def tag(source_id):
            def tag_record(record):
                return {"source": np.int32(source_id), "length": np.int32(len(record["tokens"]))}

            tag_record.__name__ = f"tag_{source_id}"
            return tag_record


        components = [
            zj.Dataset.source(src).map(tag(i))
            for i, src in enumerate([sources["library"], sources["tests"], rare])
        ]
        MIX_BATCH, MIX_STEPS = 32, min(1024, 16 * STEPS)
        mixture = zj.Dataset.mix(components, WEIGHTS).shuffle(seed=1).batch(MIX_BATCH)

        it = iter(zj.Loader(mixture))
        per_step = np.array([next(it)["source"] for _ in range(MIX_STEPS)])  # [step, row] -> source id
        shares = np.stack([(per_step == s).mean(axis=1) for s in range(3)], axis=1)
        print(
            "overall shares:",
            {name: round(float((per_step == s).mean()), 4) for s, name in enumerate(NAMES)},
        )
        """,
    ),
    (
        "code",
        """\
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 2]})
        left.stackplot(np.arange(1, MIX_STEPS + 1), shares.T, labels=NAMES, alpha=0.85)
        for w in np.cumsum(WEIGHTS)[:-1]:
            left.axhline(w, color="black", lw=0.8, ls="--")
        left.set_xlim(1, MIX_STEPS)
        left.set_ylim(0, 1)
        left.set_xlabel("step")
        left.set_ylabel("share of the batch's records")
        left.set_title(f"per-step proportions ({MIX_BATCH} rows per step); dashed: weights")
        left.legend(loc="lower right", fontsize=8)

        # Rows of lane l are rows [l*R, (l+1)*R); here R = 1, so column l is lane l.
        per_lane = np.stack([(per_step == s).mean(axis=0) for s in range(3)])
        bottom = np.zeros(MIX_BATCH)
        for s in range(3):
            right.bar(np.arange(MIX_BATCH), per_lane[s], bottom=bottom, width=1.0, label=NAMES[s])
            bottom += per_lane[s]
        right.set_xlabel("lane")
        right.set_ylabel("share over all steps")
        right.set_title("per-lane proportions")
        right.set_xlim(-0.5, MIX_BATCH - 0.5)
        fig.tight_layout()
        plt.show()

        counts = np.stack([(per_step == s).sum(axis=0) for s in range(3)])  # [source, lane]
        for s in range(3):
            print(
                f"{NAMES[s]:8s} records per lane over {MIX_STEPS} steps: {counts[s].min()}..{counts[s].max()} "
                f"(weight x steps = {WEIGHTS[s] * MIX_STEPS:.1f})"
            )
        assert counts[2].min() > 0, "every lane must receive the rare source"
        if MIX_STEPS == 1024:  # one full schedule block: every lane's counts are exact to a draw or two
            assert np.all(np.abs(counts - np.array(WEIGHTS)[:, None] * MIX_STEPS) <= 2)
        """,
    ),
    (
        "md",
        """\
        The proportions are a property of the lanes, which do not depend on the
        topology: the same rows come from the same sources on any number of devices
        or processes, and after any resume.
        """,
    ),
]


# --------------------------------------------------------------------------------------
# 04: an LLM pretraining + SFT pipeline, trained, resumed and evaluated across topologies
# --------------------------------------------------------------------------------------
LLM_SFT = [
    (
        "md",
        """\
        # Training a small LLM end to end: tokenizer, SFT mixture, ramp-up

        A complete language-model data pipeline inside the guarantee, and what the
        guarantee buys in training:

        1. a byte-level BPE tokenizer trained here, on the Python standard library's
           sources (no download);
        2. two components: *pretraining* text (whole source files) and *chat SFT*
           conversations (a user asks for a documented function, the assistant writes
           it), tokenized inside the pipeline, with a loss mask that is 1 only on what the
           assistant writes;
        3. a mixture weighted by **tokens** whose weights change in **stages** (mostly
           pretraining first, then mostly chat), packed into rows, turned into training
           batches (`inputs`, `targets`, `loss_mask`, `segment_ids`, `positions`) and
           batched with a **batch-size ramp-up**;
        4. a one-layer transformer trained on 8 simulated devices.

        Then two experiments, each run with zephon_jax and with a standard per-host
        Grain pipeline (the documents sharded by host, mixed and packed on each host):

        * **(a) resume on fewer devices**: train on 8 devices, interrupt, resume on 4
          and on 2, and compare each loss curve with its own uninterrupted run;
        * **(b) train from scratch on 1, 2, 4 and 8 devices** and evaluate every model
          on the same held-out set.
        """,
    ),
    ("code", COLAB_INSTALL + LLM_SFT_NEEDS),
    (
        "code",
        _devices_cell(
            160,
            """\
RESUME_AT = STEPS // 2  # the interruption in (a), step k
SEQ_LEN = 128
""",
        ),
    ),
    (
        "code",
        """\
        import ast
        import textwrap

        import grain
        import grain.experimental
        import jax
        import jax.numpy as jnp
        import matplotlib.pyplot as plt
        import numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast

        import zephon_jax as zj
        from zephon_jax.tools.corpus import stdlib_files

        print(len(jax.devices()), "devices")
        """,
    ),
    (
        "md",
        """\
        ## Text the notebook has

        The standard library's modules; every tenth file is held out for evaluation and
        never trained on. Pretraining documents are the files cut at blank lines into
        chunks of about 1500 characters (a few hundred tokens), so that a mixture by
        tokens can interleave them finely with the conversations. The conversations
        come from the same files: for every short function with a docstring, the user
        asks for it by its name and the first line of its docstring, and the assistant
        answers with the function's source.
        """,
    ),
    (
        "code",
        """\
        files = stdlib_files("library")[: 60 + 2 * STEPS]


        def read(path):
            return path.read_text(encoding="utf-8", errors="replace")


        def conversations(path):
            \"\"\"One conversation per function of at most 12 lines that has a docstring.\"\"\"
            text = read(path)
            try:
                tree = ast.parse(text)
            except SyntaxError:
                return []
            lines = text.splitlines(keepends=True)
            found = []
            for node in ast.walk(tree):
                doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
                if doc and node.end_lineno - node.lineno < 12:
                    code = textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno]))
                    ask = f"Write `{node.name}` for the module `{path.stem}`: {doc.splitlines()[0]}"
                    found.append([{"role": "user", "content": ask}, {"role": "assistant", "content": code}])
            return found


        def chunks(text, max_chars=1500):
            \"\"\"The text cut at blank lines into chunks of about ``max_chars`` characters.\"\"\"
            found, current = [], ""
            for block in text.split("\\n\\n"):
                if current and len(current) + len(block) > max_chars:
                    found.append(current)
                    current = ""
                current += block + "\\n\\n"
            return found + [current] if current.strip() else found


        texts = {False: [], True: []}  # held out? -> pretraining documents
        chats = {False: [], True: []}  # held out? -> conversations
        for i, path in enumerate(files):
            held_out = i % 10 == 0
            texts[held_out] += [{"text": chunk} for chunk in chunks(read(path))]
            chats[held_out] += [{"messages": c} for c in conversations(path)]

        for out, name in ((False, "training"), (True, "held out")):
            print(f"{name:9s}: {len(texts[out]):5d} text chunks, {len(chats[out]):5d} conversations")
        print(chats[False][3]["messages"])
        """,
    ),
    (
        "md",
        """\
        ## A BPE tokenizer, trained here

        A byte-level BPE with 1024 tokens from the `tokenizers` library, trained on the
        training files, with special tokens for padding, end of document and the chat
        roles. Wrapped in `transformers`' `PreTrainedTokenizerFast`, it gets a chat
        template whose `{% generation %}` markers tell which tokens the assistant
        generates.
        """,
    ),
    (
        "code",
        """\
        SPECIAL = ["<pad>", "<eos>", "<|user|>", "<|assistant|>", "<|end|>"]
        PAD, EOS, USER = 0, 1, 2

        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        bpe.train_from_iterator(
            [t["text"] for t in texts[False]],
            trainers.BpeTrainer(
                vocab_size=1024,
                special_tokens=SPECIAL,
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                show_progress=False,
            ),
        )
        assert [bpe.token_to_id(s) for s in SPECIAL] == list(range(len(SPECIAL)))

        CHAT_TEMPLATE = (
            "{% for m in messages %}"
            "{% if m['role'] == 'assistant' %}"
            "<|assistant|>{% generation %}{{ m['content'] }}<|end|>{% endgeneration %}"
            "{% else %}<|user|>{{ m['content'] }}<|end|>{% endif %}"
            "{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}"
        )
        chat_tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=bpe, pad_token="<pad>", eos_token="<eos>", chat_template=CHAT_TEMPLATE
        )

        sample = texts[False][0]["text"][:200]
        ids = bpe.encode(sample).ids
        print(f"{len(sample)} characters -> {len(ids)} tokens: {[bpe.id_to_token(i) for i in ids[:12]]}")
        """,
    ),
    (
        "md",
        """\
        ## The pipeline

        Each component tokenizes its own records: `tokenize` appends `<eos>` to every
        file; `tokenize_chat` renders a conversation with the chat template and gives
        `loss_mask` = 1 on the assistant's tokens. Pretraining records get a loss mask
        of ones, so that both components have the same fields, and conversations that
        do not fit a row are dropped.

        `mix(..., unit="tokens")` counts the weights in tokens, per lane, exactly in the
        long run; the weights are a stage schedule: 90% pretraining tokens until
        `STAGE`, then 40%. Long files are `split` into pieces of a row, pieces are
        packed best-fit, `to_training` makes the training fields, and `batch` ramps the
        global batch from 8 to 16 rows at step `RAMP`.
        """,
    ),
    (
        "code",
        """\
        RAMP, STAGE = STEPS // 4, (5 * STEPS) // 8
        BATCH_SIZES = {0: 8, RAMP: 16}
        WEIGHTS = {0: [0.9, 0.1], STAGE: [0.4, 0.6]}  # [pretraining, chat] shares of tokens


        def with_loss_mask(record):
            return {"tokens": record["tokens"], "loss_mask": np.ones_like(record["tokens"])}


        def fits_a_row(record):
            return len(record["tokens"]) <= SEQ_LEN


        def components(split):
            pretraining = (
                zj.Dataset.source(texts[split])
                .shuffle(seed=0)
                .tokenize(bpe, eos_id=EOS)
                .map(with_loss_mask)
            )
            chat = (
                zj.Dataset.source(chats[split])
                .shuffle(seed=1)
                .tokenize_chat(chat_tokenizer)
                .filter(fits_a_row)
            )
            return [pretraining, chat]


        def training_rows(mixture):
            return (
                mixture.split(SEQ_LEN).pack(SEQ_LEN, method="best_fit", num_bins=8).to_training(pad_id=PAD)
            )


        dataset = training_rows(zj.Dataset.mix(components(False), WEIGHTS, unit="tokens")).batch(
            BATCH_SIZES
        )
        dataset
        """,
    ),
    (
        "md",
        """\
        One pass over `STEPS` global batches on one process shows the schedule at work:
        the batch grows at `RAMP`, and the share of chat tokens in the rows follows the
        weights of each stage. It follows with a lag: the draws of a lane keep the
        stage's shares exactly, but a row that was still filling when a stage began
        holds records drawn before it, and best-fit keeps short conversations in open
        rows longer than full pieces of text. (A segment is a conversation when it
        holds a `<|user|>` token.) The second plot asks the loader instead of the
        batches: `it.accounting()`, sampled every `K` steps, gives per stage the tokens
        each component has delivered in it so far and their share (solid) beside the
        stage's weight (dashed); these are exact counts over every delivered batch.
        """,
    ),
    (
        "code",
        """\
        def chat_share(batch):
            \"\"\"Share of the real tokens of a batch that belong to conversations.\"\"\"
            seg = np.asarray(batch["segment_ids"])
            is_user = np.asarray(batch["inputs"]) == USER
            chat_tokens = 0
            for row, users in zip(seg, is_user):
                chat_segments = np.unique(row[users])
                chat_tokens += np.isin(row, chat_segments[chat_segments > 0]).sum()
            return chat_tokens / max((seg > 0).sum(), 1)


        K = max(STEPS // 40, 1)  # sample the accounting every K steps
        it = iter(zj.Loader(dataset))
        sizes, shares, sampled, realized = [], [], [], []
        for t in range(1, STEPS + 1):
            batch = next(it)
            sizes.append(len(batch["inputs"]))
            shares.append(chat_share(batch))
            if t % K == 0:
                sampled.append(t)
                realized.append([stage["shares"] for stage in it.accounting()["stages"]])
        print({k: np.asarray(v).dtype.name for k, v in batch.items()})

        step = np.arange(STEPS)
        fig, ax = plt.subplots(figsize=(9, 3.2))
        ax.plot(step, shares, ".", color="tab:blue", label="chat share of the batch's tokens")
        ax.plot(
            step, [0.1 if s < STAGE else 0.6 for s in step], "--", color="tab:blue", lw=1, label="weight"
        )
        ax.set_ylim(0, 1)
        ax.set_xlabel("step")
        ax.set_ylabel("chat share of tokens")
        right = ax.twinx()
        right.step(step, sizes, where="post", color="tab:red", label="global batch size")
        right.set_ylim(0, 20)
        right.set_ylabel("rows per global batch", color="tab:red")
        fig.legend(loc="upper left", fontsize=8, bbox_to_anchor=(0.08, 0.95))
        fig.tight_layout()
        plt.show()
        for name, lo, hi in (("stage 0", 0, STAGE), ("stage 1", STAGE, STEPS)):
            print(f"{name}: chat share {np.mean(shares[lo:hi]):.2f} of tokens (weight {WEIGHTS[lo][1]})")

        sampled, realized = np.array(sampled), np.array(realized)  # [sample, stage, component]
        fig, ax = plt.subplots(figsize=(9, 3.2))
        bounds = [*WEIGHTS, STEPS]
        for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            inside = (sampled > lo) & (sampled <= hi)
            for c, (name, color) in enumerate((("pretraining", "tab:green"), ("chat", "tab:blue"))):
                ax.plot(sampled[inside], realized[inside, k, c], color=color, label=None if k else name)
                ax.hlines(WEIGHTS[lo][c], lo, hi, colors=color, linestyles="--", lw=1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("step")
        ax.set_ylabel("share of the stage's tokens")
        ax.set_title(
            "it.accounting(): realized mixture (solid) vs weights (dashed), per stage", fontsize=10
        )
        ax.legend(loc="center left", fontsize=8)
        fig.tight_layout()
        plt.show()
        report = it.accounting()
        assert report["steps"] == STEPS and len(report["stages"]) == len(WEIGHTS)
        print({name: figures["tokens"] for name, figures in report["sources"].items()}, "tokens delivered")
        """,
    ),
]
LLM_SFT += [
    (
        "md",
        """\
        ## The model

        A one-layer attention-only transformer (width 64, one head) over the 1024 BPE
        tokens, attention restricted to each packed segment, positions restarting in
        each, trained with Adam written out by hand. The loss is the mean over the positions whose
        `loss_mask` is 1: every pretraining token, and only the assistant's tokens of a
        conversation. Parameters are replicated and each batch is sharded over the
        `data` axis of the first `n` devices. Every model starts from the same
        initialization.
        """,
    ),
    (
        "code",
        """\
        VOCAB, WIDTH = 1024, 64
        FIELDS = ("inputs", "targets", "loss_mask", "segment_ids", "positions")


        def mesh_sharding(num_devices, spec=None):
            mesh = Mesh(np.array(jax.devices()[:num_devices]), ("data",))
            return NamedSharding(mesh, PartitionSpec("data") if spec is None else spec)


        def init_params(seed):
            rng = np.random.default_rng(seed)

            def normal(shape, scale):
                return jnp.asarray(rng.normal(0.0, scale, shape), jnp.float32)

            return {
                "embed": normal((VOCAB, WIDTH), 0.02),
                "pos": normal((SEQ_LEN, WIDTH), 0.02),
                "qkv": normal((WIDTH, 3 * WIDTH), WIDTH**-0.5),
                "out": normal((WIDTH, WIDTH), WIDTH**-0.5),
            }


        def layer_norm(x):
            return (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)


        def logits_fn(p, inputs, segments, positions):
            x = p["embed"][inputs] + p["pos"][positions]
            t = x.shape[1]
            # Causal, and only within the token's own packed segment.
            mask = jnp.tril(jnp.ones((t, t), bool)) & (segments[:, :, None] == segments[:, None, :])
            q, k, v = jnp.split(layer_norm(x) @ p["qkv"], 3, -1)
            scores = jnp.einsum("bqd,bkd->bqk", q, k) / np.sqrt(WIDTH)
            attention = jax.nn.softmax(jnp.where(mask, scores, -1e9), -1)
            x = x + jnp.einsum("bqk,bkd->bqd", attention, v) @ p["out"]
            return layer_norm(x) @ p["embed"].T


        def loss_fn(p, batch):
            logits = logits_fn(p, batch["inputs"], batch["segment_ids"], batch["positions"])
            nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["targets"][..., None], -1)[..., 0]
            return jnp.sum(nll * batch["loss_mask"]) / jnp.maximum(batch["loss_mask"].sum(), 1)


        LEARNING_RATE, BETA1, BETA2 = 3e-3, 0.9, 0.99


        @jax.jit
        def train_step(state, batch):
            params, mu, nu, count = state
            loss, grads = jax.value_and_grad(loss_fn)(params, batch)
            count = count + 1
            mu = jax.tree.map(lambda m, g: BETA1 * m + (1 - BETA1) * g, mu, grads)
            nu = jax.tree.map(lambda v, g: BETA2 * v + (1 - BETA2) * g * g, nu, grads)
            params = jax.tree.map(
                lambda p, m, v: (
                    p - LEARNING_RATE * (m / (1 - BETA1**count)) / (jnp.sqrt(v / (1 - BETA2**count)) + 1e-8)
                ),
                params,
                mu,
                nu,
            )
            return (params, mu, nu, count), loss


        def train(loader, state, num_devices, steps):
            \"\"\"Runs ``steps`` steps on the first ``num_devices`` devices; returns state, losses, batches.\"\"\"
            state = jax.device_put(state, mesh_sharding(num_devices, PartitionSpec()))
            losses, seen = [], []
            for _ in range(steps):
                batch = next(loader)
                assert batch["inputs"].sharding.mesh.devices.size == num_devices
                seen.append(np.asarray(batch["inputs"]))
                state, loss = train_step(state, batch)
                losses.append(float(loss))
            return state, np.array(losses), seen


        params = init_params(0)
        zeros = jax.tree.map(jnp.zeros_like, params)
        initial_state = (params, zeros, zeros, jnp.zeros((), jnp.int32))
        print(sum(x.size for x in jax.tree.leaves(params)), "parameters")
        """,
    ),
    (
        "md",
        """\
        ## Two loaders, one per simulated host

        Both run the way they would on a cluster with one device per host: one loader
        per host, each producing that host's rows of every global batch (at step `t`,
        host `h` of `n` holds rows `[h*B_t/n, (h+1)*B_t/n)`), assembled in host order
        into a global `jax.Array` sharded over the mesh.

        **zephon_jax** defines the pipeline once and every host runs a `Loader` for its
        process index. A checkpoint merges the hosts' states (`zj.merge_states`; the
        Orbax integration does this for you) and every host of the new topology
        restores from it.
        """,
    ),
    (
        "code",
        """\
        class SimulatedHosts:
            \"\"\"One loader per host, one device per host; a global batch is their rows in host order.\"\"\"

            def __init__(self, host_iterators):
                self.hosts = host_iterators
                self.sharding = mesh_sharding(len(host_iterators))

            def __next__(self):
                parts = [next(host) for host in self.hosts]
                batch = {f: np.concatenate([p[f] for p in parts]) for f in FIELDS}
                return jax.device_put(batch, self.sharding)


        class ZephonLoader(SimulatedHosts):
            def __init__(self, num_hosts, state=None):
                super().__init__(
                    [
                        iter(zj.Loader(dataset, process_index=h, process_count=num_hosts))
                        for h in range(num_hosts)
                    ]
                )
                if state is not None:
                    for host in self.hosts:
                        host.set_state(state)

            def get_state(self):
                return zj.merge_states([host.get_state() for host in self.hosts])
        """,
    ),
    (
        "md",
        """\
        **The standard pipeline** runs one Grain pipeline per host, the recipe MaxText
        uses: the host takes its shard of each component's shuffled records, tokenizes
        them (the same tokenizer, the same chat masks), mixes the two, splits and packs
        locally (`FirstFitPackIterDataset`, 8 open rows), and turns the packed rows
        into the same training fields. Grain mixes by records with fixed weights, so we
        give it the record weights that yield the stage's token shares on average, and
        change stage the way Grain allows: at step `STAGE` each host saves its
        iterator's state, rebuilds the pipeline with the new weights and restores the
        state into it. The host takes `B_t / n` rows at each step, which follows the
        ramp-up. On a new host count, the pipelines are rebuilt for the new hosts and
        skip the steps already trained on (Grain restores only onto the same process
        count).
        """,
    ),
    (
        "code",
        """\
        from zephon_jax.transforms.to_training import training_arrays


        def encode_text(record):
            return with_loss_mask({"tokens": np.array(bpe.encode(record["text"]).ids + [EOS], np.int32)})


        def encode_chat(record):
            out = chat_tokenizer.apply_chat_template(
                record["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            return {
                "tokens": np.array(out["input_ids"], np.int32),
                "loss_mask": np.array(out["assistant_masks"], np.int32),
            }


        # Record weights that give each stage's token shares: token weight / mean record length.
        mean_tokens = [
            np.mean([len(encode_text(r)["tokens"]) for r in texts[False][:50]]),
            np.mean([len(t) for r in chats[False][:500] if len(t := encode_chat(r)["tokens"]) <= SEQ_LEN]),
        ]
        RECORD_WEIGHTS = {s: [w / n for w, n in zip(ws, mean_tokens)] for s, ws in WEIGHTS.items()}


        class SplitPieces(grain.experimental.FlatMapTransform):
            max_fan_out = 1 << 16

            def flat_map(self, record):
                n = len(record["tokens"])
                return [{k: v[i : i + SEQ_LEN] for k, v in record.items()} for i in range(0, n, SEQ_LEN)]


        def grain_host_pipeline(host, num_hosts, weights):
            def component(records, seed, encode):
                ds = grain.MapDataset.source(records).shuffle(seed=seed).repeat()
                return ds[host::num_hosts].map(encode).to_iter_dataset(grain.ReadOptions(num_threads=0))

            mixed = grain.IterDataset.mix(
                {
                    "pretraining": component(texts[False], 0, encode_text),
                    "chat": component(chats[False], 1, encode_chat).filter(fits_a_row),
                },
                {"pretraining": weights[0], "chat": weights[1]},
            )
            pieces = grain.experimental.FlatMapIterDataset(mixed, SplitPieces())
            packed = grain.experimental.FirstFitPackIterDataset(
                pieces, length_struct={"tokens": SEQ_LEN, "loss_mask": SEQ_LEN}, num_packing_bins=8
            )
            return iter(packed.map(lambda row: training_arrays(row, PAD)))


        def size_at(step):
            return BATCH_SIZES[max(s for s in BATCH_SIZES if s <= step)]


        class GrainHost:
            \"\"\"A host's Grain pipeline; ``next`` gives its rows of the next global batch.\"\"\"

            def __init__(self, host, num_hosts):
                self.host, self.num_hosts, self.step = host, num_hosts, 0
                self.it = grain_host_pipeline(host, num_hosts, RECORD_WEIGHTS[0])

            def __next__(self):
                if self.step in RECORD_WEIGHTS and self.step > 0:  # a new stage: save, rebuild, restore
                    state = self.it.get_state()
                    self.it = grain_host_pipeline(self.host, self.num_hosts, RECORD_WEIGHTS[self.step])
                    self.it.set_state(state)
                rows = [next(self.it) for _ in range(size_at(self.step) // self.num_hosts)]
                self.step += 1
                return {f: np.stack([r[f] for r in rows]) for f in FIELDS}


        class StandardLoader(SimulatedHosts):
            def __init__(self, num_hosts, skip=0):
                super().__init__([GrainHost(h, num_hosts) for h in range(num_hosts)])
                for _ in range(skip):
                    next(self)
        """,
    ),
]
LLM_SFT += [
    (
        "md",
        """\
        ## (a) Train on 8 devices, interrupt at step k, resume on 4 and on 2

        The uninterrupted reference runs all steps on 8 devices. At step `k` (after the
        ramp-up, before the stage change) we keep the model state and the loader state;
        each resumed run builds fresh loaders for its hosts, restores and continues on
        its smaller mesh, through the stage change.
        """,
    ),
    (
        "code",
        """\
        def resume_experiment(make_loader, resume):
            \"\"\"Reference losses and batches on 8 devices, and the losses resumed on 4 and 2.\"\"\"
            loader = make_loader(8)
            state_at_k, losses_a, batches_a = train(loader, initial_state, 8, RESUME_AT)
            loader_at_k = resume(loader)
            final_state, losses_b, batches_b = train(loader, state_at_k, 8, STEPS - RESUME_AT)
            reference = np.concatenate([losses_a, losses_b]), batches_a + batches_b, final_state
            resumed = {}
            for n in (4, 2):
                _, losses, batches = train(loader_at_k(n), state_at_k, n, STEPS - RESUME_AT)
                same = np.mean([np.array_equal(a, b) for a, b in zip(batches, reference[1][RESUME_AT:])])
                gap = np.abs(losses - reference[0][RESUME_AT:])
                print(
                    f"resumed on {n}: identical batches {same:.0%}; |loss - reference| mean {gap.mean():.2e}, max {gap.max():.2e}"
                )
                resumed[n] = losses, same
            return reference, resumed


        def zephon_resume(loader):
            state = loader.get_state()
            return lambda n: ZephonLoader(n, state=state)


        def standard_resume(loader):
            return lambda n: StandardLoader(n, skip=RESUME_AT)


        print("zephon_jax")
        zephon_reference, zephon_resumed = resume_experiment(ZephonLoader, zephon_resume)
        print("standard per-host Grain pipeline")
        standard_reference, standard_resumed = resume_experiment(StandardLoader, standard_resume)
        assert all(same == 1 for _, same in zephon_resumed.values())
        assert all(same < 0.5 for _, same in standard_resumed.values())
        """,
    ),
    (
        "code",
        """\
        steps = np.arange(1, STEPS + 1)
        resumed_steps = steps[RESUME_AT:]
        colors = {4: "tab:orange", 2: "tab:green"}
        floor = 1e-9

        fig, axes = plt.subplots(
            2, 2, figsize=(11, 6.2), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
        )
        panels = [
            ("zephon_jax", zephon_reference[0], zephon_resumed),
            (
                "standard Grain pipeline (shard, mix and pack per host)",
                standard_reference[0],
                standard_resumed,
            ),
        ]
        for col, (title, reference, resumed) in enumerate(panels):
            top, bottom = axes[0, col], axes[1, col]
            top.plot(steps, reference, color="black", lw=1.6, label="uninterrupted, 8 devices")
            for n, (losses, _) in resumed.items():
                style, marker = ("--", "o") if n == 4 else (":", "x")
                top.plot(
                    resumed_steps, losses, style, color=colors[n], lw=1.4, label=f"resumed on {n} devices"
                )
                gap = np.maximum(np.abs(losses - reference[RESUME_AT:]), floor)
                bottom.plot(
                    resumed_steps, gap, marker, color=colors[n], ms=3, alpha=0.8, label=f"{n} devices"
                )
            for ax in (top, bottom):
                ax.axvline(RESUME_AT, color="gray", lw=0.8)
                ax.axvline(RAMP, color="tab:red", lw=0.6, ls=":")
                ax.axvline(STAGE, color="tab:blue", lw=0.6, ls=":")
            top.set_title(title, fontsize=11)
            top.set_ylabel("training loss")
            top.legend(fontsize=8, loc="upper right")
            bottom.set_yscale("log")
            bottom.set_ylim(floor * 0.3, 10)
            ticks = [floor, 1e-7, 1e-5, 1e-3, 1e-1, 10]
            bottom.set_yticks(ticks, ["0"] + [f"1e{int(np.log10(t))}" for t in ticks[1:]])
            bottom.legend(fontsize=8, loc="center right")
            bottom.set_ylabel("|loss - reference|")
            bottom.set_xlabel(
                f"step (interrupted at {RESUME_AT}; dotted: ramp-up at {RAMP}, stage change at {STAGE})"
            )
        fig.tight_layout()
        plt.show()
        """,
    ),
    (
        "md",
        """\
        ## (b) Train from scratch on 1, 2, 4 and 8 devices, evaluate on one held-out set

        The small version of the downstream-evaluation experiment: the same model, the
        same initialization and the same pipeline, trained for `STEPS` steps on each
        device count (the 8-device runs are the references of (a)). Every model is then
        scored on the same held-out batches, on one device: the loss on the held-out
        files' text, and the loss on the assistant's answers of the held-out
        conversations.
        """,
    ),
    (
        "code",
        """\
        def held_out_batches(weights, num_batches=4):
            ds = training_rows(zj.Dataset.mix(components(True), weights, unit="tokens")).batch(16)
            it = iter(zj.Loader(ds))
            return [next(it) for _ in range(num_batches)]


        EVAL_SETS = {
            "held-out text": held_out_batches([1.0, 0.0]),
            "held-out answers": held_out_batches([0.0, 1.0]),
        }
        one_device = mesh_sharding(1, PartitionSpec())
        eval_loss = jax.jit(loss_fn)


        def scores(state):
            params = jax.device_put(state[0], one_device)
            return {
                name: float(np.mean([eval_loss(params, jax.device_put(b, one_device)) for b in batches]))
                for name, batches in EVAL_SETS.items()
            }


        results = {}
        for name, make_loader, reference in (
            ("zephon_jax", ZephonLoader, zephon_reference),
            ("standard", StandardLoader, standard_reference),
        ):
            results[name] = {8: scores(reference[2])}
            for n in (4, 2, 1):
                final_state, _, batches = train(make_loader(n), initial_state, n, STEPS)
                if name == "zephon_jax":
                    assert all(np.array_equal(a, b) for a, b in zip(batches, reference[1]))
                results[name][n] = scores(final_state)
            for n in (1, 2, 4, 8):
                print(
                    f"{name:10s} trained on {n} devices: "
                    + ", ".join(f"{k} {v:.6f}" for k, v in results[name][n].items())
                )
        """,
    ),
    (
        "code",
        """\
        DEVICES = [1, 2, 4, 8]
        loader_colors = {"zephon_jax": "tab:blue", "standard": "tab:red"}
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), gridspec_kw={"width_ratios": [2, 2, 1.5]})
        spreads = {}
        for ax, metric in zip(axes[:2], EVAL_SETS):
            for name, color in loader_colors.items():
                values = np.array([results[name][n][metric] for n in DEVICES])
                spreads[name, metric] = values.max() - values.min()
                ax.plot(
                    DEVICES, values, "o-", color=color, label=f"{name}: spread {spreads[name, metric]:.1e}"
                )
            ax.set_xscale("log", base=2)
            ax.set_xticks(DEVICES, [str(n) for n in DEVICES])
            ax.set_xlabel("devices trained on")
            ax.set_ylabel("loss")
            ax.set_title(metric)
            ax.legend(fontsize=8)
        floor = 1e-9
        x = np.arange(len(EVAL_SETS))
        for i, (name, color) in enumerate(loader_colors.items()):
            axes[2].bar(
                x + (i - 0.5) * 0.38,
                [max(spreads[name, m], floor) for m in EVAL_SETS],
                0.38,
                color=color,
                label=name,
            )
        axes[2].set_yscale("log")
        axes[2].set_ylim(floor * 0.3, 10)
        ticks = [floor, 1e-7, 1e-5, 1e-3, 1e-1]
        axes[2].set_yticks(ticks, ["0"] + [f"1e{int(np.log10(t))}" for t in ticks[1:]])
        axes[2].set_xticks(x, [m.replace("held-out ", "") for m in EVAL_SETS])
        axes[2].set_title("spread: max - min over 1, 2, 4, 8")
        axes[2].legend(fontsize=8, loc="upper left")
        fig.tight_layout()

        # The documentation's figure is written only when asked, by a full-size run of
        # `python notebooks/_build_notebooks.py --execute --figures` (ZEPHON_NB_FIGURES=1).
        if os.environ.get("ZEPHON_NB_FIGURES") == "1":
            fig.savefig("../docs/_static/llm_sft_eval.png", dpi=110)
        plt.show()
        """,
    ),
    (
        "code",
        """\
        for metric in EVAL_SETS:
            z, s = spreads["zephon_jax", metric], spreads["standard", metric]
            print(f"{metric:16s} spread over 1/2/4/8 devices: zephon_jax {z:.1e}, standard {s:.1e}")
        gaps = {
            name: max(np.abs(r[0] - ref[0][RESUME_AT:]).max() for r in res.values())
            for name, ref, res in (
                ("zephon_jax", zephon_reference, zephon_resumed),
                ("standard", standard_reference, standard_resumed),
            )
        }
        print(
            f"(a) max |resumed loss - reference|: zephon_jax {gaps['zephon_jax']:.1e}, standard {gaps['standard']:.1e}"
        )
        assert gaps["zephon_jax"] < 1e-3 < gaps["standard"]
        assert all(
            spreads["zephon_jax", m] < 1e-3 and spreads["zephon_jax", m] * 10 < spreads["standard", m]
            for m in EVAL_SETS
        )
        """,
    ),
    (
        "md",
        """\
        With zephon_jax every topology trains on the same global batches, through the
        tokenizer, the chat masks, the token-weighted stages and the ramp-up: the
        resumed curves lie on the reference, and the models trained on 1, 2, 4 and 8
        devices score the same on the held-out set up to the order of floating-point
        reductions. With the per-host pipeline the device count decides which records
        each step sees, and it shows in the evaluation: a different score for each
        device count, from data order alone.
        """,
    ),
]


NOTEBOOKS = {
    "01_quickstart.ipynb": QUICKSTART,
    "02_elastic_resume.ipynb": ELASTIC,
    "03_packing_and_mixtures.ipynb": PACKING,
    "04_llm_sft.ipynb": LLM_SFT,
}


def build(cells) -> nbformat.NotebookNode:
    """A notebook (without outputs) from ``(kind, source)`` pairs."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "colab": {"provenance": []},
    }
    for kind, source in cells:
        source = textwrap.dedent(source).strip("\n")
        if kind == "md":
            nb.cells.append(nbformat.v4.new_markdown_cell(source))
        else:
            nb.cells.append(nbformat.v4.new_code_cell(source))
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"
    return nb


def keep_outputs(nb: nbformat.NotebookNode, committed: nbformat.NotebookNode) -> None:
    """Copies ``committed``'s metadata, and its code cells' outputs, execution counts and
    metadata, into ``nb``'s cells of the same id (the cells' order and kinds must not
    have changed), so that only the sources change."""
    nb.metadata = committed.metadata
    old = {c["id"]: c for c in committed.cells if c.cell_type == "code"}
    for cell in nb.cells:
        if cell.cell_type == "code" and cell["id"] in old:
            for key in ("outputs", "execution_count", "metadata"):
                cell[key] = old[cell["id"]][key]


def execute(nb: nbformat.NotebookNode, timeout: int = 1200) -> nbformat.NotebookNode:
    """Runs ``nb`` in a fresh kernel with this directory as its working directory."""
    from nbclient import NotebookClient

    NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}
    ).execute()
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebooks to write (default: all)")
    parser.add_argument("--execute", action="store_true", help="run them and keep the outputs")
    parser.add_argument(
        "--figures",
        action="store_true",
        help="with --execute: also write the documentation's figures (docs/_static/*.png)",
    )
    parser.add_argument(
        "--keep-outputs",
        action="store_true",
        help="without --execute: keep each cell's committed outputs (for edits that leave them as they are)",
    )
    args = parser.parse_args(argv)
    if args.figures and not args.execute:
        parser.error("--figures needs --execute (the figures come from a full-size run)")
    if args.keep_outputs and args.execute:
        parser.error("--keep-outputs and --execute exclude each other")
    names = args.names or list(NOTEBOOKS)
    if args.execute:
        os.environ.pop("ZEPHON_NB_STEPS", None)  # full size
        os.environ.pop("ZEPHON_NB_FIGURES", None)
        if args.figures:
            os.environ["ZEPHON_NB_FIGURES"] = "1"
    for name in names:
        nb = build(NOTEBOOKS[name])
        if args.keep_outputs:
            keep_outputs(nb, nbformat.read(HERE / name, as_version=4))
        if args.execute:
            start = time.perf_counter()
            execute(nb)
            print(f"{name}: executed in {time.perf_counter() - start:.0f} s", file=sys.stderr)
        nbformat.write(nb, HERE / name)
        print(f"wrote {HERE / name} ({(HERE / name).stat().st_size / 1e3:.0f} kB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
