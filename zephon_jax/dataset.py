"""The fluent front end: ``Dataset.source(...).shuffle(...).map(...).pack(...).batch(...)``.

A ``Dataset`` is an immutable pipeline definition. Until the first n-to-m
operator it is a *sampler* (sources, mixtures, shuffles and per-record
transforms, all pure functions of a position); after it, a chain of operators
with per-lane carry, each followed by its own per-record transforms.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping, Sequence

from zephon_jax.checks import positive_int
from zephon_jax.errors import PipelineError
from zephon_jax.operators import (
    BinPackOperator,
    ConcatPackOperator,
    FlatMapOperator,
    LineageOperator,
    SplitOperator,
    UserOperator,
    WindowShuffleOperator,
)
from zephon_jax.sampler import MixtureNode, SourceNode, derive_key
from zephon_jax.sampler.mixture import normalize_weights
from zephon_jax.transforms import FilterTransform, MapTransform, RandomMapTransform

PACK_METHODS = ("best_fit", "first_fit", "concat")


def _check_seed(seed: Any, what: str) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        try:
            import numpy as np

            if isinstance(seed, np.integer):
                return int(seed)
        except ImportError:  # pragma: no cover
            pass
        raise PipelineError(f"{what} needs an int seed; got {seed!r}")
    return seed


def _with_transforms(node, transforms: tuple):
    return dataclasses.replace(node, transforms=transforms)


def _shuffle_node(node, seed: int, path: tuple = ()):
    if isinstance(node, SourceNode):
        return dataclasses.replace(node, shuffle_seed=derive_key(seed, *path))
    children = tuple(_shuffle_node(c, seed, path + (i,)) for i, c in enumerate(node.children))
    return dataclasses.replace(node, children=children, order_seed=derive_key(seed, *path, -1))


def _repeat_node(node, num_epochs):
    if isinstance(node, SourceNode):
        return dataclasses.replace(node, num_epochs=num_epochs)
    return dataclasses.replace(
        node, children=tuple(_repeat_node(c, num_epochs) for c in node.children)
    )


@dataclasses.dataclass(frozen=True)
class Stage:
    """An operator followed by the per-record transforms applied to its outputs."""

    operator: LineageOperator
    transforms: tuple = ()


class Dataset:
    """An immutable, elastic-deterministic pipeline definition.

    Build one with :meth:`source` or :meth:`mix`, chain transforms and operators,
    and finish with :meth:`batch` to get a :class:`BatchedDataset` for
    :class:`zephon_jax.Loader`.
    """

    def __init__(self, sampler, stages: tuple[Stage, ...] = ()):
        self._sampler = sampler
        self._stages = stages

    # ----- sampler ---------------------------------------------------------------
    @staticmethod
    def source(source: Any, *, name: str | None = None) -> Dataset:
        """A dataset over a random-access source (``__len__`` and ``__getitem__``).

        Lists, ``grain.sources.ArrayRecordDataSource`` and
        :class:`zephon_jax.sources.TokenStore` all work. The source repeats
        forever unless :meth:`repeat` gives a number of epochs. ``name`` is how
        provenance (:meth:`zephon_jax.LoaderIterator.provenance`) labels its
        records; it does not enter the pipeline fingerprint.
        """
        if name is not None and not isinstance(name, str):
            raise PipelineError(f"Dataset.source(name=) needs a str; got {name!r}")
        return Dataset(SourceNode(source, name=name))

    @staticmethod
    def mix(datasets: Sequence[Dataset], weights: Sequence[float]) -> Dataset:
        """Mixes datasets with exact long-run proportions ``weights`` (normalized).

        Every lane receives each component in proportion. Operators (``split``,
        ``pack``, ...) must come after the mixture, not inside its components.
        """
        datasets = list(datasets)
        for i, ds in enumerate(datasets):
            if not isinstance(ds, Dataset):
                raise PipelineError(f"Dataset.mix input {i} is {type(ds).__name__}, not a Dataset")
            if ds._stages:
                raise PipelineError(
                    f"Dataset.mix input {i} already has the operator "
                    f"{ds._stages[0].operator.describe()}; mix the sources first and apply "
                    "split/pack/window_shuffle/flat_map after the mixture"
                )
        normalized = normalize_weights(weights)
        if len(normalized) != len(datasets):
            raise PipelineError(
                f"Dataset.mix got {len(datasets)} datasets but {len(normalized)} weights; "
                "give one weight per dataset"
            )
        key = derive_key(len(datasets), *[round(w * 2**32) for w in normalized])
        return Dataset(MixtureNode(tuple(ds._sampler for ds in datasets), normalized, node_key=key))

    def shuffle(self, seed: int) -> Dataset:
        """Global shuffle, reseeded every epoch, with no materialized permutation.

        On a mixture it shuffles every component and the mixture order. Only
        valid before the first operator; use :meth:`window_shuffle` after one.
        """
        seed = _check_seed(seed, "shuffle")
        if self._stages:
            raise PipelineError(
                "shuffle must come before split/pack/window_shuffle/flat_map (it permutes "
                "record positions); use .window_shuffle(window, seed) after an operator"
            )
        return Dataset(_shuffle_node(self._sampler, seed))

    def repeat(self, num_epochs: int | None = None) -> Dataset:
        """Reads every source ``num_epochs`` times (``None``: forever, the default)."""
        num_epochs = positive_int(num_epochs, "repeat(num_epochs)", allow_none=True)
        if self._stages:
            raise PipelineError("repeat must come before split/pack/window_shuffle/flat_map")
        return Dataset(_repeat_node(self._sampler, num_epochs))

    # ----- per-record transforms -------------------------------------------------
    def _add_transform(self, transform) -> Dataset:
        if not self._stages:
            node = self._sampler
            return Dataset(_with_transforms(node, node.transforms + (transform,)))
        last = self._stages[-1]
        stages = self._stages[:-1] + (Stage(last.operator, last.transforms + (transform,)),)
        return Dataset(self._sampler, stages)

    def map(self, fn: Callable[[Any], Any]) -> Dataset:
        """Applies a pure ``fn(record) -> record`` (or a Grain ``MapTransform``)."""
        return self._add_transform(MapTransform(fn))

    def random_map(self, fn: Callable[[Any, Any], Any], seed: int) -> Dataset:
        """Applies ``fn(record, rng)``; ``rng`` derives from ``seed`` and the record's position."""
        return self._add_transform(RandomMapTransform(fn, _check_seed(seed, "random_map")))

    def filter(self, predicate: Callable[[Any], bool]) -> Dataset:
        """Keeps the records for which the pure ``predicate`` (or a Grain ``Filter``) holds."""
        return self._add_transform(FilterTransform(predicate))

    # ----- operators -------------------------------------------------------------
    def _add_operator(self, operator: LineageOperator) -> Dataset:
        return Dataset(self._sampler, self._stages + (Stage(operator),))

    def split(self, max_len: int, key: str = "tokens") -> Dataset:
        """Cuts records longer than ``max_len`` (measured on ``key``) into pieces."""
        return self._add_operator(SplitOperator(max_len, key))

    def pack(
        self,
        seq_len: int,
        method: str = "best_fit",
        num_bins: int | None = None,
        max_segments: int | None = None,
        dtypes: Mapping[str, Any] | None = None,
    ) -> Dataset:
        """Packs records into rows of ``seq_len`` with Grain's output fields.

        ``method``: ``"best_fit"`` (default) or ``"first_fit"`` over ``num_bins``
        open rows per lane (default 32), or ``"concat"`` (concat-then-split, no
        padding, ``num_bins`` not used). No row holds more than ``max_segments``
        records (pieces for ``"concat"``). Every 1-D field is packed aligned
        with the others; output fields are int32 unless ``dtypes`` (field ->
        numpy dtype) says otherwise, and a value that does not fit raises.
        """
        if method not in PACK_METHODS:
            raise PipelineError(f"pack(method={method!r}) is unknown; use one of {PACK_METHODS}")
        if method == "concat":
            if num_bins is not None:
                raise PipelineError("pack(method='concat') keeps one open row; drop num_bins")
            return self._add_operator(ConcatPackOperator(seq_len, max_segments, dtypes))
        return self._add_operator(BinPackOperator(seq_len, method, num_bins, max_segments, dtypes))

    def window_shuffle(self, window: int, seed: int) -> Dataset:
        """Shuffles within a sliding buffer of ``window`` elements per lane."""
        return self._add_operator(
            WindowShuffleOperator(window, _check_seed(seed, "window_shuffle"))
        )

    def flat_map(self, fn: Callable[[Any], Iterable[Any]]) -> Dataset:
        """Replaces each record by the records the pure ``fn`` returns for it."""
        return self._add_operator(FlatMapOperator(fn))

    def apply(self, operator: Any) -> Dataset:
        """Adds a user-defined operator.

        A :class:`zephon_jax.LineageOperator` (the contract of every operator)
        runs as it is and its state holds record pointers. Any other object with
        ``init()``, ``step(carry, record)`` and ``flush(carry)`` (a
        :class:`zephon_jax.Operator`) runs over records, its carry and in-flight
        outputs stored by value.
        """
        if isinstance(operator, LineageOperator):
            return self._add_operator(operator)
        return self._add_operator(UserOperator(operator))

    # ----- batching ----------------------------------------------------------------
    def batch(self, global_batch_size: int, num_lanes: int | None = None) -> BatchedDataset:
        """Groups rows into global batches of ``global_batch_size`` rows.

        The pipeline runs in ``num_lanes`` independent lanes (default: the global
        batch size); lane ``l`` owns rows ``[l*R, (l+1)*R)`` of every global batch,
        ``R = global_batch_size // num_lanes``. Neither depends on the topology.
        """
        return BatchedDataset(self, global_batch_size, num_lanes)

    def __repr__(self) -> str:
        ops = " -> ".join(s.operator.describe() for s in self._stages)
        return f"Dataset({self._sampler.describe()}{' -> ' + ops if ops else ''})"


class BatchedDataset:
    """A dataset cut into global batches by a fixed number of lanes."""

    def __init__(self, dataset: Dataset, global_batch_size: int, num_lanes: int | None = None):
        global_batch_size = positive_int(global_batch_size, "batch(global_batch_size)")
        num_lanes = positive_int(num_lanes, "batch(num_lanes)", allow_none=True)
        if num_lanes is None:
            num_lanes = global_batch_size
        if global_batch_size % num_lanes:
            raise PipelineError(
                f"global_batch_size={global_batch_size} is not a multiple of num_lanes={num_lanes}; "
                "every lane must own the same number of rows: choose num_lanes dividing the batch "
                "(the default, num_lanes=None, uses one lane per row)"
            )
        self.dataset = dataset
        self.global_batch_size = global_batch_size
        self.num_lanes = num_lanes

    @property
    def rows_per_lane(self) -> int:
        return self.global_batch_size // self.num_lanes

    @property
    def sampler(self):
        return self.dataset._sampler

    @property
    def is_finite(self) -> bool:
        """True if some source is read a finite number of epochs (see ``repeat``)."""
        from zephon_jax.sampler.resolve import leaves

        return any(leaf.num_epochs is not None for leaf in leaves(self.sampler))

    @property
    def stages(self) -> tuple[Stage, ...]:
        return self.dataset._stages

    def fingerprint(self) -> dict[str, str]:
        """The fields a state must match to be restored into this pipeline."""
        from zephon_jax.state import fingerprint

        return fingerprint(self)

    def __repr__(self) -> str:
        return (
            f"{self.dataset!r}.batch(global_batch_size={self.global_batch_size}, "
            f"num_lanes={self.num_lanes})"
        )
