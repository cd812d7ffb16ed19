"""Batch assembly: where each worker's rows go in the batch, and putting them there.

Each worker makes the rows of its lanes (:class:`Plan`); the loader copies each worker's
stacked rows into their places in one array per field (:func:`assemble`), taken from an
:class:`~zephon_jax.core.packed.OutputPool`, so that the batch is the one an in-process
run makes.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from zephon_jax.core.packed import OutputPool
from zephon_jax.errors import PipelineError


class Plan(NamedTuple):
    """One worker's share: its lanes and, per batch size, its rows in request order and
    their places in the batch (a slice or an index array)."""

    lanes: list[int]
    rows: dict[int, list[int]]
    places: dict[int, Any]


def as_index(places: list[int]):
    """A slice when the places are contiguous (cheap assignment), else an index array."""
    if places and places == list(range(places[0], places[-1] + 1)):
        return slice(places[0], places[-1] + 1)
    return np.asarray(places, dtype=np.int64)


def plan_workers(
    rows_of_size: dict[int, list[int]], num_lanes: int, blocks: Sequence[list[int]]
) -> list[Plan]:
    """Per block of lanes (one per worker), its :class:`Plan` for the global rows
    ``rows_of_size`` (per batch size, in request order) of ``num_lanes`` lanes."""
    plans = []
    for lanes in blocks:
        owned = set(lanes)
        rows_of, places_of = {}, {}
        for size, size_rows in rows_of_size.items():
            per_lane = size // num_lanes
            places = [i for i, r in enumerate(size_rows) if r // per_lane in owned]
            rows_of[size] = [size_rows[i] for i in places]
            places_of[size] = as_index(places)
        plans.append(Plan(lanes, rows_of, places_of))
    return plans


def assemble(parts: list[dict], places: list, count: int, pool: OutputPool) -> Any:
    """The batch of ``count`` rows in request order, from each worker's stacked rows
    (``parts``: per worker with rows, ``{field: array}``; ``places``: where they go).

    Raises :class:`PipelineError` if the workers' rows have different fields.
    """
    keys = [tuple(p) for p in parts]
    if any(k != keys[0] for k in keys):
        raise PipelineError(
            f"rows of one batch have different fields: {list(keys[0])} and "
            f"{list(next(k for k in keys if k != keys[0]))}; make every record carry "
            "the same fields (e.g. with a map)"
        )
    out = {key: gather(key, [p[key] for p in parts], places, count, pool) for key in keys[0]}
    return out[None] if None in out else out


def gather(key, values: list[np.ndarray], places: list, count: int, pool: OutputPool) -> np.ndarray:
    """Field ``key`` of the batch: ``values[i]`` put at ``places[i]`` (into a pooled array
    when the rows have one shape and no objects, else as ``np.stack`` would make it).

    Raises :class:`PipelineError` if the rows' shapes differ and cannot be joined.
    """
    shapes = {v.shape[1:] for v in values}
    if len(shapes) == 1 and not any(v.dtype.hasobject for v in values):
        dtype = np.result_type(*values) if len(values) > 1 else values[0].dtype
        out = pool.empty(str(key), (count, *values[0].shape[1:]), dtype)
        for value, where in zip(values, places):
            out[where] = value
        return out
    try:  # what np.stack would do with these rows
        joined = np.concatenate(values)
    except ValueError as e:
        raise PipelineError(
            f"cannot batch field {'row' if key is None else key!r}: rows have different "
            f"shapes {sorted(shapes)[:4]}; batching needs equal shapes: add .pack(seq_len) "
            "for token sequences, or a map that pads or crops to a fixed length"
        ) from e
    order = np.empty(count, dtype=np.int64)
    order[np.concatenate([np.arange(count)[w] for w in places])] = np.arange(count)
    return joined[order]
