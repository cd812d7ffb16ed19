"""zephon_jax pipelines for the side-by-side benchmark (the same work as ``grain_baselines``)."""

from __future__ import annotations

from typing import Any

import heavy
import numpy as np

import zephon_jax as zj


def packing(
    corpus: list[dict[str, np.ndarray]],
    seq_len: int,
    batch_size: int,
    method: str = "best_fit",
    num_bins: int | None = None,
    split: bool = True,
    num_lanes: int | None = None,
    seed: int = 0,
) -> zj.BatchedDataset:
    """shuffle -> [split] -> pack -> batch (``num_bins=None``: the default per lane)."""
    ds = zj.Dataset.source(corpus).shuffle(seed)
    if split:
        ds = ds.split(seq_len)
    return ds.pack(seq_len, method=method, num_bins=num_bins).batch(batch_size, num_lanes)


def heavy_map_pack(
    corpus: list[dict[str, np.ndarray]], seq_len: int = 2048, batch_size: int = 64
) -> zj.BatchedDataset:
    """shuffle -> map(heavy_document_map) -> split -> pack -> batch: the workers' pipeline."""
    return (
        zj.Dataset.source(corpus)
        .shuffle(0)
        .map(heavy.heavy_document_map)
        .split(seq_len)
        .pack(seq_len)
        .batch(batch_size)
    )


def _identity(x: Any) -> Any:
    return x


def map_batch(records: list[dict[str, Any]], batch_size: int, seed: int = 0) -> zj.BatchedDataset:
    """shuffle -> map(identity) -> batch on ``{"x": np.int64}`` records."""
    return zj.Dataset.source(records).shuffle(seed).map(_identity).batch(batch_size)
