"""Batch assembly: each worker's rows and their places in the batch, and the batch put
together from the workers' stacked rows in request order."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_jax.core.packed import OutputPool
from zephon_jax.errors import PipelineError
from zephon_jax.workers.assembly import Plan, as_index, assemble, gather, plan_workers


def test_contiguous_places_are_a_slice_others_an_index_array():
    assert as_index([2, 3, 4]) == slice(2, 5)
    assert as_index([6]) == slice(6, 7)
    scattered = as_index([1, 3, 2])
    assert isinstance(scattered, np.ndarray) and scattered.dtype == np.int64
    assert scattered.tolist() == [1, 3, 2]
    assert as_index([4, 3]).tolist() == [4, 3]  # descending is not a slice
    empty = as_index([])
    assert isinstance(empty, np.ndarray) and empty.tolist() == []


def test_each_worker_gets_the_rows_of_its_lanes_in_request_order():
    # 4 lanes, a batch of 8: lane l owns rows 2l and 2l + 1.
    rows = {8: [7, 0, 5, 2, 1, 6]}
    plans = plan_workers(rows, 4, [[0, 1], [2, 3]])
    assert [p.lanes for p in plans] == [[0, 1], [2, 3]]
    assert plans[0].rows == {8: [0, 2, 1]}
    assert plans[0].places[8].tolist() == [1, 3, 4]
    assert plans[1].rows == {8: [7, 5, 6]}
    assert plans[1].places[8].tolist() == [0, 2, 5]


def test_plans_cover_every_batch_size_and_use_slices_when_they_can():
    rows = {4: [0, 1, 2, 3], 8: list(range(8))}  # a ramp-up: 1 then 2 rows per lane
    plans = plan_workers(rows, 4, [[0], [1, 2, 3]])
    assert plans[0] == Plan([0], {4: [0], 8: [0, 1]}, {4: slice(0, 1), 8: slice(0, 2)})
    assert plans[1] == Plan(
        [1, 2, 3], {4: [1, 2, 3], 8: [2, 3, 4, 5, 6, 7]}, {4: slice(1, 4), 8: slice(2, 8)}
    )


def test_a_worker_without_rows_of_a_size_gets_none():
    plans = plan_workers({4: [3, 2]}, 4, [[0, 1], [2, 3]])
    assert plans[0].rows == {4: []} and plans[0].places[4].tolist() == []
    assert plans[1].rows == {4: [3, 2]} and plans[1].places[4] == slice(0, 2)


def test_assemble_puts_each_workers_rows_in_their_places():
    first = {"x": np.array([[10, 11], [12, 13]], np.int32), "y": np.array([1.5, 2.5])}
    second = {"x": np.array([[20, 21], [22, 23], [24, 25]], np.int32), "y": np.array([3.0, 4, 5])}
    batch = assemble([first, second], [np.array([4, 0]), slice(1, 4)], 5, OutputPool())
    assert list(batch) == ["x", "y"]
    assert batch["x"].dtype == np.int32 and batch["y"].dtype == np.float64
    assert batch["x"].tolist() == [[12, 13], [20, 21], [22, 23], [24, 25], [10, 11]]
    assert batch["y"].tolist() == [2.5, 3.0, 4.0, 5.0, 1.5]


def test_three_workers_one_with_a_single_scattered_row():
    parts = [
        {"x": np.array([10, 11], np.int8)},
        {"x": np.array([20, 21], np.int8)},
        {"x": np.array([30], np.int8)},
    ]
    places = [np.array([3, 0]), slice(1, 3), np.array([4])]
    batch = assemble(parts, places, 5, OutputPool())
    assert batch["x"].dtype == np.int8 and batch["x"].tolist() == [11, 20, 21, 10, 30]


def test_a_batch_of_plain_arrays_is_returned_as_an_array():
    parts = [{None: np.array([0.0, 1.0])}, {None: np.array([2.0])}]
    batch = assemble(parts, [np.array([2, 0]), slice(1, 2)], 3, OutputPool())
    assert isinstance(batch, np.ndarray) and batch.tolist() == [1.0, 2.0, 0.0]


def test_rows_of_different_dtypes_are_promoted_as_stacking_would():
    parts = [{"x": np.array([1], np.int16)}, {"x": np.array([2], np.int64)}]
    batch = assemble(parts, [slice(0, 1), slice(1, 2)], 2, OutputPool())
    assert batch["x"].dtype == np.int64 and batch["x"].tolist() == [1, 2]


def test_arrays_come_from_the_pool():
    pool = OutputPool()
    parts = [{"x": np.array([5, 6], np.int32)}]
    first = assemble(parts, [slice(0, 2)], 2, pool)["x"]
    address = first.ctypes.data
    del first  # only the pool holds it now: the next batch reuses it
    again = assemble([{"x": np.array([7, 8], np.int32)}], [slice(0, 2)], 2, pool)["x"]
    assert again.ctypes.data == address and again.tolist() == [7, 8]


def test_object_fields_are_joined_in_request_order():
    parts = [
        {"label": np.array(["b", "d"], dtype=object)},
        {"label": np.array(["a", "c", "e"], dtype=object)},
    ]
    places = [np.array([1, 3]), np.array([0, 2, 4])]
    batch = assemble(parts, places, 5, OutputPool())
    assert batch["label"].dtype == object
    assert batch["label"].tolist() == ["a", "b", "c", "d", "e"]


def test_gather_of_one_field():
    values = [np.array([[1, 2]]), np.array([[3, 4], [5, 6]])]
    out = gather("t", values, [np.array([1]), np.array([2, 0])], 3, OutputPool())
    assert out.tolist() == [[5, 6], [1, 2], [3, 4]]


def test_different_fields_name_both():
    parts = [{"x": np.zeros(1)}, {"y": np.zeros(1)}]
    with pytest.raises(PipelineError, match=r"different fields: \['x'\] and \['y'\].*map"):
        assemble(parts, [slice(0, 1), slice(1, 2)], 2, OutputPool())


def test_rows_of_different_shapes_name_the_field_and_the_fix():
    parts = [{"tokens": np.zeros((1, 3))}, {"tokens": np.zeros((1, 4))}]
    with pytest.raises(PipelineError, match=r"cannot batch field 'tokens'.*\(3,\), \(4,\).*pack"):
        assemble(parts, [slice(0, 1), slice(1, 2)], 2, OutputPool())
    with pytest.raises(PipelineError, match="cannot batch field 'row'"):
        assemble([{None: np.zeros((1, 2))}, {None: np.zeros((1, 5))}], [[0], [1]], 2, OutputPool())
