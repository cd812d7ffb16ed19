"""Fixtures shared by the JAX loader tests, and the tiers' markers.

Every test gets the marker of the folder it is in: ``unit`` (``tests/unit/``: fast
tests of one module each), ``integration`` (``tests/integration/``: topologies, processes,
object stores, faults, Orbax, Beam) or ``docs`` (``tests/docs/``: the README, the
documentation site, the notebooks). ``python -m pytest -m unit`` runs one tier.
"""

from __future__ import annotations

from pathlib import Path

import mp_worker
import pytest
from cli_pipelines import pipelines  # noqa: F401 (the command's tests' fixture)

TIERS = ("unit", "integration", "docs")
TESTS = Path(__file__).resolve().parent


def tier_of(path: Path) -> str | None:
    """The tier of the test file at ``path``: the first folder under ``tests/``."""
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


def pytest_collection_modifyitems(config, items):
    """Marks each test with its folder's tier."""
    for item in items:
        tier = tier_of(Path(str(item.path)))
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))


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
