"""States keep what they store exactly, and a malformed state never half-restores.

* Numpy scalars in a user operator's carry come back with their dtype.
* Every malformed state (wrong types, impossible values behind a valid CRC)
  raises StateError naming the entry, before anything changes: a failed
  ``set_state`` leaves the iterator exactly as it was, also with loader workers
  and device prefetch.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from pipelines import assert_batch_equal, assert_batches_equal, make_docs, take

import zephon_jax as zj
from zephon_jax.state import codec


# ----- numpy scalars round-trip with their dtype ----------------------------------------------
class RunningMean(zj.Operator):
    """Emits each record with the float32 running mean of its first token (carry: scalars)."""

    def init(self):
        return {"total": np.float32(0.0), "count": np.int16(0), "flag": np.bool_(False)}

    def step(self, carry, record):
        total = carry["total"] + np.float32(record["tokens"][0]) / np.float32(3)
        count = carry["count"] + np.int16(1)
        carry = {"total": total, "count": count, "flag": np.bool_(count % 2 == 0)}
        out = {"tokens": record["tokens"][:1], "mean": total / count, "count": count}
        return carry, [{**out, "flag": carry["flag"]}]


def scalar_pipeline() -> zj.BatchedDataset:
    return zj.Dataset.source(make_docs(50, 9, seed=3)).apply(RunningMean()).batch(4)


@pytest.mark.parametrize(
    "value",
    [
        np.float32(1 / 3),
        np.float16(0.1),
        np.int16(-7),
        np.uint8(200),
        np.int64(-(2**40)),
        np.uint64(2**64 - 1),
        np.bool_(True),
        np.complex64(1 + 2j),
        np.float64(0.1),
    ],
)
def test_numpy_scalars_round_trip_with_their_dtype(value):
    back = codec.decode(codec.encode({"x": [value, (value,)]}))
    for got in (back["x"][0], back["x"][1][0]):
        assert type(got) is type(value) and got.dtype == value.dtype
        assert got.tobytes() == value.tobytes()


def test_user_carry_with_numpy_scalars_resumes_bit_for_bit():
    ds = scalar_pipeline()
    expected = take(iter(zj.Loader(ds)), 10)
    assert expected[0]["mean"].dtype == np.float32 and expected[0]["count"].dtype == np.int16
    for cut in (1, 4):
        first = iter(zj.Loader(ds))
        take(first, cut)
        state = codec.decode(codec.encode(first.get_state()))
        resumed = iter(zj.Loader(ds, process_index=1, process_count=2))
        resumed.set_state(state)
        other = iter(zj.Loader(ds, process_index=0, process_count=2))
        other.set_state(state)
        got = [
            {k: np.concatenate([a[k], b[k]]) for k in a}
            for a, b in zip(take(other, 10 - cut), take(resumed, 10 - cut))
        ]
        assert_batches_equal(got, expected[cut:])


# ----- malformed states raise StateError naming the entry ---------------------------------------
def packed() -> zj.BatchedDataset:
    return (
        zj.Dataset.source(make_docs(60, 30, seed=1))
        .shuffle(seed=1)
        .split(16)
        .pack(16, num_bins=3)
        .window_shuffle(3, seed=2)
        .batch(4)
    )


def state_at(ds, steps: int) -> dict:
    it = iter(zj.Loader(ds))
    take(it, steps)
    return it.get_state()


def reseal(value, lane: str) -> np.ndarray:
    """Lane bytes for a decoded lane state, with a valid checksum."""
    body = codec.encode(value)
    return np.frombuffer(body + zlib.crc32(body, int(lane)).to_bytes(4, "little"), np.uint8)


def lane_value(state: dict, lane: str = "1"):
    return codec.decode(np.asarray(state["lanes"][lane]).tobytes()[:-4])


def with_lane(state: dict, value, lane: str = "1") -> dict:
    return {**state, "lanes": {**state["lanes"], lane: reseal(value, lane)}}


def replace_at(value, path: tuple, new):
    if not path:
        return new
    items = list(value)
    items[path[0]] = replace_at(items[path[0]], path[1:], new)
    return tuple(items)


TOP_LEVEL = [
    ("step", "3", "'step' is '3'"),
    ("step", -1, "'step' is -1"),
    ("step", 2.0, "'step' is 2.0"),
    ("step", None, "'step' is None"),
    ("step", True, "'step' is True"),
    ("version", "1", "'version' is '1'"),
    ("version", None, "'version' is None"),
    ("format", None, "format is None"),
    ("fingerprint", None, "'fingerprint' is a NoneType"),
    ("fingerprint", ["x"], "'fingerprint' is a list"),
    ("lanes", None, "'lanes' is a NoneType"),
    ("lanes", [1, 2], "'lanes' is a list"),
    ("lanes", {"x": b""}, "'lanes' has the key 'x'"),
    ("lanes", {"-1": b""}, "'lanes' has the key '-1'"),
    ("lanes", {"01": b""}, "'lanes' has the key '01'"),
    ("lanes", {0: b""}, "'lanes' has the key 0"),
    ("lanes", {"4": b""}, "has lane 4, but its pipeline has 4 lanes"),
    ("lanes", {"0": "abc"}, r"lanes\['0'\] is str"),
    ("lanes", {"0": [1, 999]}, r"lanes\['0'\] is list"),
    ("lanes", {"0": np.zeros(3, np.int32)}, r"lanes\['0'\] is a int32 array"),
]


@pytest.mark.parametrize("key, value, match", TOP_LEVEL)
def test_malformed_state_entries_raise_state_error_naming_the_entry(key, value, match):
    ds = packed()
    state = state_at(ds, 3)
    if key == "lanes" and isinstance(value, dict):
        value = {**{k: v for k, v in state["lanes"].items() if k not in ("0",)}, **value}
    bad = {**state, key: value}
    with pytest.raises(zj.StateError, match=match):
        iter(zj.Loader(ds)).set_state(bad)
    with pytest.raises(zj.StateError, match=match):
        zj.merge_states([bad])


def test_fingerprint_field_of_the_wrong_type():
    ds = packed()
    state = state_at(ds, 3)
    bad = {**state, "fingerprint": {**state["fingerprint"], "seeds": None}}
    with pytest.raises(zj.StateError, match="fingerprint field 'seeds' is a NoneType"):
        iter(zj.Loader(ds)).set_state(bad)


# (path into the decoded lane state, replacement, message). The lane state is
# (version, next_position, input_done, carries, pending); each carry is saved as
# (held lineages, aux): split ((), None), pack (split outputs, records per row),
# window_shuffle (packed rows, draws). An operator output's lineage is
# (parents, recipe): a split piece ((position,), piece), a packed row
# (pieces, lengths).
LANE_ENTRIES = [
    ((0,), "2", "'version' is '2'"),
    ((1,), -3, "'next_position' is -3"),
    ((1,), "7", "'next_position' is '7'"),
    ((1,), 2.0, "'next_position' is 2.0"),
    ((1,), 0, "points to lane-local position"),
    ((1,), 10**9, None),  # not a finite pipeline: any position is possible, but pointers fit
    ((2,), "no", "'input_done' is 'no'"),
    ((2,), 1, "'input_done' is 1"),
    ((2,), True, "'input_done' is True, but this pipeline's input never ends"),
    ((3,), [None, None, None], "operator carries"),
    ((3,), (None, None), "2 operator carries, the pipeline 3"),
    ((3, 0), (1, 2, 3), "operator 0 is not .held lineages, aux."),
    ((3, 2, 1), -1, "window_shuffle.* after -1 draws"),
    ((3, 2, 1), "1", "window_shuffle.* after '1' draws"),
    ((3, 1, 1), (1, 2), "counts .1, 2. records per row"),
    ((3, 1, 1), 3, "counts 3 records per row"),
    ((3, 2, 0, 0), -5, r"carries\[2\] held\[0\] is -5"),
    ((3, 2, 0, 0), 2.5, r"carries\[2\] held\[0\] is 2.5"),
    ((3, 2, 0, 0), 7, "as an output of pack"),
    ((3, 2, 0, 0, 0, 0), (5,), r"held\[0\] parent 0 is \(5,\)"),
    ((3, 2, 0, 0, 0, 0, 0, 0), "x", "parent 0 parent 0 is 'x'"),
    ((3, 2, 0, 0, 0, 0, 1), "x", "piece 'x' of a record"),
    ((3, 2, 0, 0, 1), 7, "as an output of pack.*cannot be remade"),
    ((4,), [], "pending rows must be a tuple"),
]


def lane_with_everything(ds) -> tuple[dict, str]:
    """A state and a lane whose window_shuffle and pack carries both hold pointers."""
    for steps in range(2, 12):
        state = state_at(ds, steps)
        for lane in sorted(state["lanes"]):
            value = lane_value(state, lane)
            if value[3][1][0] and value[3][2][0]:
                return state, lane
    raise AssertionError("no lane with both carries")


@pytest.mark.parametrize("path, new, match", LANE_ENTRIES)
def test_malformed_lane_entries_behind_a_valid_crc_raise_state_error(path, new, match):
    ds = packed()
    state, lane = lane_with_everything(ds)
    bad = with_lane(state, replace_at(lane_value(state, lane), path, new), lane)
    it = iter(zj.Loader(ds))
    expected = take(iter(zj.Loader(ds)), 4)
    if match is None:  # a valid, different position: restoring it is allowed
        it.set_state(bad)
        return
    with pytest.raises(zj.StateError, match=match):
        it.set_state(bad)
    assert_batches_equal(take(it, 4), expected)  # and the iterator is unchanged


def test_lane_bytes_under_another_lane_s_number():
    ds = packed()
    state = state_at(ds, 3)
    swapped = {**state, "lanes": {**state["lanes"], "1": state["lanes"]["2"]}}
    with pytest.raises(zj.StateError, match="lane 1: corrupt state bytes .* another lane's bytes"):
        iter(zj.Loader(ds)).set_state(swapped)


def test_pointer_to_a_piece_that_does_not_exist():
    ds = packed()
    state, lane = lane_with_everything(ds)
    bad = with_lane(state, replace_at(lane_value(state, lane), (3, 2, 0, 0, 0, 0, 1), 50), lane)
    with pytest.raises(zj.StateError, match="piece 50 of a record"):
        iter(zj.Loader(ds)).set_state(bad)


def test_corrupt_user_carry_behind_a_valid_crc():
    ds = scalar_pipeline()
    state = state_at(ds, 2)
    value = lane_value(state, "0")
    bad = with_lane(state, replace_at(value, (3, 0, 1), value[3][0][1][:-1]), "0")
    with pytest.raises(zj.StateError, match="corrupt state bytes"):
        iter(zj.Loader(ds)).set_state(bad)


# ----- a failed set_state changes nothing --------------------------------------------------------
def bad_states(ds) -> list[dict]:
    """States that fail at different depths: form, one lane's form, one lane's records."""
    late, lane = lane_with_everything(ds)
    value = lane_value(late, lane)
    # A pointer that passes every form check but fails while regenerating its record.
    no_such_piece = replace_at(value, (3, 2, 0, 0, 0, 0, 1), 50)
    return [
        {**late, "step": "5"},
        {**late, "step": -1},
        with_lane(late, replace_at(value, (1,), -1), lane),
        with_lane(late, no_such_piece, lane),
    ]


def test_failed_set_state_leaves_the_iterator_exactly_as_it_was():
    ds = packed()
    expected = take(iter(zj.Loader(ds)), 8)
    it = iter(zj.Loader(ds))
    take(it, 3)
    for bad in bad_states(ds):
        with pytest.raises(zj.StateError):
            it.set_state(bad)
        assert it.step == 3
    assert_batches_equal(take(it, 5), expected[3:])
    assert it.step == 8


def test_failed_set_state_with_workers_leaves_the_iterator_as_it_was():
    ds = packed()
    expected = take(iter(zj.Loader(ds)), 8)
    it = iter(zj.Loader(ds, num_workers=2))
    try:
        take(it, 3)
        for bad in bad_states(ds):
            with pytest.raises(zj.StateError):
                it.set_state(bad)
            assert it.step == 3
        assert_batches_equal(take(it, 5), expected[3:])
    finally:
        it.close()


def test_failed_set_state_with_device_prefetch_leaves_the_iterator_as_it_was(sharding):
    ds = packed()
    expected = take(iter(zj.Loader(ds)), 8)
    it = iter(zj.Loader(ds, sharding=sharding, device_prefetch=2))
    try:
        take(it, 3)
        for bad in bad_states(ds):
            with pytest.raises(zj.StateError):
                it.set_state(bad)
            assert it.step == 3
        for got, want in zip(take(it, 5), expected[3:]):
            assert_batch_equal(got, want)
    finally:
        it.close()
