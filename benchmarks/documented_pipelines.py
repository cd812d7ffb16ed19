"""The documented pipelines, on both sides: the LLM training pipeline and the README example.

* ``llm``: two ``TokenStore`` corpora mixed by tokens, ``mix(unit="tokens") ->
  shuffle -> split(2048) -> pack(2048) -> to_training -> batch(64)``
  (``docs/llm_training.md``). Grain as MaxText configures it: the stores as
  random-access sources, ``MapDataset.mix`` (by records: its weights are the
  token shares over each store's mean document length, which gives the same
  token shares in expectation), ``read_threads=0``, long documents cut by a
  ``FlatMapTransform``, ``FirstFitPackIterDataset`` with one bin per batch row,
  and the same shift as a ``map`` (``training_arrays``, the function
  ``to_training`` runs), then ``batch``.
* ``readme``: the README's example at the benchmark's sizes: ``mix`` by records of
  two corpora -> ``shuffle -> filter -> split -> pack(best_fit) ->
  window_shuffle(16) -> batch``; Grain: ``MapDataset.mix -> shuffle -> filter``,
  ``read_threads=0``, the same split, ``BestFitPackIterDataset`` with one bin per
  batch row, ``WindowShuffleIterDataset(16)``, ``batch``.
"""

from __future__ import annotations

import os
from typing import Any

import grain
import numpy as np
from grain.experimental import (
    BestFitPackIterDataset,
    FirstFitPackIterDataset,
    FlatMapIterDataset,
    WindowShuffleIterDataset,
)
from grain_baselines import READ_OPTIONS, SplitLong

import zephon_jax as zj
from zephon_jax.sources.token_store import TokenStore, TokenStoreWriter
from zephon_jax.transforms.to_training import training_arrays

LLM_TOKEN_SHARES = [0.7, 0.3]
README_WEIGHTS = [0.7, 0.3]
WINDOW = 16


def write_stores(
    corpora: list[list[dict[str, np.ndarray]]], directory: str, compression: str | None = None
) -> list[TokenStore]:
    """Writes each corpus into a TokenStore (int32; plain, the writer's default, or
    ``compression``) under ``directory``; returns them opened."""
    stores = []
    for i, docs in enumerate(corpora):
        path = os.path.join(directory, f"store{i}")
        with TokenStoreWriter(path, dtype="int32", compression=compression) as writer:
            writer.extend(d["tokens"] for d in docs)
        stores.append(TokenStore(path))
    return stores


def record_weights(stores: list[TokenStore], token_shares: list[float]) -> list[float]:
    """Record weights that give ``token_shares`` of the tokens in expectation."""
    raw = [s / (store.num_tokens / store.num_docs) for s, store in zip(token_shares, stores)]
    return [w / sum(raw) for w in raw]


def llm_zephon(
    stores: list[TokenStore], seq_len: int, batch_size: int, num_lanes: int | None = None
) -> zj.BatchedDataset:
    """The LLM pipeline of the docs, zephon_jax's defaults (best fit, 32 open rows per lane;
    ``num_lanes=None``: one lane per batch row)."""
    comps = [zj.Dataset.source(s) for s in stores]
    return (
        zj.Dataset.mix(comps, LLM_TOKEN_SHARES, unit="tokens")
        .shuffle(0)
        .split(seq_len)
        .pack(seq_len)
        .to_training(pad_id=0)
        .batch(batch_size, num_lanes)
    )


class Shift(grain.transforms.Map):
    """A packed row -> training fields: the function zephon_jax's ``to_training`` runs."""

    def map(self, element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return training_arrays(element, 0)


def llm_grain(stores: list[TokenStore], seq_len: int, batch_size: int) -> grain.IterDataset:
    """The same with Grain as MaxText configures it (see the module docstring)."""
    weights = record_weights(stores, LLM_TOKEN_SHARES)
    sources = [grain.MapDataset.source(s) for s in stores]
    ds = grain.MapDataset.mix(sources, weights).shuffle(seed=0).repeat()
    it = FlatMapIterDataset(ds.to_iter_dataset(READ_OPTIONS), SplitLong(seq_len))
    it = FirstFitPackIterDataset(
        it, length_struct={"tokens": seq_len}, num_packing_bins=batch_size, seed=0
    )
    return it.map(Shift()).batch(batch_size, drop_remainder=True)


def long_enough(record: dict[str, np.ndarray]) -> bool:
    """The README example's filter."""
    return len(record["tokens"]) > 1


def readme_zephon(corpora: list[list[dict]], seq_len: int, batch_size: int) -> zj.BatchedDataset:
    """The README example at ``seq_len`` and ``batch_size``."""
    comps = [zj.Dataset.source(c) for c in corpora]
    return (
        zj.Dataset.mix(comps, weights=README_WEIGHTS)
        .shuffle(seed=0)
        .filter(long_enough)
        .split(seq_len)
        .pack(seq_len, method="best_fit")
        .window_shuffle(WINDOW, seed=1)
        .batch(batch_size)
    )


def readme_grain(
    corpora: list[list[dict]], seq_len: int, batch_size: int, window: bool = True
) -> grain.IterDataset:
    """The same with Grain: one best-fit bin per batch row, ``read_threads=0``.

    ``window=False`` leaves out the window shuffle: Grain's ``WindowShuffleIterDataset``
    permutes each window with one ``index_shuffle`` call per element, which costs
    milliseconds per call for a window as small as 16, so the case also times Grain
    without it (a different pipeline, shown beside, not compared).
    """
    sources = [grain.MapDataset.source(c) for c in corpora]
    ds = grain.MapDataset.mix(sources, README_WEIGHTS).shuffle(seed=0).repeat()
    it = ds.filter(long_enough).to_iter_dataset(READ_OPTIONS)
    it = FlatMapIterDataset(it, SplitLong(seq_len))
    it = BestFitPackIterDataset(
        it, length_struct={"tokens": seq_len}, num_packing_bins=batch_size, seed=0
    )
    if window:
        it = WindowShuffleIterDataset(it, window_size=WINDOW, seed=1)
    return it.batch(batch_size, drop_remainder=True)


def count_training(batch: dict[str, Any]) -> tuple[float, float]:
    """Real (non-padding) tokens and token slots of a ``to_training`` batch."""
    seg = batch["segment_ids"]
    return float(np.count_nonzero(seg)), float(seg.size)
