"""zephon_jax: elastic-deterministic data loading for JAX.

Global batch ``t``, row ``r`` is the same record, bit for bit, whatever the
number of processes, devices or workers, and across checkpoints restored on
another topology, also through packing, splitting, shuffle buffers and mixtures.
"""

from zephon_jax.core.kernels import set_compiled
from zephon_jax.core.lineage import Element, derive
from zephon_jax.dataset import BatchedDataset, Dataset
from zephon_jax.engine.accounting_report import accounting, merge_accounting
from zephon_jax.engine.explain import explain_step
from zephon_jax.errors import (
    PipelineError,
    RecordError,
    StateError,
    StateMismatchError,
    WorkerError,
    ZephonError,
)
from zephon_jax.loader import Loader, LoaderIterator
from zephon_jax.operators import (
    LineageOperator,
    Operator,
    Saved,
    lineage_operator,
    made_from,
    stateless,
)
from zephon_jax.state.files import load_state, save_state
from zephon_jax.state.global_state import exclude, merge_states

__version__ = "0.3.0"  # the package version (pyproject.toml and the docs read it)

# Imported on first use, so that ``import zephon_jax`` does not start jax, orbax or
# tensorstore: ``zj.checkpoint``, ``zj.sharding`` and ``zj.sources`` work after
# ``import zephon_jax as zj``.
_LAZY_SUBMODULES: tuple[str, ...] = ("attention", "checkpoint", "sharding", "sources")
# Functions that need jax, also imported on first use: name -> module.
_LAZY_FUNCTIONS = {"data_mesh": "sharding", "segment_mask": "attention"}


def __getattr__(name: str):
    import importlib

    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"zephon_jax.{name}")
    if name in _LAZY_FUNCTIONS:
        return getattr(importlib.import_module(f"zephon_jax.{_LAZY_FUNCTIONS[name]}"), name)
    raise AttributeError(f"module 'zephon_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_SUBMODULES) | set(_LAZY_FUNCTIONS))


__all__ = [
    "BatchedDataset",
    "Dataset",
    "Element",
    "LineageOperator",
    "Loader",
    "LoaderIterator",
    "Operator",
    "PipelineError",
    "Saved",
    "RecordError",
    "StateError",
    "StateMismatchError",
    "WorkerError",
    "ZephonError",
    "accounting",
    "derive",
    "exclude",
    "explain_step",
    "lineage_operator",
    "load_state",
    "made_from",
    "merge_accounting",
    "merge_states",
    "save_state",
    "set_compiled",
    "stateless",
]

# Interop and the command-line tools (zephon_jax.tools.prepare, ...), also on first use.
_LAZY_SUBMODULES += ("grain_interop", "tools")
