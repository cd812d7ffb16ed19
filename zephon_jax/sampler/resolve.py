"""Resolves lane-local positions to (leaf, record, epoch) through the sampler tree."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from zephon_jax.sampler.mixture import MixtureNode
from zephon_jax.sampler.source import SourceNode


@dataclasses.dataclass
class Resolution:
    """Where each lane-local position reads from; ``valid`` is False past the last epoch."""

    leaf: np.ndarray
    record: np.ndarray
    epoch: np.ndarray
    valid: np.ndarray


def leaves(node) -> list[SourceNode]:
    """The sampler's leaves in a fixed depth-first order (their ids)."""
    if isinstance(node, SourceNode):
        return [node]
    return [leaf for child in node.children for leaf in leaves(child)]


def leaf_paths(node) -> list[tuple]:
    """For each leaf, the transforms applied to its records: leaf first, root last."""
    if isinstance(node, SourceNode):
        return [tuple(node.transforms)]
    return [path + tuple(node.transforms) for c in node.children for path in leaf_paths(c)]


def unresolved(shape: tuple) -> Resolution:
    """A :class:`Resolution` of zeros (nothing valid) of ``shape``, to fill."""
    return Resolution(
        leaf=np.zeros(shape, np.int64),
        record=np.zeros(shape, np.int64),
        epoch=np.zeros(shape, np.int64),
        valid=np.zeros(shape, bool),
    )


def resolve(node, lane: int, positions: np.ndarray, num_lanes: int) -> Resolution:
    """Pure map from lane-local positions of ``lane`` to records; no topology input."""
    positions = np.asarray(positions, dtype=np.int64)
    out = unresolved(positions.shape)
    _resolve(node, lane, positions, num_lanes, np.arange(positions.size), 0, out)
    return out


def resolve_lanes(
    node, lanes: Sequence[int], positions: Sequence[np.ndarray], num_lanes: int
) -> list[Resolution]:
    """:func:`resolve` of ``positions[i]`` of lane ``lanes[i]``, for each ``i`` (see
    :func:`resolve_flat`)."""
    sizes = [len(p) for p in positions]
    if not isinstance(node, SourceNode) or len(lanes) < 2:
        return [resolve(node, lane, p, num_lanes) for lane, p in zip(lanes, positions)]
    flat = resolve_flat(node, lanes, positions, num_lanes)
    out = []
    for start, stop in zip(np.cumsum([0] + sizes[:-1]).tolist(), np.cumsum(sizes).tolist()):
        out.append(
            Resolution(
                leaf=flat.leaf[start:stop],
                record=flat.record[start:stop],
                epoch=flat.epoch[start:stop],
                valid=flat.valid[start:stop],
            )
        )
    return out


def resolve_flat(
    node, lanes: Sequence[int], positions: Sequence[np.ndarray], num_lanes: int
) -> Resolution:
    """:func:`resolve` of ``positions[i]`` of lane ``lanes[i]`` for all ``i``, one after
    the other in one :class:`Resolution`.

    A single source is resolved for all lanes in one vectorized pass (its records
    are a pure function of ``draw * num_lanes + lane``); a mixture lane by lane.
    """
    if not isinstance(node, SourceNode):
        parts = [resolve(node, lane, p, num_lanes) for lane, p in zip(lanes, positions)]
        return Resolution(
            *(
                np.concatenate([getattr(r, f.name) for r in parts])
                for f in dataclasses.fields(Resolution)
            )
        )
    flat = np.concatenate([np.asarray(p, dtype=np.int64) for p in positions])
    lane_of = np.repeat(np.asarray(lanes, dtype=np.int64), [len(p) for p in positions])
    return resolve_each(node, lane_of, flat, num_lanes)


def resolve_each(node, lane_of: np.ndarray, positions: np.ndarray, num_lanes: int) -> Resolution:
    """:func:`resolve` of ``positions[i]`` of lane ``lane_of[i]`` for each ``i`` (int64
    arrays of one length, in any order), in one :class:`Resolution`: a single source in
    one vectorized pass, any other node a lane at a time."""
    if isinstance(node, SourceNode):
        records, epochs, valid = node.locate(lane_of, positions, num_lanes)
        return Resolution(np.zeros(len(positions), np.int64), records, epochs, valid)
    out = unresolved(positions.shape)
    for lane in np.unique(lane_of).tolist():
        at = np.flatnonzero(lane_of == lane)
        res = resolve(node, lane, positions[at], num_lanes)
        for field in dataclasses.fields(Resolution):
            getattr(out, field.name)[at] = getattr(res, field.name)
    return out


def _resolve(node, lane, draws, num_lanes, where, leaf_base, out) -> int:
    if isinstance(node, SourceNode):
        records, epochs, valid = node.locate(lane, draws, num_lanes)
        out.leaf[where] = leaf_base
        out.record[where] = records
        out.epoch[where] = epochs
        out.valid[where] = valid
        return leaf_base + 1
    assert isinstance(node, MixtureNode)
    base = leaf_base
    for child, (mask, child_draws) in zip(node.children, node.split(lane, draws)):
        base = _resolve(child, lane, child_draws, num_lanes, where[mask], base, out)
    return base


def can_end(node) -> bool:
    """Whether the sampler's input ends: a source read for finitely many epochs, or a
    mixture all of whose components end (one that never ends keeps it going)."""
    if isinstance(node, SourceNode):
        return node.num_epochs is not None
    if not isinstance(node, MixtureNode):  # a scheduled mixture finds its end as it draws:
        return any(leaf.num_epochs is not None for leaf in leaves(node))  # assume it can
    return all(can_end(child) for child in node.children)


def end_position(node, lane: int, num_lanes: int) -> int | None:
    """The first lane-local position from which no position is valid (None: never).

    Positions before it that are not valid (their source is past its epochs while
    another is not) are skipped; so every record of a finite source is read
    exactly ``num_epochs`` times across the lanes.
    """
    if isinstance(node, SourceNode):
        return node.draws_available(lane, num_lanes)
    return node.draws_available(
        lane, [end_position(child, lane, num_lanes) for child in node.children]
    )
