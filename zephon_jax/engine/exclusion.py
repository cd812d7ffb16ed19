"""Excluding documents: records a state names are dropped from its step on.

A state may carry an exclusion list (see :func:`zephon_jax.exclude`): ``(label,
record)`` pairs as :meth:`~zephon_jax.LoaderIterator.provenance` reports them (the
label, or the source's leaf index). A restored lane then

* drops every excluded record it reads from the sampler, before any transform or
  operator (like a filter: the lane reads on to fill its rows);
* rebuilds what it holds without them (see :func:`~zephon_jax.engine.restore.restore_lanes`):
  an element in flight (held in an operator's carry, or a finished row not yet
  batched) that contains an excluded record is taken apart into the inputs it was
  made of, the excluded ones are dropped, and the others go through the operators
  again, in the order the state holds them; an operator that held such an element
  starts from an empty carry and takes its other held elements again. An operator
  that cuts a stream into rows (one with ``recut``: ``pack(method='concat')``)
  takes back the pieces of its taken-apart outputs instead, then those of its open
  row, in stream order (as the last operator, with every unbatched row after the
  first one taken apart), so the stream is the uninterrupted one without the
  excluded records, cut again.

Both are pure functions of the pipeline, the lane's state and the exclusion list,
so the batches after an exclusion are the same on any topology and worker count.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from zephon_jax.core.lineage import Element, is_opaque, plain_lineage
from zephon_jax.engine.provenance import row_pieces
from zephon_jax.errors import StateError
from zephon_jax.transforms import DROP

Excluded = dict[int, frozenset]  # leaf -> records


def excluded_records(labels: Sequence[str], pairs: Sequence[tuple]) -> Excluded:
    """The excluded records per leaf of a pipeline whose leaves have ``labels``, from a
    state's exclusion list (a StateError names a label the pipeline lacks)."""
    out: dict[int, set] = {}
    for label, record in pairs:
        if isinstance(label, int):
            if not 0 <= label < len(labels):
                raise StateError(
                    f"the state excludes record {record} of source {label}, but this pipeline "
                    f"has {len(labels)} sources; the exclusion belongs to another pipeline"
                )
            leaf = label
        else:
            found = [i for i, name in enumerate(labels) if name == label]
            if len(found) != 1:
                raise StateError(
                    f"the state excludes record {record} of source {label!r}, which "
                    f"{'names several' if found else 'names none'} of this pipeline's sources "
                    f"{labels}; exclude by the source's index (provenance's 'source') instead"
                )
            leaf = found[0]
        out.setdefault(leaf, set()).add(int(record))
    return {leaf: frozenset(records) for leaf, records in out.items()}


def excluded_keys(excluded: Excluded) -> np.ndarray:
    """The excluded records as sorted ``leaf << 40 | record`` keys, as the draw kernel
    looks them up (:func:`~zephon_jax.core.compiled_kernels.draw_place`)."""
    keys = [(leaf << 40) | record for leaf, found in excluded.items() for record in found]
    return np.array(sorted(keys), np.int64)


def is_excluded(excluded: Excluded, leaf: int, record: int) -> bool:
    found = excluded.get(leaf)
    return found is not None and record in found


def drop_excluded(lane: Any, items: list) -> list:
    """``items`` read from the sampler (elements at lane-local positions, or markers)
    with the excluded records replaced by ``DROP``."""
    excluded = lane.plan.excluded
    where = [i for i, item in enumerate(items) if type(item) is Element]
    if not where:
        return items
    located = lane.locate([items[i].lineage for i in where])
    out = list(items)
    for i, (leaf, record, _) in zip(where, located):
        if is_excluded(excluded, leaf, record):
            out[i] = DROP
    return out


def excluded_columns(
    excluded: Excluded, positions: np.ndarray, leaves: np.ndarray, records: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A column-wise lane's documents without the excluded ones."""
    keep = np.ones(len(records), bool)
    for leaf, found in excluded.items():
        at = leaves == leaf
        if at.any():
            keep[at] = ~np.isin(records[at], np.fromiter(found, np.int64, len(found)))
    return positions[keep], leaves[keep], records[keep]


def holds_excluded(lane: Any, stage: int, lineage: Any) -> bool:
    """Whether the element with ``lineage`` entering ``stage`` of ``lane`` contains an
    excluded record."""
    pieces = row_pieces(lane.plan.operators[:stage], plain_lineage(lineage))
    roots = [p.lineage for p in pieces if not is_opaque(p.lineage)]
    if not roots:
        return False
    excluded = lane.plan.excluded
    return any(is_excluded(excluded, leaf, record) for leaf, record, _ in lane.locate(roots))
