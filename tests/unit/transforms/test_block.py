"""``apply_transforms_block``: transforms in order over a block, batched through
``apply_batch`` where a transform has one (the same results as one by one), ``DROP`` for
dropped records (later transforms skip them), the failing record named; ``block_error``."""

from __future__ import annotations

import pytest

from zephon_jax.core.checks import user_error
from zephon_jax.errors import PipelineError, RecordError, StateError
from zephon_jax.transforms.block import DROP, BlockFailed, apply_transforms_block, block_error
from zephon_jax.transforms.filter import FilterTransform
from zephon_jax.transforms.map import MapTransform


class KeyRecorder:
    """Records ``(record, key)``; batched or not."""

    def __init__(self, batched):
        self.calls = []
        if batched:
            self.apply_batch = self._batch

    def apply(self, record, key):
        self.calls.append(("one", record, key))
        return (record, key)

    def _batch(self, records, keys):
        self.calls.append(("batch", list(records), list(keys)))
        return [(r, k) for r, k in zip(records, keys)]

    def describe(self):
        return "recorder"


def test_transforms_apply_in_order_and_drops_are_skipped_after():
    recorder = KeyRecorder(batched=False)
    transforms = [MapTransform(lambda x: x + 1), FilterTransform(lambda x: x % 2 == 0), recorder]
    out = apply_transforms_block(transforms, [1, 2, 3], lane=4, stage=1, lineages=[10, 11, 12])
    assert out == [(2, (4, 1, 10)), DROP, (4, (4, 1, 12))]
    assert [c[1] for c in recorder.calls] == [2, 4]  # the dropped record is not seen


def test_batched_transforms_get_the_kept_records_in_one_call_with_the_same_keys():
    batched, single = KeyRecorder(batched=True), KeyRecorder(batched=False)
    keep = FilterTransform(lambda x: x != 2)
    args = dict(lane=0, stage=3, lineages=[((7,), 0), 8, 9])
    out_batched = apply_transforms_block([keep, batched], [1, 2, 3], **args)
    out_single = apply_transforms_block([keep, single], [1, 2, 3], **args)
    assert out_batched == out_single == [(1, (0, 3, ((7,), 0))), DROP, (3, (0, 3, 9))]
    assert batched.calls == [("batch", [1, 3], [(0, 3, ((7,), 0)), (0, 3, 9)])]


def test_no_transforms_leave_the_block_as_it_is():
    assert apply_transforms_block([], [1, 2], 0, 0, [0, 1]) == [1, 2]


def test_a_failing_record_is_named_even_when_the_batched_call_failed():
    class Fails(KeyRecorder):
        def apply(self, record, key):
            if record == 3:
                raise ValueError("three")
            return record

        def _batch(self, records, keys):
            raise ValueError("batch")

    fails = Fails(batched=True)
    with pytest.raises(BlockFailed) as caught:
        apply_transforms_block([fails], [1, 2, 3, 4], 0, 0, [0, 1, 2, 3])
    assert caught.value.index == 2 and caught.value.transform is fails
    assert str(caught.value.error) == "three"


def test_a_batch_of_the_wrong_length_is_refused():
    class Short(KeyRecorder):
        def _batch(self, records, keys):
            return records[:-1]

    with pytest.raises(PipelineError, match="returned 1 records for 2; it must return one"):
        apply_transforms_block([Short(batched=True)], [1, 2], 0, 0, [0, 1])


def test_block_error_by_kind_of_error():
    transform = MapTransform(lambda x: x)
    pipeline = BlockFailed(0, transform, PipelineError("bad field"))
    error, cause = block_error(pipeline, "record 5", user_error)
    assert isinstance(error, PipelineError) and str(error) == "bad field\n  (at record 5)"
    assert cause is pipeline.error

    state = StateError("altered")
    state.__cause__ = KeyError("k")
    assert block_error(BlockFailed(0, transform, state), "here", user_error) == (
        state,
        state.__cause__,
    )

    raised = ValueError("v")
    error, cause = block_error(BlockFailed(1, transform, raised), "record 2", user_error, " (x)")
    assert isinstance(error, RecordError) and cause is raised
    assert str(error).startswith(f"{transform.describe()} (x) raised ValueError('v') on record 2")
