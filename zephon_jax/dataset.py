"""The fluent front end: ``Dataset.source(...).shuffle(...).map(...).pack(...).batch(...)``.

A ``Dataset`` is an immutable pipeline definition. Until the first n-to-m
operator it is a *sampler* (sources, mixtures, shuffles and per-record
transforms, all pure functions of a position); after it, a chain of operators
with per-lane carry, each followed by its own per-record transforms.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping, Sequence

from zephon_jax.core.checks import positive_int
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
from zephon_jax.sampler.resolve import can_end
from zephon_jax.sampler.schedule import StepSchedule
from zephon_jax.sampler.scheduled_mixture import (
    UNITS,
    ScheduledMixtureNode,
    parse_weight_stages,
    quantize,
)
from zephon_jax.state.global_state import fingerprint
from zephon_jax.transforms import FilterTransform, MapTransform, RandomMapTransform
from zephon_jax.transforms.to_training import ToTrainingTransform
from zephon_jax.transforms.tokenize import TokenizeTransform
from zephon_jax.transforms.tokenize_chat import TokenizeChatTransform

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


def _has_scheduled_mixture(node) -> bool:
    if isinstance(node, ScheduledMixtureNode):
        return True
    return any(_has_scheduled_mixture(c) for c in getattr(node, "children", ()))


def _with_transforms(node, transforms: tuple):
    return dataclasses.replace(node, transforms=transforms)


def _shuffle_node(node, seed: int, path: tuple = ()):
    """``node`` shuffled by ``seed``: each node's seed derives from it and the node's path
    (and each keeps ``seed`` itself as ``given_seed``, for messages)."""
    if isinstance(node, SourceNode):
        return dataclasses.replace(node, shuffle_seed=derive_key(seed, *path), given_seed=seed)
    children = tuple(_shuffle_node(c, seed, path + (i,)) for i, c in enumerate(node.children))
    return dataclasses.replace(
        node, children=children, order_seed=derive_key(seed, *path, -1), given_seed=seed
    )


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
    def mix(
        datasets: Sequence[Dataset],
        weights: Sequence[float] | Mapping[int, Sequence[float]],
        unit: str = "records",
    ) -> Dataset:
        """Mixes datasets with exact long-run proportions ``weights`` (normalized).

        ``unit="records"`` (default): the weights are shares of records;
        ``unit="tokens"``: shares of tokens, a record counting
        ``len(record["tokens"])`` after its component's own transforms.
        ``weights`` may be a stage schedule ``{start_step: [w, ...], ...}`` (first
        key 0; zero weights allowed in a stage with a positive sum): the draws a
        lane makes while producing global step ``t`` use the stage holding ``t``.
        Every lane receives each component in proportion (see
        :mod:`zephon_jax.sampler.scheduled_mixture` for the bound). Operators
        (``split``, ``pack``, ...) must come after the mixture, not inside its
        components; a mixture by tokens or with stages must be the outermost one.
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
            if _has_scheduled_mixture(ds._sampler):
                raise PipelineError(
                    f"Dataset.mix input {i} is itself a mixture by tokens or with weight stages; "
                    "such a mixture must be the outermost one: mix its components directly in it"
                )
        if unit not in UNITS:
            raise PipelineError(f"Dataset.mix(unit={unit!r}) is unknown; use one of {UNITS}")
        if unit == "records" and not isinstance(weights, Mapping):
            normalized = normalize_weights(weights)
            if len(normalized) != len(datasets):
                raise PipelineError(
                    f"Dataset.mix got {len(datasets)} datasets but {len(normalized)} weights; "
                    "give one weight per dataset"
                )
            key = derive_key(len(datasets), *[round(w * 2**32) for w in normalized])
            return Dataset(
                MixtureNode(tuple(ds._sampler for ds in datasets), normalized, node_key=key)
            )
        if not datasets:
            raise PipelineError("Dataset.mix needs at least one dataset and one weight")
        stages = parse_weight_stages(weights, len(datasets))
        key = derive_key(
            len(datasets),
            UNITS.index(unit),
            *[x for s, ws in zip(stages.starts, stages.values) for x in (s, *quantize(ws))],
        )
        children = tuple(ds._sampler for ds in datasets)
        return Dataset(ScheduledMixtureNode(children, stages, unit, node_key=key))

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

    # ----- text and training fields ---------------------------------------------------
    def tokenize(
        self,
        tokenizer: Any,
        *,
        field: str = "text",
        bos_id: int | None = None,
        eos_id: int | None = None,
    ) -> Dataset:
        """Turns each record into ``{"tokens": int32 array}`` (other fields are dropped).

        ``tokenizer``: a callable ``str -> Sequence[int]``, a ``tokenizers.Tokenizer``,
        a ``transformers`` tokenizer, a ``tiktoken.Encoding`` or a
        ``sentencepiece.SentencePieceProcessor``. It adds no special tokens;
        ``bos_id``/``eos_id`` are prepended/appended when given. Blocks of records
        are encoded in one call where the tokenizer batches. The tokenizer's
        identity is part of the pipeline fingerprint.
        """
        return self._add_transform(TokenizeTransform(tokenizer, field, bos_id, eos_id))

    def tokenize_chat(self, tokenizer: Any, *, field: str = "messages") -> Dataset:
        """Turns each conversation into ``{"tokens", "loss_mask"}`` (int32).

        ``loss_mask`` is 1 exactly on the tokens the assistant generates: from the
        chat template's ``{% generation %}`` markers as ``transformers`` defines
        them, or, without markers, by the prefix-difference method (see
        :mod:`zephon_jax.transforms.tokenize_chat`). ``tokenizer`` is a fast
        ``transformers`` tokenizer with a chat template.
        """
        return self._add_transform(TokenizeChatTransform(tokenizer, field))

    def to_training(
        self, pad_id: int = 0, *, field_names: str = "default", convention: str = "default"
    ) -> Dataset:
        """Packed rows -> ``inputs``, ``targets``, ``loss_mask``, ``segment_ids``, ``positions``.

        ``targets[t]`` is ``tokens[t+1]`` when ``t+1`` is in the same non-padding
        segment, else ``pad_id``; ``loss_mask[t]`` is 1 exactly then and, if rows
        carry a ``loss_mask``, when ``loss_mask[t+1]`` is 1. All int32 except
        ``loss_mask`` (float32). ``field_names="maxtext"`` gives ``inputs``,
        ``inputs_segmentation``, ``inputs_position``, ``targets``,
        ``targets_segmentation`` (0 where no loss), ``targets_position``.
        ``convention="maxtext"`` computes targets and mask as MaxText's
        ``ShiftData`` does (across segment boundaries; a target equal to
        ``pad_id`` is not trained on; 0 where the next position is padding);
        see docs/training_batches.md. Goes anywhere after ``pack`` (e.g. after
        a ``window_shuffle`` of packed rows).
        """
        transform = ToTrainingTransform(pad_id, field_names, convention)
        if not any(s.operator.may_pack for s in self._stages):
            before = " -> ".join(s.operator.describe() for s in self._stages) or "no operator"
            raise PipelineError(
                f"to_training needs packed rows, but the pipeline has {before} before it; add "
                ".pack(seq_len) before .to_training()"
            )
        return self._add_transform(transform)

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

        ``method``: ``"best_fit"`` (default: the fullest open row with room) or
        ``"first_fit"`` (the first with room, in the order the rows opened) over
        ``num_bins`` open rows per lane (default 32), or ``"concat"`` (concat-then-split, no
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
    def batch(
        self, global_batch_size: int | Mapping[int, int], num_lanes: int | None = None
    ) -> BatchedDataset:
        """Groups rows into global batches of ``global_batch_size`` rows.

        The pipeline runs in ``num_lanes`` independent lanes (default: the global
        batch size); lane ``l`` owns rows ``[l*R, (l+1)*R)`` of every global batch,
        ``R = global_batch_size // num_lanes``. Neither depends on the topology.

        ``global_batch_size`` may be a ramp-up schedule ``{start_step: size, ...}``
        (first key 0): global step ``t`` has the size of the stage holding ``t``,
        every size is a multiple of ``num_lanes`` (default: the smallest size) and
        each lane produces ``size_t // num_lanes`` rows at step ``t``.
        """
        return BatchedDataset(self, global_batch_size, num_lanes)

    def __repr__(self) -> str:
        ops = " -> ".join(s.operator.describe() for s in self._stages)
        return f"Dataset({self._sampler.describe()}{' -> ' + ops if ops else ''})"


def _check_size(size: Any, what: str) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise PipelineError(f"batch(global_batch_size) needs a positive int ({what}); got {size!r}")
    return size


class BatchedDataset:
    """A dataset cut into global batches by a fixed number of lanes.

    ``global_batch_size`` is the int (or the ramp-up schedule) it was built
    with; :meth:`batch_size_at` gives the size of a step, ``batch_sizes`` every
    size a step may have.
    """

    def __init__(
        self,
        dataset: Dataset,
        global_batch_size: int | Mapping[int, int],
        num_lanes: int | None = None,
    ):
        if isinstance(global_batch_size, Mapping):
            schedule = StepSchedule.parse(
                global_batch_size, "batch(global_batch_size)", _check_size
            )
        else:
            _check_size(global_batch_size, "the size of every step")
            schedule = StepSchedule((0,), (global_batch_size,))
        num_lanes = positive_int(num_lanes, "batch(num_lanes)", allow_none=True)
        if num_lanes is None:
            num_lanes = min(schedule.values)
        for start, size in zip(schedule.starts, schedule.values):
            if size % num_lanes:
                at = "" if schedule.is_constant else f" (the size from step {start})"
                raise PipelineError(
                    f"global_batch_size={size}{at} is not a multiple of num_lanes={num_lanes}; "
                    "every lane must own the same number of rows: choose num_lanes dividing "
                    "every batch size (the default, num_lanes=None, uses one lane per row of "
                    "the smallest batch)"
                )
        self.dataset = dataset
        self.batch_schedule = schedule
        self.global_batch_size = (
            schedule.values[0]
            if schedule.is_constant
            else dict(zip(schedule.starts, schedule.values))
        )
        self.num_lanes = num_lanes

    @property
    def is_ramp(self) -> bool:
        """True if the batch size changes with the step (a ramp-up schedule)."""
        return not self.batch_schedule.is_constant

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Every global batch size a step may have, sorted, without repeats."""
        return tuple(sorted(set(self.batch_schedule.values)))

    def batch_size_at(self, step: int) -> int:
        """The global batch size of global step ``step`` (0-based)."""
        return self.batch_schedule.at(step)

    def rows_per_lane_at(self, step: int) -> int:
        """The rows each lane produces at global step ``step``."""
        return self.batch_schedule.at(step) // self.num_lanes

    @property
    def rows_per_lane(self) -> int:
        """Rows per lane of every step; a ramp-up has no single one (use ``rows_per_lane_at``)."""
        if self.is_ramp:
            raise PipelineError(
                "this pipeline ramps its batch size up, so rows per lane change with the step: "
                "use rows_per_lane_at(step)"
            )
        return self.batch_schedule.values[0] // self.num_lanes

    @property
    def sampler(self):
        return self.dataset._sampler

    @property
    def is_finite(self) -> bool:
        """True if the input can end: every source a mixture draws from is read a
        finite number of epochs (see ``repeat``)."""

        return can_end(self.sampler)

    @property
    def stages(self) -> tuple[Stage, ...]:
        return self.dataset._stages

    def fingerprint(self) -> dict[str, str]:
        """The fields a state must match to be restored into this pipeline."""

        return fingerprint(self)

    def __repr__(self) -> str:
        return (
            f"{self.dataset!r}.batch(global_batch_size={self.global_batch_size!r}, "
            f"num_lanes={self.num_lanes})"
        )
