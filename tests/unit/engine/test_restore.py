"""Restoring many lanes together is exact and cheap in calls.

* A producer restores all its lanes together (one resolve and one read per
  source for all of them): the lane states and the batches after it are those
  of lanes restored one by one and of the uninterrupted run, for a single
  source, a mixture, and a mixture by tokens with stages and a batch ramp-up.
* With many lanes, a state taken on one topology resumes exactly on others.
* ``Lane.locate`` gives what the sampler resolves, from the compact blocks a
  lane keeps, also after a restore.
* Lanes about to read read ahead together, with the batches of lanes reading alone.
* The codec rejects tampered dtype text with a StateError; the garbage
  collector is paused only while restoring.
* An operator's outputs remade in one loop (and roots taken in one pass) are
  those remade one by one; ``split`` remakes an uncut record as its general path.
"""

from __future__ import annotations

import numpy as np
import pytest
from pipelines import (
    add_one,
    assert_batches_equal,
    full_pipeline,
    make_docs,
    resume_across,
    schedule_pipeline,
    take,
)

import zephon_jax as zj
from zephon_jax.engine.lane import Lane, LanePlan
from zephon_jax.engine.restore import Rebuilder, _read_roots, set_lane_state
from zephon_jax.engine.rows import stack_rows
from zephon_jax.operators.split import SplitOperator
from zephon_jax.sampler.resolve import resolve
from zephon_jax.state import codec
from zephon_jax.state.global_state import lane_bytes
from zephon_jax.state.lane_format import decode_lane_state, encode_lane_state


def packed(num_lanes: int, batch_size: int | None = None) -> zj.BatchedDataset:
    return (
        zj.Dataset.source(make_docs(400, 90, seed=4))
        .shuffle(seed=2)
        .split(32)
        .pack(32, num_bins=4)
        .window_shuffle(3, seed=1)
        .batch(batch_size or num_lanes, num_lanes=num_lanes)
    )


PIPELINES = {
    "single source, 64 lanes": lambda: packed(64),
    "mixture, 16 lanes": lambda: full_pipeline(16, num_lanes=16),
    "staged token mixture with a ramp": lambda: schedule_pipeline(num_lanes=4),
}


@pytest.mark.parametrize("name", list(PIPELINES))
def test_lanes_restored_together_equal_lanes_restored_one_by_one(name):
    ds = PIPELINES[name]()
    save_at, after = 7, 5
    expected = take(iter(zj.Loader(ds)), save_at + after)
    first = iter(zj.Loader(ds))
    take(first, save_at)
    state = first.get_state()

    together = iter(zj.Loader(ds))
    together.set_state(state)  # all lanes of the process at once
    plan = LanePlan(ds)
    one_by_one = {l: Lane(plan, l) for l in range(ds.num_lanes)}
    for l, lane in one_by_one.items():
        set_lane_state(lane, lane_bytes(state, l))

    restored = together.get_state()["lanes"]
    for l, lane in one_by_one.items():
        assert bytes(restored[str(l)]) == encode_lane_state(lane.snapshot(), l), l
        assert bytes(restored[str(l)]) == bytes(state["lanes"][str(l)]), l
    by_hand = []
    for _ in range(after):
        rows = [e.data for l in sorted(one_by_one) for e in one_by_one[l].take()]
        by_hand.append(stack_rows(rows))
    assert_batches_equal(take(together, after), expected[save_at:])
    assert_batches_equal(by_hand, expected[save_at:])


@pytest.mark.parametrize("save_procs, restore_procs", [(4, 1), (1, 8), (2, 4)])
def test_many_lanes_resume_on_another_topology(save_procs, restore_procs):
    ds = packed(256)
    expected = take(iter(zj.Loader(ds)), 6)
    got = resume_across(ds, 6, 3, save_procs, restore_procs)
    assert_batches_equal(got, expected[3:])


@pytest.mark.parametrize("pipeline", [lambda: packed(8), lambda: full_pipeline(8, num_lanes=8)])
def test_locate_gives_what_the_sampler_resolves(pipeline):
    ds = pipeline()
    it = iter(zj.Loader(ds))
    take(it, 6)
    restored = iter(zj.Loader(ds))
    restored.set_state(it.get_state())
    take(restored, 1)
    for producer in (it._producer, restored._producer):
        for l, lane in producer.lanes.items():
            # Positions in the blocks kept (contiguous reads, or a restore's sorted
            # reads), and others, resolved again.
            positions = list(range(lane.next_position + 5))
            res = resolve(ds.sampler, l, np.array(positions), ds.num_lanes)
            want = list(zip(res.leaf.tolist(), res.record.tolist(), res.epoch.tolist()))
            assert lane.locate(positions) == want, l
            assert lane._located  # the blocks were used, not only the sampler


def test_tampered_dtype_text_is_a_state_error():
    data = bytearray(codec.encode(np.arange(3, dtype=np.int16)))
    text = np.dtype(np.int16).newbyteorder("<").str.encode()
    at = bytes(data).index(text)
    data[at : at + len(text)] = b",,,"
    with pytest.raises(zj.StateError, match="corrupt state bytes"):
        codec.decode(bytes(data))


class FailingSource:
    """An in-memory source whose batched reads fail once ``broken`` is set."""

    def __init__(self, docs):
        self.docs = docs
        self.broken = False

    def __len__(self):
        return len(self.docs)

    def __getitem__(self, i):
        return self.docs[i]

    def __getitems__(self, indices):
        if self.broken:
            raise OSError("the disk is gone")
        return [self.docs[i] for i in indices]


def test_a_failed_read_while_restoring_lanes_together_names_them():
    source = FailingSource(make_docs(200, 40, seed=3))
    ds = zj.Dataset.source(source).shuffle(seed=1).split(16).pack(16, num_bins=3).batch(8)
    it = iter(zj.Loader(ds))
    take(it, 3)
    state = it.get_state()
    source.broken = True
    with pytest.raises(zj.RecordError, match=r"lanes 0\.\.7: reading records .*the disk is gone"):
        iter(zj.Loader(ds)).set_state(state)


def _rebuilder(plan: LanePlan, l: int, snapshot) -> Rebuilder:
    """A rebuilder of lane ``l`` with the roots ``snapshot`` points to read."""
    rebuild = Rebuilder(Lane(plan, l))
    held = [h for h, _ in snapshot.carries]
    _read_roots([rebuild], [rebuild.positions(held, snapshot.pending, snapshot.next_position)])
    return rebuild


@pytest.mark.parametrize(
    "pipeline",
    [
        lambda: packed(8),  # split and pack without transforms after them: one loop
        lambda: (
            zj.Dataset.source(make_docs(300, 70, seed=5))  # a map after split: one by one
            .shuffle(seed=1)
            .split(24)
            .map(add_one)
            .pack(24, num_bins=3)
            .batch(4)
        ),
    ],
)
def test_outputs_remade_together_equal_outputs_built_one_by_one(pipeline):
    ds = pipeline()
    it = iter(zj.Loader(ds))
    take(it, 5)
    state = it.get_state()
    plan = LanePlan(ds)
    compared = 0
    for l in range(ds.num_lanes):
        snapshot = decode_lane_state(l, lane_bytes(state, l), plan.num_operators)
        stages = [h for h, _ in snapshot.carries] + [snapshot.pending]
        together, one_by_one = _rebuilder(plan, l, snapshot), _rebuilder(plan, l, snapshot)
        for stage, lineages in enumerate(stages):
            for got, want in zip(
                together.build_all(stage, list(lineages)),
                [one_by_one.build(stage, lineage) for lineage in lineages],
                strict=True,
            ):
                assert got.lineage == want.lineage
                np.testing.assert_array_equal(got.data["tokens"], want.data["tokens"])
                compared += 1
    assert compared > 20


def test_split_remakes_an_uncut_record_as_its_general_path():
    op = SplitOperator(4)
    for n in (0, 1, 4, 5, 9):
        data = {"tokens": np.arange(n, dtype=np.int32), "id": n}
        pieces = op.pieces(data) or [data]  # an empty record remakes as itself
        for recipe in range(len(pieces)):
            for r in (recipe, np.int64(recipe)):
                got = op.remake(r, [data])
                assert got.keys() == pieces[recipe].keys()
                np.testing.assert_array_equal(got["tokens"], pieces[recipe]["tokens"])
        for bad in (False, -1, len(pieces), "0"):
            with pytest.raises(zj.StateError, match="the state holds piece"):
                op.remake(bad, [data])


class _CountingDocs(list):
    """A list source that counts its batched reads."""

    calls = 0

    def __getitems__(self, indices):
        type(self).calls += 1
        return [self[i] for i in indices]


def test_lanes_that_would_read_on_their_own_read_ahead_together_with_the_same_batches(
    monkeypatch,
):
    """Before a step, the lanes about to read read ahead together (one read per source for
    all of them); read-ahead only caches records, so the batches are those of lanes
    reading one by one, byte for byte."""
    import zephon_jax.engine.lane as lane_module

    docs = _CountingDocs(make_docs(2000, 300, seed=5))
    ds = zj.Dataset.source(docs).shuffle(0).split(128).pack(128, num_bins=4).batch(32, 32)
    _CountingDocs.calls = 0
    together = take(iter(zj.Loader(ds)), 30)
    joint_calls = _CountingDocs.calls
    monkeypatch.setattr(lane_module, "read_ahead_for_take", lambda lanes, n: None)
    _CountingDocs.calls = 0
    alone = take(iter(zj.Loader(ds)), 30)
    assert_batches_equal(together, alone)
    assert joint_calls <= 30 < _CountingDocs.calls  # at most one read per step, for 32 lanes


def test_split_remake_rejects_a_recipe_that_is_not_a_piece_number():
    """The quick path for an uncut record looks at the recipe's type first: an array
    recipe from a tampered state raises StateError, not numpy's truth-value error."""
    from zephon_jax.operators.split import SplitOperator

    op = SplitOperator(4)
    record = {"tokens": np.arange(3)}
    assert op.remake(0, [record]) is record
    for recipe in (np.array([0, 1]), 5, -1, "0"):
        with pytest.raises(zj.StateError, match="piece"):
            op.remake(recipe, [record])
