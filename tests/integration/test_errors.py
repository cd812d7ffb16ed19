"""Bad input gets a clear error naming the cause and the fix; a failure never corrupts state."""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest
from pipelines import assert_batches_equal, concat_parts, make_docs, take

import zephon_jax as zj
from zephon_jax.state import codec

HERE = os.path.dirname(
    os.path.abspath(__file__)
)  # this folder (its parent, tests/, holds the helpers)

NUM_RECORDS = 40
BAD_ID = 13  # 4 lanes: lane 13 % 4 = 1 reads record 13 at lane-local position 13 // 4 = 3


def id_records(n: int = NUM_RECORDS) -> list[dict]:
    return [{"tokens": np.arange(3, dtype=np.int32) + i, "id": np.array([i])} for i in range(n)]


def first_batches(ds: zj.BatchedDataset, steps: int = 4, **loader_kwargs) -> list:
    return take(iter(zj.Loader(ds, **loader_kwargs)), steps)


def fails_on_bad_id(record):
    if int(record["id"][0]) == BAD_ID:
        raise KeyError("user function failed")
    return record


def fails_on_bad_id_rng(record, rng):
    return fails_on_bad_id(record)


def fails_on_bad_id_pred(record):
    return fails_on_bad_id(record) is not None


def fails_on_bad_id_flat(record):
    return [fails_on_bad_id(record)]


class FailsOnBadId(zj.Operator):
    def init(self):
        return 0

    def step(self, carry, record):
        return carry + 1, [fails_on_bad_id(record)]


# ----- wrong record type or shape --------------------------------------------------------------
def test_pack_rejects_records_that_are_not_dicts():
    ds = zj.Dataset.source(list(range(10))).pack(8).batch(2)
    with pytest.raises(zj.PipelineError, match="dicts of 1-D arrays") as info:
        first_batches(ds)
    assert "got int" in str(info.value)
    assert "lane 0" in str(info.value) and "source list(len=10), record 0" in str(info.value)


def test_pack_rejects_2d_fields():
    ds = zj.Dataset.source([{"tokens": np.zeros((2, 3), np.int32)}] * 4).pack(8).batch(2)
    with pytest.raises(zj.PipelineError, match=r"1-D numpy array; field 'tokens' .* \(2, 3\)"):
        first_batches(ds)


def test_concat_pack_rejects_records_that_are_not_dicts():
    ds = zj.Dataset.source(["text"] * 4).pack(8, method="concat").batch(2)
    with pytest.raises(zj.PipelineError, match="dicts of 1-D arrays.*got str"):
        first_batches(ds)


def test_split_names_the_missing_field():
    ds = zj.Dataset.source([{"ids": np.arange(3)}] * 4).split(2).batch(2)
    with pytest.raises(zj.PipelineError, match=r"'tokens' field.*\['ids'\].*pass key="):
        first_batches(ds)


def test_records_that_are_not_arrays_are_not_batched_as_objects():
    ds = zj.Dataset.source([None] * 4).batch(2)
    with pytest.raises(zj.PipelineError, match=r"\['NoneType'\].*convert records"):
        first_batches(ds)


def test_rows_of_different_shapes_name_the_field_and_the_fix():
    ds = zj.Dataset.source([{"x": np.zeros(2)}, {"x": np.zeros(3)}]).batch(2)
    with pytest.raises(zj.PipelineError, match=r"field 'x'.*\(2,\), \(3,\).*\.pack\(seq_len\)"):
        first_batches(ds)


def test_not_a_random_access_source():
    with pytest.raises(zj.PipelineError, match="__len__ and __getitem__.*got generator"):
        zj.Dataset.source(x for x in range(3))


class _FailingSource:
    def __len__(self):
        return 10

    def __getitem__(self, index):
        raise OSError("disk gone")


def test_source_that_raises_names_the_source_and_records():
    ds = zj.Dataset.source(_FailingSource()).batch(2)
    with pytest.raises(zj.RecordError, match=r"_FailingSource\(len=10\).*disk gone") as info:
        first_batches(ds)
    assert "lane 0" in str(info.value) and "records [0, 2, 4" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)


class _ShortGetitems(list):
    def __getitems__(self, indices):
        return [self[i] for i in indices][:-1]


def test_getitems_returning_too_few_records():
    ds = zj.Dataset.source(_ShortGetitems(range(10))).batch(2)
    with pytest.raises(zj.RecordError, match=r"returned \d+ records for \d+ indices") as raised:
        first_batches(ds)
    got, asked = re.search(r"returned (\d+) records for (\d+)", str(raised.value)).groups()
    assert int(got) == int(asked) - 1  # _ShortGetitems drops one


def test_empty_source():
    with pytest.raises(zj.PipelineError, match="list.len=0. is empty"):
        zj.Dataset.source([])


# ----- user functions that raise -------------------------------------------------------------------
USER_FUNCTIONS = {
    "map": (lambda ds: ds.map(fails_on_bad_id), f"map({__name__}.fails_on_bad_id)"),
    "filter": (
        lambda ds: ds.filter(fails_on_bad_id_pred),
        f"filter({__name__}.fails_on_bad_id_pred)",
    ),
    "random_map": (
        lambda ds: ds.random_map(fails_on_bad_id_rng, seed=3),
        f"random_map({__name__}.fails_on_bad_id_rng, seed=3)",
    ),
    "flat_map": (
        lambda ds: ds.flat_map(fails_on_bad_id_flat),
        f"flat_map({__name__}.fails_on_bad_id_flat)",
    ),
    "user operator": (lambda ds: ds.apply(FailsOnBadId()), f"apply({__name__}.FailsOnBadId())"),
    "map after split": (
        lambda ds: ds.split(100).map(fails_on_bad_id),
        f"map({__name__}.fails_on_bad_id) after split",
    ),
}


@pytest.mark.parametrize("kind", list(USER_FUNCTIONS))
def test_user_function_error_names_lane_position_source_record(kind):
    build, name = USER_FUNCTIONS[kind]
    ds = build(zj.Dataset.source(id_records())).batch(4)
    with pytest.raises(zj.RecordError) as info:
        first_batches(ds, steps=10)
    message = str(info.value)
    assert name in message
    assert "KeyError('user function failed')" in message
    assert "lane 1," in message
    assert "lane-local position 3" in message
    assert f"source list(len={NUM_RECORDS})" in message
    assert f"record {BAD_ID}" in message
    assert "restore the state taken before the failure" in message
    cause = info.value.__cause__
    assert isinstance(cause, KeyError)
    # The original traceback is kept: its innermost frame is the user function.
    frame = cause.__traceback__
    while frame.tb_next is not None:
        frame = frame.tb_next
    assert frame.tb_frame.f_code.co_name == "fails_on_bad_id"


def test_user_operator_flush_error_names_the_operator():
    class FailsOnFlush(zj.Operator):
        def init(self):
            return 0

        def step(self, carry, record):
            return carry, [record]

        def flush(self, carry):
            raise ValueError("flush failed")

    ds = zj.Dataset.source(list(range(4))).repeat(1).apply(FailsOnFlush()).batch(2)
    with pytest.raises(
        zj.RecordError, match=r"FailsOnFlush\(\)\)\.flush raised ValueError"
    ) as info:
        first_batches(ds, steps=3)
    assert isinstance(info.value.__cause__, ValueError)


def test_user_operator_with_a_bad_return_value():
    class ReturnsList(zj.Operator):
        def init(self):
            return 0

        def step(self, carry, record):
            return [record]

    ds = zj.Dataset.source(list(range(4))).apply(ReturnsList()).batch(2)
    with pytest.raises(zj.PipelineError, match=r"step must return \(carry, list_of_records\)"):
        first_batches(ds)


def test_user_operator_carry_that_is_not_plain_data():
    class ObjectCarry(zj.Operator):
        def init(self):
            return object()

        def step(self, carry, record):
            return carry, [record]

    it = iter(zj.Loader(zj.Dataset.source(list(range(4))).apply(ObjectCarry()).batch(2)))
    next(it)
    with pytest.raises(zj.StateError, match="type object: a carry must be plain data"):
        it.get_state()


# ----- mixture weights ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "weights, match",
    [
        ([0.0, 1.0], "weight 0 is 0.0; every weight must be a finite number > 0"),
        ([1.0, -2.0], "weight 1 is -2.0"),
        ([math.nan, 1.0], "weight 0 is nan"),
        ([1.0, math.inf], "weight 1 is inf"),
        ([1.0], "2 datasets but 1 weights; give one weight per dataset"),
        ([1.0, 1.0, 1.0], "2 datasets but 3 weights"),
        (["a", 1.0], "weights must be numbers"),
        ([], "at least one"),
    ],
)
def test_bad_mixture_weights(weights, match):
    parts = [zj.Dataset.source([1, 2]), zj.Dataset.source([3])]
    with pytest.raises(zj.PipelineError, match=match):
        zj.Dataset.mix(parts, weights)


# ----- batch and topology -------------------------------------------------------------------------------
def test_batch_not_a_multiple_of_lanes():
    with pytest.raises(
        zj.PipelineError, match="global_batch_size=6 is not a multiple of num_lanes=4"
    ):
        zj.Dataset.source([1]).batch(6, num_lanes=4)


def test_process_count_that_cannot_hold_the_batch():
    with pytest.raises(zj.PipelineError, match="process_count=4 cannot hold global_batch_size=6"):
        zj.Loader(zj.Dataset.source([1]).batch(6), process_index=0, process_count=4)


def test_process_index_out_of_range():
    with pytest.raises(zj.PipelineError, match=r"process_index must be in \[0, 2\)"):
        zj.Loader(zj.Dataset.source([1]).batch(4), process_index=2, process_count=2)


def test_record_longer_than_seq_len_reaching_pack():
    ds = zj.Dataset.source([{"tokens": np.arange(20, dtype=np.int32)}]).pack(8).batch(2)
    with pytest.raises(
        zj.PipelineError, match=r"record of 20 items .* add \.split\(8\) before"
    ) as info:
        first_batches(ds)
    assert "lane 0" in str(info.value)


# ----- states -------------------------------------------------------------------------------------------------
def packed_pipeline(**changes) -> zj.BatchedDataset:
    """A small pipeline; ``changes`` alter one part of its definition."""
    p = {
        "docs": 60,
        "seed": 1,
        "seq_len": 16,
        "batch": 4,
        "lanes": None,
        "weights": (0.6, 0.4),
        "fn": add_one,
        "epochs": None,
    }
    p.update(changes)
    a = zj.Dataset.source(make_docs(p["docs"], 12, seed=1))
    b = zj.Dataset.source(make_docs(30, 6, seed=2))
    return (
        zj.Dataset.mix([a, b], list(p["weights"]))
        .repeat(p["epochs"])
        .shuffle(p["seed"])
        .map(p["fn"])
        .pack(p["seq_len"], num_bins=3)
        .batch(p["batch"], num_lanes=p["lanes"])
    )


def add_one(record):
    return {"tokens": record["tokens"] + 1}


def add_two(record):
    return {"tokens": record["tokens"] + 2}


def state_after(ds: zj.BatchedDataset, steps: int, process_index: int = 0, process_count: int = 1):
    it = iter(zj.Loader(ds, process_index=process_index, process_count=process_count))
    take(it, steps)
    return it.get_state()


@pytest.mark.parametrize(
    "field, changes",
    [
        ("seeds", {"seed": 2}),
        ("operators", {"seq_len": 24}),
        ("sources", {"docs": 61}),
        ("global_batch_size", {"batch": 8}),
        ("num_lanes", {"lanes": 2}),
        ("weights", {"weights": (0.5, 0.5)}),
        ("transforms", {"fn": add_two}),
        ("num_epochs", {"epochs": 3}),
    ],
)
def test_state_from_a_different_pipeline_names_the_field(field, changes):
    state = state_after(packed_pipeline(), 3)
    it = iter(zj.Loader(packed_pipeline(**changes)))
    with pytest.raises(zj.StateMismatchError) as info:
        it.set_state(state)
    assert info.value.field == field
    assert f"pipeline {field!r} differs" in str(info.value)
    assert "Restore into the pipeline the state was taken from" in str(info.value)


def test_state_from_another_version():
    state = state_after(packed_pipeline(), 2)
    state["version"] = 99
    with pytest.raises(zj.StateError, match="version 99; this zephon_jax reads version 1"):
        iter(zj.Loader(packed_pipeline())).set_state(state)


def test_lane_state_from_another_version():
    state = state_after(packed_pipeline(), 2)
    state["lanes"]["0"] = np.frombuffer(codec.encode((1, 0, False, (None,), ())), np.uint8)
    with pytest.raises(zj.StateError, match="lane 0: unrecognized lane state .lane format 1"):
        iter(zj.Loader(packed_pipeline())).set_state(state)


@pytest.mark.parametrize(
    "mangle, match",
    [
        (lambda s: s.update(format="other.loader"), "format is 'other.loader'"),
        (lambda s: s.pop("lanes"), "no 'lanes' entry"),
        (lambda s: s["fingerprint"].pop("seeds"), "fingerprint has no 'seeds' field"),
    ],
)
def test_state_of_another_format(mangle, match):
    state = state_after(packed_pipeline(), 2)
    mangle(state)
    with pytest.raises(zj.StateError, match=match):
        iter(zj.Loader(packed_pipeline())).set_state(state)


def test_state_that_is_not_a_dict():
    with pytest.raises(zj.StateError, match="a loader state is a dict; got list"):
        iter(zj.Loader(packed_pipeline())).set_state([1, 2])


def test_single_process_state_on_another_topology_needs_merge_states():
    ds = packed_pipeline(batch=8)
    state = state_after(ds, 3, process_index=0, process_count=2)
    with pytest.raises(
        zj.StateError, match=r"does not cover lane 4 \(it covers lanes 0-3\).*merge_states"
    ):
        iter(zj.Loader(ds)).set_state(state)


def test_merge_states_rejects_different_steps_and_pipelines():
    ds = packed_pipeline(batch=8)
    s0 = state_after(ds, 3, 0, 2)
    with pytest.raises(zj.StateError, match="state 1 is at step 2 but state 0 at step 3"):
        zj.merge_states([s0, state_after(ds, 2, 1, 2)])
    with pytest.raises(zj.StateMismatchError, match="'seeds' differs"):
        zj.merge_states([s0, state_after(packed_pipeline(batch=8, seed=9), 3, 1, 2)])


def test_every_corrupted_byte_of_a_lane_state_is_detected():
    state = state_after(packed_pipeline(), 5)
    blob = state["lanes"]["2"]
    it = iter(zj.Loader(packed_pipeline()))
    for i in range(len(blob)):
        bad = {**state, "lanes": {**state["lanes"], "2": blob.copy()}}
        bad["lanes"]["2"][i] ^= 0x5A
        with pytest.raises(zj.StateError, match="lane 2: corrupt state bytes"):
            it.set_state(bad)


def test_truncated_state_bytes():
    state = state_after(packed_pipeline(), 5)
    blob = state["lanes"]["1"]
    for cut in (0, 1, 4, len(blob) - 1):
        state["lanes"]["1"] = blob[:cut]
        with pytest.raises(zj.StateError, match="corrupt state bytes"):
            iter(zj.Loader(packed_pipeline())).set_state(state)


def test_corrupt_bytes_decoded_directly():
    data = codec.encode((2, 5, (1, 2)))
    with pytest.raises(zj.StateError, match="corrupt state bytes.*intact checkpoint"):
        codec.decode(data[:-1])
    with pytest.raises(zj.StateError, match="trailing bytes"):
        codec.decode(data + b"\x00")


def test_failed_restore_leaves_the_iterator_unchanged():
    ds = packed_pipeline()
    it = iter(zj.Loader(ds))
    take(it, 2)
    bad = state_after(ds, 4)
    bad["lanes"]["3"] = bad["lanes"]["3"][:-2]
    with pytest.raises(zj.StateError):
        it.set_state(bad)
    assert_batches_equal(take(it, 3), first_batches(ds, 5)[2:])


# ----- ArrayRecord sources ------------------------------------------------------------------------
@pytest.fixture
def array_record_file(tmp_path):
    from array_record.python import array_record_module

    path = str(tmp_path / "records.array_record")
    writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
    for i in range(20):
        writer.write(np.arange(i + 1, dtype=np.int32).tobytes())
    writer.close()
    return path


def _array_record_pipeline(path: str) -> zj.BatchedDataset:
    import grain

    source = grain.sources.ArrayRecordDataSource([path])
    return zj.Dataset.source(source).map(lambda b: np.frombuffer(b, np.int32)[:1]).batch(2)


def test_array_record_file_removed_after_opening(array_record_file):
    ds = _array_record_pipeline(array_record_file)
    os.remove(array_record_file)
    with pytest.raises(zj.RecordError, match="ArrayRecordDataSource") as info:
        first_batches(ds)
    assert f"files: {array_record_file}" in str(info.value)
    assert "exist, are readable and intact" in str(info.value)
    assert info.value.__cause__ is not None


def test_corrupt_array_record_file(array_record_file):
    with open(array_record_file, "r+b") as f:
        f.seek(40)
        data = bytearray(f.read(160))
        f.seek(40)
        f.write(bytes(b ^ 0xFF for b in data))
    ds = _array_record_pipeline(array_record_file)
    with pytest.raises(zj.RecordError, match=r"ArrayRecordDataSource\(len=20\) \[files: .*Corrupt"):
        first_batches(ds)


def test_array_record_missing_file_fails_when_opened(tmp_path):
    # Grain opens the files when the source is built, before zephon_jax sees it.
    import grain

    with pytest.raises(RuntimeError, match="No such file"):
        grain.sources.ArrayRecordDataSource([str(tmp_path / "missing.array_record")])


# ----- faults: a failure never corrupts state -----------------------------------------------------
class _Flaky:
    """A map that fails while ``fails(record)`` holds (a transient fault); pure otherwise."""

    def __init__(self):
        self.fails = None

    def __call__(self, record):
        if self.fails is not None and self.fails(record):
            raise ConnectionError("transient failure")
        return {"tokens": record["tokens"] * 2}


def flaky_pipeline(flaky: _Flaky) -> zj.BatchedDataset:
    docs = make_docs(80, 10, seed=4)
    return (
        zj.Dataset.source(docs)
        .shuffle(5)
        .split(6)
        .pack(12, num_bins=3)
        .map(flaky)
        .window_shuffle(3, seed=6)
        .batch(4)
    )


def test_user_function_failure_does_not_corrupt_state():
    flaky = _Flaky()
    ds = flaky_pipeline(flaky)
    expected = first_batches(ds, 80)  # (past the rows the lanes made ahead by step 5)
    it = iter(zj.Loader(ds))
    take(it, 5)
    before = it.get_state()
    flaky.fails = lambda record: int(record["tokens"][0]) % 17 == 3
    with pytest.raises(zj.RecordError, match="ConnectionError"):
        take(it, 75)
    failed_at = it.step
    # The lanes stopped part-way through a batch: the iterator refuses to go on or to
    # hand out a state instead of skipping or repeating records.
    with pytest.raises(zj.RecordError, match="failed while producing a batch"):
        next(it)
    with pytest.raises(zj.RecordError, match="Restore a state taken before the failure"):
        it.get_state()
    flaky.fails = None
    # The state taken before the failure restores exactly, in the same and a new iterator.
    it.set_state(before)
    assert_batches_equal(take(it, 75), expected[5:])
    fresh = iter(zj.Loader(ds, process_index=1, process_count=2))
    fresh.set_state(before)
    other = iter(zj.Loader(ds, process_index=0, process_count=2))
    other.set_state(before)
    rows = [concat_parts([next(other), next(fresh)]) for _ in range(failed_at + 1 - 5)]
    assert_batches_equal(rows, expected[5 : failed_at + 1])


def test_failure_while_restoring_names_the_element_and_keeps_the_iterator():
    flaky = _Flaky()
    ds = flaky_pipeline(flaky)
    it = iter(zj.Loader(ds))
    take(it, 8)
    state = it.get_state()
    expected = take(it, 4)
    fresh = iter(zj.Loader(ds))
    take(fresh, 8)
    flaky.fails = lambda record: True
    with pytest.raises(zj.RecordError, match=r"regenerating .* \(restoring a state\)") as info:
        fresh.set_state(state)
    assert isinstance(info.value.__cause__, ConnectionError)
    flaky.fails = None
    assert_batches_equal(take(fresh, 4), expected)


# ----- a training process killed during an Orbax save ------------------------------------------
SAVER = """
import sys, time
sys.path[:0] = {tests!r}
import orbax.checkpoint as ocp
import zephon_jax as zj
import zephon_jax.checkpoint as zc
from test_errors import checkpoint_pipeline

directory, use_async = sys.argv[1], sys.argv[2] == "async"
options = ocp.CheckpointManagerOptions(enable_async_checkpointing=use_async)
manager = ocp.CheckpointManager(directory, options=options)
it = iter(zj.Loader(checkpoint_pipeline()))
for _ in range(3):
    next(it)
manager.save(3, args=ocp.args.Composite(data=zc.Save(it)))
manager.wait_until_finished()
for _ in range(3):
    next(it)
write = zc.LoaderCheckpointHandler._write

def write_half_then_stall(directory, lanes, meta):
    write(directory, dict(list(lanes.items())[: len(lanes) // 2]), None)
    print("MID-SAVE", flush=True)
    time.sleep(600)

zc.LoaderCheckpointHandler._write = staticmethod(write_half_then_stall)
manager.save(6, args=ocp.args.Composite(data=zc.Save(it)))
manager.wait_until_finished()
print("SAVE-FINISHED", flush=True)
"""


def checkpoint_pipeline() -> zj.BatchedDataset:
    docs = make_docs(60, 20, seed=11)
    return zj.Dataset.source(docs).shuffle(2).split(16).pack(16, num_bins=3).batch(4)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_process_killed_during_an_orbax_save_keeps_the_previous_checkpoint(tmp_path, mode):
    import signal
    import subprocess
    import sys

    ocp = pytest.importorskip("orbax.checkpoint")
    zc = pytest.importorskip("zephon_jax.checkpoint")
    script = tmp_path / "saver.py"
    script.write_text(SAVER.format(tests=[HERE, os.path.dirname(HERE)]))
    directory = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(directory), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # blocks until the save of step 6 is half written
        assert line.strip() == "MID-SAVE", f"the saver did not reach the save: {line!r}"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    partial = [p.name for p in directory.iterdir() if p.name.startswith("6.")]
    assert partial and "tmp" in partial[0], sorted(p.name for p in directory.iterdir())

    ds = checkpoint_pipeline()
    expected = first_batches(ds, 10)[3:]
    manager = ocp.CheckpointManager(directory)
    assert manager.latest_step() == 3, manager.all_steps()
    restored = [iter(zj.Loader(ds, process_index=i, process_count=2)) for i in range(2)]
    for it in restored:
        manager.restore(3, args=ocp.args.Composite(data=zc.Restore(it)))
        assert it.step == 3
    assert_batches_equal([concat_parts([next(it) for it in restored]) for _ in range(7)], expected)
    manager.close()


def drop_everything(record):
    return False


def test_filter_that_drops_every_record_raises_instead_of_hanging():
    ds = zj.Dataset.source(list(range(10))).filter(drop_everything).batch(2)
    with pytest.raises(zj.RecordError, match=r"lane 0: the filters dropped all of the last 100161"):
        first_batches(ds, 1)


def test_jsonl_whitespace_lines_are_blank_and_a_bad_line_is_named(tmp_path):
    from zephon_jax.sources import JsonlSource

    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"x": 0}\n  \t \n{"x": 1}\r\n\t\r\nnot json\n \n{"x": 3}\n')
    src = JsonlSource(path, progress=False)
    assert len(src) == 4 and src.__getitems__([0, 1, 3]) == [{"x": 0}, {"x": 1}, {"x": 3}]
    ds = zj.Dataset.source(src).map(lambda r: np.int64(r["x"])).batch(1, num_lanes=1)
    # The one bad line is named (file, record, byte); the whitespace lines are not records.
    with pytest.raises(zj.RecordError, match=r"data\.jsonl: record 2 \(line at byte 27\) is not"):
        first_batches(ds, 1)


class CountedReads:
    """100 records of 1 to 7 tokens (from ``base`` up), counting the records read."""

    def __init__(self, base: int):
        self.base, self.reads = base, 0

    def __len__(self):
        return 100

    def __getitem__(self, i):
        self.reads += 1
        return {"tokens": np.arange(1 + i % 7, dtype=np.int32) + self.base}


def no_tokens(record):
    return {"tokens": record["tokens"][:0]}


STAGED = {0: [0.5, 0.5], 2: [0.3, 0.7]}


@pytest.mark.parametrize("weights", [[0.5, 0.5], STAGED], ids=["fixed", "staged"])
@pytest.mark.parametrize("empty", ["filtered", "no_tokens"])
def test_a_component_giving_no_tokens_in_a_mixture_by_tokens_is_named_early(weights, empty):
    from zephon_jax.sampler.scheduled_mixture import DRY_DRAWS, max_chunk

    web, code = CountedReads(1000), CountedReads(0)
    dry = zj.Dataset.source(web, name="web")
    dry = dry.filter(drop_everything) if empty == "filtered" else dry.map(no_tokens)
    mixed = zj.Dataset.mix([dry, zj.Dataset.source(code, name="code")], weights, unit="tokens")
    limit = 16 * len(web) + DRY_DRAWS
    with pytest.raises(
        zj.RecordError,
        match=rf"lane 0: mixture component 0 \(web\) gave no tokens in its last {limit + 1} "
        r"draws.*filter dropped every record, or its records have empty 'tokens'.*Check the "
        r"component's filter",
    ):
        first_batches(mixed.pack(8).batch(4), 1)
    # The work is bounded by the component's size: the limit and one read-ahead block
    # (of a loader of 4 lanes, one a batch row).
    block = max_chunk(4)
    assert web.reads <= limit + 1 + block and code.reads <= block


@pytest.mark.parametrize("weights", [[0.5, 0.5], STAGED], ids=["fixed", "staged"])
def test_a_filtered_out_component_of_a_mixture_by_records_leaves_the_others(weights):
    # By records a dropped record still counts one draw: the other component fills the rows.
    web, code = CountedReads(1000), CountedReads(0)
    dry = zj.Dataset.source(web).filter(drop_everything)
    mixed = zj.Dataset.mix([dry, zj.Dataset.source(code)], weights, unit="records")
    batches = first_batches(mixed.pack(8).batch(4), 6)
    tokens = np.concatenate([b["tokens"].ravel() for b in batches])
    assert tokens.max() < 1000 and (tokens > 0).any()
    assert web.reads < 4 * code.reads + 512


def test_skipped_positions_of_an_exhausted_source_are_not_filter_drops():
    # After the frequent source's single epoch ends, its positions are skipped (a run of
    # ~300,000): only filtered records count towards the all-dropped error.
    rare = zj.Dataset.source(list(range(100))).repeat(1)
    frequent = zj.Dataset.source(list(range(1000, 1010))).repeat(1)
    ds = zj.Dataset.mix([rare, frequent], [1 / 300_000, 1]).batch(1)
    values = [int(b[0]) for b in first_batches(ds, 12)]
    assert sorted(values[:10]) == list(range(1000, 1010))
    assert values[10] < 100 and values[11] < 100  # ~300,000 positions apart
