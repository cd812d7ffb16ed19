"""Computes chosen rows of every global batch from the lanes that own them."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from zephon_jax.errors import PipelineError
from zephon_jax.lane import Lane, LanePlan
from zephon_jax.state import lane_bytes


def stack_rows(rows: Sequence[Any]) -> Any:
    """Stacks rows (dicts of arrays, or arrays) into a batch with a leading row axis."""
    first = rows[0]
    if isinstance(first, Mapping):
        keys = tuple(first)
        for row in rows:
            if tuple(row) != keys:
                raise PipelineError(
                    f"rows of one batch have different fields: {list(keys)} and {list(row)}; "
                    "make every record carry the same fields (e.g. with a map)"
                )
        return {k: _stack_field(k, [row[k] for row in rows]) for k in keys}
    return _stack_field("row", list(rows))


def _stack_field(name: str, values: list) -> np.ndarray:
    try:
        return np.stack(values)
    except ValueError as e:
        shapes = sorted({np.shape(v) for v in values})
        raise PipelineError(
            f"cannot batch field {name!r}: rows have different shapes {shapes[:4]}; batching "
            "needs equal shapes: add .pack(seq_len) for token sequences, or a map that pads "
            "or crops to a fixed length"
        ) from e


class RowProducer:
    """Produces global rows ``rows`` (any subset, in the given order) of each batch.

    Only the lanes owning those rows run; a lane whose rows are split between
    several producers (processes) runs in each of them, identically.
    """

    def __init__(self, batched, rows: Sequence[int], lanes: Sequence[int] | None = None):
        self.batched = batched
        self.plan = LanePlan(batched)
        self.rows = [int(r) for r in rows]
        per_lane = batched.rows_per_lane
        for r in self.rows:
            if not 0 <= r < batched.global_batch_size:
                raise PipelineError(f"row {r} is outside the global batch of {batched.global_batch_size}")
        needed = sorted({r // per_lane for r in self.rows})
        self.lane_ids = needed if lanes is None else sorted(set(lanes) | set(needed))
        self.lanes = {l: Lane(self.plan, l) for l in self.lane_ids}
        self._picks = [(r // per_lane, r % per_lane) for r in self.rows]

    def next_rows(self) -> list[Any] | None:
        """The data of this producer's rows of the next global batch (None at the end)."""
        per_lane = self.batched.rows_per_lane
        taken = {}
        for l, lane in self.lanes.items():
            elements = lane.take(per_lane)
            if elements is None:
                return None
            taken[l] = elements
        return [taken[l][i].data for l, i in self._picks]

    def next_batch(self) -> Any:
        rows = self.next_rows()
        return None if rows is None else stack_rows(rows)

    def lane_states(self) -> dict[int, bytes]:
        return {l: lane.get_state() for l, lane in self.lanes.items()}

    def restore(self, state: Mapping[str, Any]) -> None:
        blobs = {l: lane_bytes(state, l) for l in self.lane_ids}
        for l, blob in blobs.items():
            self.lanes[l].set_state(blob)
