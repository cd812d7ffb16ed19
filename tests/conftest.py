"""Fixtures shared by the JAX loader tests."""

from __future__ import annotations

import mp_worker
import pytest


@pytest.fixture(scope="module")
def dataset():
    """The multi-process tests' packing pipeline (batch 16)."""
    return mp_worker.make_pipeline()


@pytest.fixture(scope="module")
def sharding():
    """Rows sharded over a one-device mesh."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
    return NamedSharding(mesh, PartitionSpec("data"))
