"""``Loader(sharding=...)`` on 8 devices: meshes of several axes, per-field shardings, and
the accelerator check script, each in a subprocess started with 8 CPU devices (the device
count is fixed when jax starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/, where mesh_checks.py is


@pytest.fixture(scope="module")
def eight_device_results(tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("mesh") / "results.json"
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, str(HERE / "mesh_checks.py"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


MESH_CHECKS = [
    "data_tensor_mesh",
    "three_axis_mesh_pair_form",
    "per_field_shardings",
    "state_from_mesh_restores_on_one_device",
    "batch_not_divisible_by_shards",
]


@pytest.mark.parametrize("name", MESH_CHECKS)
def test_eight_device_mesh(eight_device_results, name):
    assert set(eight_device_results) == set(MESH_CHECKS)
    assert eight_device_results[name] == "ok", eight_device_results[name]


def test_accelerator_check_script_is_exact_on_eight_simulated_devices(tmp_path):
    """``benchmarks/accelerator_check.py`` (run as is on GPU and TPU hosts) passes here on 8
    CPU devices: every sharded batch, with prefetch, workers and a resume, is the
    reference's, byte for byte."""
    out = tmp_path / "figures.json"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    env["JAX_PLATFORMS"] = "cpu"
    script = HERE.parent / "benchmarks" / "accelerator_check.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    figures = json.loads(out.read_text())
    assert figures["platform"] == "cpu" and len(figures["devices"]) == 8
    assert figures["checks"] and all(figures["checks"].values()), figures["checks"]
    assert figures["device_vs_numpy"] > 0
