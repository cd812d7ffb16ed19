"""A leaf of the sampler: one random-access source, optionally shuffled and repeated."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from zephon_jax.core.permutation import derive_key, permute
from zephon_jax.errors import PipelineError


def describe_source(source: Any) -> str:
    """A stable description of a source for the pipeline fingerprint."""
    fingerprint = getattr(source, "fingerprint", None)
    if callable(fingerprint):
        return f"{type(source).__name__}({fingerprint()})"
    return f"{type(source).__name__}(len={len(source)})"


def source_label(source: Any) -> str:
    """A description of a source for error messages: its fingerprint plus its file paths."""
    label = describe_source(source)
    paths = getattr(source, "paths", None)
    if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__"):
        paths = [paths]
    if isinstance(paths, (list, tuple)) and paths:
        shown = ", ".join(str(p) for p in paths[:3])
        label += f" [files: {shown}{', ...' if len(paths) > 3 else ''}]"
    return label


@dataclasses.dataclass(frozen=True)
class SourceNode:
    """A random-access source (``__len__`` and ``__getitem__``) as a sampler leaf.

    Lane ``l`` reads the source's global stream at indices ``g = j * num_lanes + l``
    for its leaf-local draws ``j = 0, 1, ...``; ``g // len(source)`` is the epoch and,
    when shuffled, each epoch applies its own keyed permutation.
    """

    source: Any
    shuffle_seed: int | None = None
    num_epochs: int | None = None
    transforms: tuple = ()
    name: str | None = None  # a readable name for provenance; not part of the fingerprint
    # The seed given to Dataset.shuffle (shuffle_seed derives from it), for messages only.
    given_seed: int | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        if not hasattr(self.source, "__len__") or not hasattr(self.source, "__getitem__"):
            raise PipelineError(
                f"Dataset.source needs a random-access source with __len__ and __getitem__ "
                f"(a list, grain.sources.ArrayRecordDataSource, TokenStore); got "
                f"{type(self.source).__name__}"
            )
        if len(self.source) == 0:
            raise PipelineError(
                f"the source {describe_source(self.source)} is empty; every source needs at "
                "least one record"
            )

    @property
    def size(self) -> int:
        return len(self.source)

    def locate(self, lane: int | np.ndarray, draws: np.ndarray, num_lanes: int):
        """Returns (record_indices, epochs, valid) for leaf-local draws of ``lane`` (or of
        ``lane[i]`` for draw ``i``, given an array of lanes)."""
        n = self.size
        g = draws.astype(np.int64) * num_lanes + lane
        epochs = g // n
        records = g - epochs * n
        if self.shuffle_seed is not None and len(g):  # each epoch's draws by its own key
            _permute_by_epoch(records, epochs, n, self.shuffle_seed)
        valid = (
            np.ones(g.shape, dtype=bool) if self.num_epochs is None else epochs < self.num_epochs
        )
        return records, epochs, valid

    def draws_available(self, lane: int, num_lanes: int) -> int | None:
        """How many leaf-local draws of ``lane`` fall inside the epochs (None: unbounded)."""
        if self.num_epochs is None:
            return None
        total = self.num_epochs * self.size
        return max(0, -(-(total - lane) // num_lanes))

    def describe(self) -> dict:
        return {
            "source": describe_source(self.source),
            "shuffle_seed": self.shuffle_seed,
            "num_epochs": self.num_epochs,
            "transforms": [t.describe() for t in self.transforms],
        }


def _permute_by_epoch(records: np.ndarray, epochs: np.ndarray, n: int, seed: int) -> None:
    """Permutes, in place, each epoch's ``records`` (indices in ``[0, n)``) by that
    epoch's key. One lane's draws come in order, so their epochs are runs of slices;
    draws of several lanes one after the other are sorted by epoch first."""
    order = None
    if (epochs[1:] < epochs[:-1]).any():
        order = np.argsort(epochs, kind="stable")
        epochs = epochs[order]
    bounds = [0, *(np.flatnonzero(np.diff(epochs)) + 1).tolist(), len(epochs)]
    for start, stop in zip(bounds[:-1], bounds[1:]):
        where = slice(start, stop) if order is None else order[start:stop]
        records[where] = permute(records[where], n, derive_key(seed, int(epochs[start])))
