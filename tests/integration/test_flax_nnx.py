"""Flax NNX on zephon_jax batches: the mesh helper, the segment mask, the example's resume."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zephon_jax as zj

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "flax_nnx_train.py"


def test_helpers_load_jax_on_first_use_only():
    code = (
        "import sys, zephon_jax as zj\n"
        "assert 'jax' not in sys.modules\n"
        "assert {'data_mesh', 'segment_mask'} <= set(dir(zj))\n"
        "assert zj.segment_mask is sys.modules['zephon_jax.attention'].segment_mask\n"
        "assert zj.data_mesh is sys.modules['zephon_jax.sharding'].data_mesh\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_data_mesh_is_auto_and_an_nnx_embedding_takes_its_batches():
    mesh = zj.data_mesh()
    assert mesh.axis_names == ("data",) and mesh.size == jax.device_count()
    assert all(str(t).endswith("Auto") for t in mesh.axis_types)
    assert zj.data_mesh(1, "rows").axis_names == ("rows",)
    embed = nnx.Embed(16, 4, rngs=nnx.Rngs(0))
    tokens = jax.device_put(
        np.arange(8, dtype=np.int32).reshape(2, 4), NamedSharding(mesh, P("data"))
    )
    out = nnx.jit(lambda m, x: m(x))(embed, tokens)
    assert out.shape == (2, 4, 4)
    with pytest.raises(zj.PipelineError, match=r"num_devices=0\) needs between 1 and"):
        zj.data_mesh(0)


def reference_mask(segment_ids: np.ndarray) -> np.ndarray:
    b, t = segment_ids.shape
    mask = np.zeros((b, 1, t, t), bool)
    for r in range(b):
        for i in range(t):
            for j in range(t):
                mask[r, 0, i, j] = j <= i and segment_ids[r, j] == segment_ids[r, i]
    return mask


def test_segment_mask_is_causal_within_each_segment():
    rng = np.random.default_rng(0)
    segments = np.sort(rng.integers(1, 4, (3, 12)), axis=1).astype(np.int32)
    segments[:, 9:] = 0  # padding
    got = np.asarray(zj.segment_mask(segments))
    assert got.dtype == bool and got.shape == (3, 1, 12, 12)
    assert (got == reference_mask(segments)).all()
    assert got[:, 0].any(axis=-1).all()  # every query has a key
    with pytest.raises(ValueError, match=r"shape \[batch, length\]"):
        zj.segment_mask(jnp.zeros(5, jnp.int32))


def test_segment_mask_keeps_packed_documents_apart_in_attention():
    """A document's outputs do not depend on the document packed before it."""
    attention = nnx.MultiHeadAttention(num_heads=2, in_features=8, decode=False, rngs=nnx.Rngs(1))
    x = jax.random.normal(jax.random.key(0), (1, 6, 8))
    changed = x.at[0, :2].set(jax.random.normal(jax.random.key(1), (2, 8)))
    segments = jnp.array([[1, 1, 2, 2, 2, 0]], jnp.int32)
    mask = zj.segment_mask(segments)
    a, b = attention(x, mask=mask), attention(changed, mask=mask)
    np.testing.assert_allclose(a[0, 2:], b[0, 2:], rtol=1e-6)
    assert not np.allclose(a[0, :2], b[0, :2])


def run_example(workdir: Path, steps: int, devices: int, says: str) -> list[dict]:
    """Runs the example on ``devices`` simulated devices; its first line must match ``says``."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), f"--workdir={workdir}", f"--steps={steps}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    first_line = proc.stdout.splitlines()[0]
    assert re.fullmatch(says, first_line), first_line
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_example_resumes_on_another_device_count(tmp_path):
    """Six steps on 8 devices, then on to step 8 on 4: the uninterrupted run's batches and losses."""
    spec = importlib.util.spec_from_file_location("flax_nnx_train", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = example.parse_args(["--workdir", str(tmp_path)])
    model, optimizer = example.make_model(args)
    expected = []
    for batch in zj.Loader(example.make_dataset(args.batch_size, args.seq_len)):
        loss = example.train_step(model, optimizer, batch)
        expected.append({"batch": example.batch_digest(batch), "loss": float(loss)})
        if len(expected) == 8:
            break

    first = run_example(tmp_path, 6, 8, r"no checkpoint in .*: training from step 1 on 8 .*")
    assert [r["step"] for r in first] == list(range(1, 7))
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [3, 6]
    resumed = run_example(tmp_path, 8, 4, r"resumed from step 6 in .* on 4 device\(s\)")
    assert [r["step"] for r in resumed] == [7, 8]
    runs = first + resumed
    assert [r["batch"] for r in runs] == [e["batch"] for e in expected]
    np.testing.assert_allclose([r["loss"] for r in runs], [e["loss"] for e in expected], rtol=1e-4)
    assert runs[-1]["loss"] < runs[0]["loss"] - 1.0  # it learns
