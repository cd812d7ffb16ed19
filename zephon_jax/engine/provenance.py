"""Provenance: which records, and which slices of them, make every row of a batch.

Every row is a pure function of the pipeline, and a lane already keeps the
lineage (record pointers) of each element it produces. Provenance walks a row's
lineage down through the operators to the sampler positions it comes from and
resolves those to ``(source, record, epoch)``, without reading any record.

A row's provenance is a list of *segments*, one per document piece in the row,
in segment-id order; each is a dict::

    {"source": 0,          # leaf index in the pipeline's mixture order
     "label": "...",       # the source's readable name
     "record": 1234,       # record index within that source
     "epoch": 0,
     "start": 0, "stop": 512}  # the slice of the record this segment holds

``start``/``stop`` index the record *after its component's own per-record
transforms* (e.g. the tokenized document); ``stop`` is ``None`` when the segment
runs to the end of the record and its length is not recorded (an unpacked,
unsplit row). After ``flat_map`` a segment is an output of the function, not a
slice: ``start`` and ``stop`` are then ``None`` and ``"output"`` gives its index
among the function's outputs. A record made by a user operator that keeps no
pointers has ``source``, ``record`` and ``epoch`` ``None``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from zephon_jax.core.lineage import Opaque, plain_lineage, root_key
from zephon_jax.sampler.resolve import resolve
from zephon_jax.sampler.scheduled_mixture import ScheduledMixtureNode, locate_roots
from zephon_jax.sampler.source import source_label

Segment = dict[str, Any]
Locate = Callable[[Sequence[int]], list[tuple[int, int, int]]]


class _Piece:
    """A slice ``[start, stop)`` of the element with ``lineage`` at some stage."""

    __slots__ = ("lineage", "start", "stop", "output")

    def __init__(self, lineage: Any, start: int | None, stop: int | None, output=None):
        self.lineage = lineage
        self.start = start
        self.stop = stop
        self.output = output


def _through(op: Any, piece: _Piece) -> list[_Piece]:
    """The pieces of ``op``'s inputs that make ``piece`` of one of its outputs."""
    lineage = piece.lineage
    if op.passthrough:  # reordered or delayed, not changed: the same slice
        return [piece]
    if isinstance(lineage, Opaque):
        return [_Piece(lineage, None, None)]
    parents, recipe = lineage  # derived: the operator says which slices of which inputs
    return [
        _Piece(parent, start, stop, piece.output if output is None else output)
        for parent, start, stop, output in op.trace(recipe, parents, piece.start, piece.stop)
    ]


def row_pieces(operators: Sequence[Any], lineage: Any) -> list[_Piece]:
    """The sampler-level pieces (root lineages and slices) of a row, in row order."""
    pieces = [_Piece(lineage, 0, None)]
    for op in reversed(operators):
        pieces = [p for piece in pieces for p in _through(op, piece)]
    return pieces


def lane_provenance(
    plan: Any, lane: int, lineages: Sequence[Any], locate: Locate | None = None
) -> list[list[Segment]]:
    """The segments of rows ``lineages`` of ``lane``: one list per row, in row order.

    ``locate(positions)`` gives (leaf, record, epoch) of sorted lane-local
    positions (default: the sampler, a pure function); nothing is read.
    """
    rows = [row_pieces(plan.operators, plain_lineage(lineage)) for lineage in lineages]
    positions = sorted(
        {
            root_key(p.lineage)
            for pieces in rows
            for p in pieces
            if not isinstance(p.lineage, Opaque)
        }
    )
    located: dict[Any, tuple[int, int, int]] = {}
    if positions:
        if locate is not None:
            found = locate(positions)
        elif isinstance(plan.sampler, ScheduledMixtureNode):
            found = locate_roots(plan.sampler, lane, plan.num_lanes, positions)
        else:
            res = resolve(plan.sampler, lane, np.array(positions, np.int64), plan.num_lanes)
            found = list(zip(res.leaf.tolist(), res.record.tolist(), res.epoch.tolist()))
        located = dict(zip(positions, found))
    labels = plan.leaf_labels
    out = []
    for pieces in rows:
        segments = []
        for p in pieces:
            if isinstance(p.lineage, Opaque):
                segment: dict[str, Any] = {
                    "source": None,
                    "label": None,
                    "record": None,
                    "epoch": None,
                }
            else:
                leaf, record, epoch = located[root_key(p.lineage)]
                segment = {"source": leaf, "label": labels[leaf], "record": record, "epoch": epoch}
            segment["start"], segment["stop"] = p.start, p.stop
            if p.output is not None:
                segment["output"] = p.output
            segments.append(segment)
        out.append(segments)
    return out


def leaf_labels(leaves: Sequence[Any]) -> list[str]:
    """Readable names of the sampler's leaves: the name given to ``Dataset.source`` or a label."""
    return [leaf.name if leaf.name is not None else source_label(leaf.source) for leaf in leaves]


def rows_provenance(
    plan: Any, picks: Sequence[tuple[int, Any]], lanes: Mapping[int, Any] | None = None
) -> list[list[Segment]]:
    """Provenance of rows given as ``(lane, lineage)`` pairs, in that order.

    ``lanes`` (lane id -> :class:`~zephon_jax.engine.lane.Lane`), when given, locate
    the positions they read recently without resolving them again.
    """
    by_lane: dict[int, list[int]] = {}
    for i, (lane, _) in enumerate(picks):
        by_lane.setdefault(lane, []).append(i)
    out: list[list[Segment]] = [[] for _ in picks]
    for lane, where in by_lane.items():
        locate = lanes[lane].locate if lanes is not None and lane in lanes else None
        lineages = [picks[i][1] for i in where]
        for i, segments in zip(where, lane_provenance(plan, lane, lineages, locate)):
            out[i] = segments
    return out
