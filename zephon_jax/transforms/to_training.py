"""``to_training``: a packed row becomes inputs, shifted targets and a loss mask.

For a packed row of length ``L`` (``tokens``, ``tokens_segment_ids``,
``tokens_positions`` and, optionally, ``loss_mask``, as ``pack`` makes them),
with ``next(t)`` true when position ``t + 1 < L`` lies in the same non-padding
segment as ``t``:

* ``inputs[t] = tokens[t]``;
* ``targets[t] = tokens[t + 1]`` if ``next(t)``, else ``pad_id``;
* ``loss_mask[t] = 1`` exactly when ``next(t)`` and, if the row has a
  ``loss_mask``, ``loss_mask[t + 1] == 1``;
* ``segment_ids`` and ``positions`` are the packed ones.

All outputs are int32 except ``loss_mask``, which is float32 (0.0 or 1.0), so
that ``(loss * loss_mask).sum() / loss_mask.sum()`` needs no cast.
``field_names="maxtext"`` gives MaxText's names instead (all int32, the loss
mask folded into ``targets_segmentation``).

``convention="maxtext"`` computes targets and loss mask as MaxText's Grain
pipeline does after packing (its ``ShiftData`` over a row whose targets hold
``pad_id`` on masked prompt tokens and 0 on padding): with ``y[t]`` equal to
``tokens[t]`` on a trained token, ``pad_id`` on a masked one (``loss_mask``
0) and 0 on padding,

* ``targets[t] = y[t + 1]``, and ``pad_id`` at the last position;
* the loss weight ``targets_segmentation[t]`` is ``segment_ids[t + 1]`` (0 at
  the last position), set to 0 wherever ``targets[t] == pad_id``; the
  ``loss_mask`` of the default names is ``targets_segmentation != 0``.

So the last token of a segment predicts the first token of the next one, and
a target equal to ``pad_id`` is never trained on, also inside a document.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from zephon_jax.errors import PipelineError

FIELD_NAMES = ("default", "maxtext")
CONVENTIONS = ("default", "maxtext")
PACKED_FIELDS = ("tokens", "tokens_segment_ids", "tokens_positions")


def _packed(row: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """The packed arrays of a row, validated; raises if the row is not packed."""
    missing = [f for f in PACKED_FIELDS if not (isinstance(row, Mapping) and f in row)]
    if missing:
        have = f"fields {sorted(row)}" if isinstance(row, Mapping) else type(row).__name__
        raise PipelineError(
            f"to_training needs packed rows (fields {list(PACKED_FIELDS)}, as pack(...) makes "
            f"them); got {have}, without {missing}. Add .pack(seq_len) before .to_training()"
        )
    arrays = [np.asarray(row[f]) for f in PACKED_FIELDS]
    mask = row.get("loss_mask")
    if mask is not None:
        arrays.append(np.asarray(mask))
    length = len(arrays[0])
    for name, arr in zip(PACKED_FIELDS + ("loss_mask",), arrays):
        if arr.ndim != 1 or len(arr) != length:
            raise PipelineError(
                f"to_training needs 1-D fields of one length; {name!r} has shape {arr.shape}, "
                f"'tokens' {arrays[0].shape}"
            )
    tokens, segment_ids, positions = arrays[:3]
    return tokens, segment_ids, positions, (arrays[3] if mask is not None else None)


def training_arrays(row: Any, pad_id: int) -> dict[str, np.ndarray]:
    """``inputs``, ``targets``, ``loss_mask``, ``segment_ids``, ``positions`` of a packed row."""
    return shifted(*_packed(row), pad_id)


# Gives a new array for an output field, ``(name, shape, dtype) -> array`` (contents
# arbitrary); nothing else may use the array.
Allocate = Callable[[str, tuple[int, ...], Any], np.ndarray]


def fresh(name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A new array for output ``name`` (contents arbitrary): :func:`shifted`'s default
    ``empty``; a batch's assembly passes its output pool's instead."""
    return np.empty(shape, dtype)


def shifted(
    tokens: np.ndarray,
    segment_ids: np.ndarray,
    positions: np.ndarray,
    mask: np.ndarray | None,
    pad_id: int,
    empty: Allocate = fresh,
) -> dict[str, np.ndarray]:
    """:func:`training_arrays` of packed arrays: one row (1-D) or a batch of rows (2-D,
    row by row along the last axis, the same values as row by row). The new arrays
    come from ``empty(name, shape, dtype)``, which must give arrays nothing else
    uses (see :class:`~zephon_jax.core.packed.OutputPool`)."""
    segment_ids = segment_ids.astype(np.int32, copy=False)
    shape = tokens.shape
    inputs = empty("inputs", shape, np.int32)
    np.copyto(inputs, tokens, casting="unsafe")  # as tokens.astype(np.int32)
    # has_next[t]: position t + 1 lies in t's segment, which is not padding.
    has_next = empty("has_next", shape, np.bool_)
    has_next[..., -1:] = False
    np.equal(segment_ids[..., 1:], segment_ids[..., :-1], out=has_next[..., :-1])
    has_next[..., :-1] &= segment_ids[..., :-1] != 0
    targets = empty("targets", shape, np.int32)
    targets.fill(pad_id)
    np.copyto(targets[..., :-1], inputs[..., 1:], where=has_next[..., :-1])
    if mask is not None:
        has_next[..., :-1] &= mask[..., 1:] == 1
    loss_mask = empty("loss_mask", shape, np.float32)
    np.copyto(loss_mask, has_next)
    return {
        "inputs": inputs,
        "targets": targets,
        "loss_mask": loss_mask,
        "segment_ids": segment_ids,
        "positions": positions.astype(np.int32, copy=False),
    }


def maxtext_arrays(row: Any, pad_id: int) -> dict[str, np.ndarray]:
    """``inputs``, ``targets``, ``targets_segmentation``, ``segment_ids``, ``positions``
    of a packed row under MaxText's convention (see the module docstring)."""
    return maxtext_shifted(*_packed(row), pad_id)


def maxtext_shifted(
    tokens: np.ndarray,
    segment_ids: np.ndarray,
    positions: np.ndarray,
    mask: np.ndarray | None,
    pad_id: int,
) -> dict[str, np.ndarray]:
    """:func:`maxtext_arrays` of packed arrays: one row (1-D) or a batch of rows (2-D)."""
    segment_ids = segment_ids.astype(np.int32, copy=False)
    inputs = tokens.astype(np.int32)
    trained = segment_ids != 0 if mask is None else (segment_ids != 0) & (mask == 1)
    unshifted = np.where(trained, inputs, np.int32(pad_id))
    unshifted[segment_ids == 0] = 0
    targets = np.full(tokens.shape, pad_id, np.int32)
    targets[..., :-1] = unshifted[..., 1:]
    weights = np.zeros(tokens.shape, np.int32)
    weights[..., :-1] = segment_ids[..., 1:]
    weights[targets == pad_id] = 0
    return {
        "inputs": inputs,
        "targets": targets,
        "targets_segmentation": weights,
        "segment_ids": segment_ids,
        "positions": positions.astype(np.int32, copy=False),
    }


class ToTrainingTransform:
    """A packed row -> training fields (see the module docstring). Pure, per row."""

    def __init__(self, pad_id: int = 0, field_names: str = "default", convention: str = "default"):
        if isinstance(pad_id, bool) or not isinstance(pad_id, (int, np.integer)):
            raise PipelineError(f"to_training(pad_id=...) needs an int token id; got {pad_id!r}")
        if not np.iinfo(np.int32).min <= pad_id <= np.iinfo(np.int32).max:
            raise PipelineError(f"to_training(pad_id={pad_id}) does not fit int32")
        if field_names not in FIELD_NAMES:
            raise PipelineError(
                f"to_training(field_names={field_names!r}) is unknown; use one of {FIELD_NAMES}"
            )
        if convention not in CONVENTIONS:
            raise PipelineError(
                f"to_training(convention={convention!r}) is unknown; use one of {CONVENTIONS}"
            )
        self.pad_id = int(pad_id)
        self.field_names = field_names
        self.convention = convention
        self.name = self.describe()

    def apply(self, row: Any, rng_key: tuple) -> dict[str, np.ndarray]:
        return self._fields(*_packed(row))

    def apply_batch(
        self,
        packed: Mapping[str, np.ndarray],
        empty: Allocate = fresh,
    ) -> dict[str, np.ndarray]:
        """The training fields of a batch of packed rows (``tokens``,
        ``tokens_segment_ids``, ``tokens_positions``, and ``loss_mask`` if rows carry
        one, each ``(rows, seq_len)``): the same arrays, byte for byte, as :meth:`apply`
        of each row stacked (new arrays of the default convention from ``empty``, see
        :func:`shifted`)."""
        tokens, segment_ids, positions = (packed[f] for f in PACKED_FIELDS)
        return self._fields(tokens, segment_ids, positions, packed.get("loss_mask"), empty)

    def fused_pad(self, dtype: Any) -> int | None:
        """The pad id where a compiled gather of packed rows of tokens of ``dtype`` can
        make this transform's fields at once (the default convention, tokens that int32
        always holds), else None: the gathered rows are then shifted by
        :meth:`apply_batch`."""
        if self.convention != "default" or not np.can_cast(dtype, np.int32, "safe"):
            return None
        return self.pad_id

    def named_batch(self, out: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The output fields of a batch of :func:`shifted`'s fields (``out``), made by a
        gather that fused this transform (see :meth:`fused_pad`)."""
        return self._named(out, out["loss_mask"])

    def output_names(self) -> tuple[str, ...]:
        """The fields of the rows it gives, in order."""
        if self.field_names == "default":
            return ("inputs", "targets", "loss_mask", "segment_ids", "positions")
        return (
            "inputs",
            "inputs_segmentation",
            "inputs_position",
            "targets",
            "targets_segmentation",
            "targets_position",
        )

    def _fields(
        self,
        tokens: np.ndarray,
        segment_ids: np.ndarray,
        positions: np.ndarray,
        mask: np.ndarray | None,
        empty: Allocate = fresh,
    ) -> dict[str, np.ndarray]:
        """The output fields of packed arrays (one row, or rows along the last axis)."""
        maxtext = self.convention == "maxtext"
        if maxtext:
            out = maxtext_shifted(tokens, segment_ids, positions, mask, self.pad_id)
            loss_mask = (out["targets_segmentation"] != 0).astype(np.float32)
        else:
            out = shifted(tokens, segment_ids, positions, mask, self.pad_id, empty)
            loss_mask = out["loss_mask"]
        return self._named(out, loss_mask)

    def _named(self, out: Mapping[str, np.ndarray], loss_mask: np.ndarray) -> dict[str, np.ndarray]:
        """The output fields under this transform's names, from the convention's fields
        ``out`` and the loss mask."""
        maxtext = self.convention == "maxtext"
        if self.field_names == "default":
            return {
                "inputs": out["inputs"],
                "targets": out["targets"],
                "loss_mask": loss_mask,
                "segment_ids": out["segment_ids"],
                "positions": out["positions"],
            }
        if maxtext:
            weights = out["targets_segmentation"]
        else:  # the default convention's loss weights, only for MaxText's names
            weights = np.where(loss_mask > 0, out["segment_ids"], 0).astype(np.int32)
        return {
            "inputs": out["inputs"],
            "inputs_segmentation": out["segment_ids"],
            "inputs_position": out["positions"],
            "targets": out["targets"],
            "targets_segmentation": weights,
            "targets_position": out["positions"].copy(),
        }

    def describe(self) -> str:
        """The transform's identity in the pipeline fingerprint; the convention is named
        only when it is not the default, so older fingerprints stay valid."""
        convention = f", convention={self.convention!r}" if self.convention != "default" else ""
        return f"to_training(pad_id={self.pad_id}, field_names={self.field_names!r}{convention})"
