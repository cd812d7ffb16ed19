"""Grain pipelines for the side-by-side benchmark, configured as Grain's users would.

* In-memory sources read with ``ReadOptions(num_threads=0)``: Grain's default of
  16 read threads only contends for the GIL when a record costs nothing to read.
* One packing bin per batch row (``num_packing_bins = batch_size``), Grain's
  usual setting: its packer flushes all bins together when a record fits none,
  and a batch is made of one flush.
* Documents longer than ``seq_len`` are cut with a ``FlatMapTransform`` before
  packing (Grain's packers require it).
"""

from __future__ import annotations

from typing import Any

import grain
import numpy as np
from grain.experimental import (
    BestFitPackIterDataset,
    FirstFitPackIterDataset,
    FlatMapIterDataset,
    FlatMapTransform,
)

READ_OPTIONS = grain.ReadOptions(num_threads=0)


class SplitLong(FlatMapTransform):
    """Cuts ``{"tokens"}`` documents into pieces of at most ``max_len`` tokens."""

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.max_fan_out = 1 << 20

    def flat_map(self, element: dict[str, np.ndarray]):
        tokens = element["tokens"]
        n = self.max_len
        return [{"tokens": tokens[i : i + n]} for i in range(0, max(len(tokens), 1), n)]


def packing(
    corpus: list[dict[str, np.ndarray]],
    seq_len: int,
    batch_size: int,
    method: str = "first_fit",
    num_packing_bins: int | None = None,
    split: bool = True,
    seed: int = 0,
) -> grain.IterDataset:
    """shuffle -> repeat -> [split] -> pack(first_fit | best_fit) -> batch."""
    bins = batch_size if num_packing_bins is None else num_packing_bins
    ds = grain.MapDataset.source(corpus).shuffle(seed=seed).repeat()
    ds = ds.to_iter_dataset(READ_OPTIONS)
    if split:
        ds = FlatMapIterDataset(ds, SplitLong(seq_len))
    packer = {"first_fit": FirstFitPackIterDataset, "best_fit": BestFitPackIterDataset}[method]
    ds = packer(ds, length_struct={"tokens": seq_len}, num_packing_bins=bins, seed=seed)
    return ds.batch(batch_size, drop_remainder=True)


def _identity(x: Any) -> Any:
    return x


def map_batch(records: list[dict[str, Any]], batch_size: int, seed: int = 0) -> grain.IterDataset:
    """shuffle -> repeat -> map(identity) -> batch on ``{"x": np.int64}`` records."""
    return (
        grain.MapDataset.source(records)
        .shuffle(seed=seed)
        .repeat()
        .map(_identity)
        .to_iter_dataset(READ_OPTIONS)
        .batch(batch_size, drop_remainder=True)
    )


def flags_parsed() -> None:
    """Marks absl flags parsed: Grain's worker processes read one outside ``absl.app.run``."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
