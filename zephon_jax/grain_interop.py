"""Grain interop: a zephon_jax pipeline as a ``grain.IterDataset``.

For training loops built around Grain (``iter(ds)``, ``it.get_state()``,
``it.set_state(state)``, ``grain.checkpoint.CheckpointSave``), wrap a batched
pipeline::

    from zephon_jax.grain_interop import ZephonIterDataset

    ds = ZephonIterDataset(batched, process_index=i, process_count=n)
    it = iter(ds.map(to_model_inputs))   # further Grain transformations are fine
    ...
    state = it.get_state()               # JSON-able dict

The iterator's state is the loader state made JSON-able (each lane's bytes as a
base64 string), as Grain's checkpointing (``json.dumps`` of the state)
requires. Unlike Grain's own per-process states, it restores onto any
topology: merge the states of all processes with :func:`merge_grain_states`
and give the result to every process of the new topology. Batches are the same
global rows as :class:`zephon_jax.Loader` gives, on every topology.

Grain sources (``grain.sources.*``, any random-access data source) and Grain
transforms (``grain.transforms.Map``/``RandomMap``/``Filter`` objects) plug into
:class:`zephon_jax.Dataset` directly: ``Dataset.source(src).map(grain_map)``.
"""

from __future__ import annotations

import base64
from typing import Any, Iterable, Mapping

import grain
import numpy as np

from zephon_jax.dataset import BatchedDataset
from zephon_jax.errors import StateError
from zephon_jax.loader import Loader
from zephon_jax.state.global_state import merge_states

GRAIN_STATE_KEY = "zephon_jax"


def state_to_json(state: Mapping[str, Any]) -> dict[str, Any]:
    """A loader state as JSON-able data: lane bytes become base64 strings."""
    return {
        "format": state["format"],
        "version": int(state["version"]),
        "fingerprint": dict(state["fingerprint"]),
        "step": int(state["step"]),
        "lanes": {
            str(k): base64.b64encode(np.asarray(v, dtype=np.uint8).tobytes()).decode("ascii")
            for k, v in state["lanes"].items()
        },
    }


def state_from_json(data: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`state_to_json`."""
    try:
        lanes = {
            str(k): np.frombuffer(base64.b64decode(v, validate=True), dtype=np.uint8).copy()
            for k, v in data["lanes"].items()
        }
        return {
            "format": data["format"],
            "version": int(data["version"]),
            "fingerprint": dict(data["fingerprint"]),
            "step": int(data["step"]),
            "lanes": lanes,
        }
    except (KeyError, TypeError, ValueError) as e:
        raise StateError(
            f"not a zephon_jax state in JSON form ({type(e).__name__}: {e}); pass what "
            "ZephonDatasetIterator.get_state() returned"
        ) from e


def _unwrap(state: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(state, Mapping) or GRAIN_STATE_KEY not in state:
        raise StateError(
            "this Grain iterator state was not made by a zephon_jax ZephonDatasetIterator "
            f"(no {GRAIN_STATE_KEY!r} entry); restore states from the same pipeline"
        )
    return state[GRAIN_STATE_KEY]


def merge_grain_states(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Merges the Grain iterator states of all processes into one that restores anywhere."""
    merged = merge_states(state_from_json(_unwrap(s)) for s in states)
    return {GRAIN_STATE_KEY: state_to_json(merged)}


class ZephonDatasetIterator(grain.DatasetIterator):
    """A Grain iterator over a zephon_jax loader; its state is JSON-able."""

    def __init__(self, loader: Loader):
        super().__init__()
        self._iterator = iter(loader)

    def __next__(self) -> Any:
        return next(self._iterator)

    def get_state(self) -> dict[str, Any]:
        """``{"zephon_jax": <loader state with base64 lanes>}``, after the last batch returned."""
        return {GRAIN_STATE_KEY: state_to_json(self._iterator.get_state())}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from ``state`` (this process's, or merged from any topology)."""
        self._iterator.set_state(state_from_json(_unwrap(state)))

    def close(self) -> None:
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()

    def __str__(self) -> str:
        return f"ZephonDatasetIterator(step={self._iterator.step})"


class ZephonIterDataset(grain.IterDataset):
    """A batched zephon_jax pipeline as a ``grain.IterDataset`` of global-row batches.

    ``loader_kwargs`` go to :class:`zephon_jax.Loader` (``process_index``,
    ``process_count``, ``num_workers``, ``sharding``, ...). Each element is one
    batch, this process's rows of global batch ``t``.
    """

    def __init__(self, batched: BatchedDataset, **loader_kwargs: Any):
        super().__init__()
        if not isinstance(batched, BatchedDataset):
            raise TypeError(
                f"ZephonIterDataset needs a batched zephon_jax pipeline (ending in .batch(...)); "
                f"got {type(batched).__name__}"
            )
        self.batched = batched
        self.loader_kwargs = loader_kwargs

    def __iter__(self) -> ZephonDatasetIterator:
        return ZephonDatasetIterator(Loader(self.batched, **self.loader_kwargs))

    def __str__(self) -> str:
        return f"ZephonIterDataset({self.batched!r})"
