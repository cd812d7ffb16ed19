"""The engine chooses its paths (split fused into pack, the column path, counting rows in
bulk) from what operators declare, never from their classes: the built-ins declare them,
and a user operator that declares nothing runs on the general path, its rows traced."""

from __future__ import annotations

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.engine.accounting import packed_rows, whole_records
from zephon_jax.engine.lane import LanePlan
from zephon_jax.operators import (
    BinPackOperator,
    ConcatPackOperator,
    FlatMapOperator,
    SplitOperator,
    WindowShuffleOperator,
)
from zephon_jax.operators.base import BinPacking
from zephon_jax.sources import TokenArray
from zephon_jax.state.global_state import lane_bytes

# Documents of 10, 15, 15, 3 and 21 tokens.
TOKENS = TokenArray(np.arange(1, 65, dtype=np.int32), [0, 10, 25, 40, 43, 64])
DECLARED = (
    "cuts_records",
    "cut_key",
    "rows_list_pieces",
    "fuses_after_split",
    "column_packing",
    "may_pack",
)


class UserPack(zj.LineageOperator):
    """A user operator running a built-in ``pack``: with ``declare``, it declares what that
    pack declares (and has its ``place_split``); without, nothing."""

    name = "user_pack"
    user_code = False

    def __init__(self, inner: BinPackOperator, declare: bool):
        self.inner = inner
        self.max_held = inner.max_held
        if declare:
            for attribute in DECLARED:
                setattr(self, attribute, getattr(inner, attribute))
            self.place_split = inner.place_split

    def init(self, lane):
        return self.inner.init(lane)

    def step(self, carry, element):
        return self.inner.step(carry, element)

    def step_block(self, carry, elements):
        return self.inner.step_block(carry, elements)

    def flush(self, carry):
        return self.inner.flush(carry)

    def remake(self, recipe, inputs):
        return self.inner.remake(recipe, inputs)

    def trace(self, recipe, parents, start, stop):
        return self.inner.trace(recipe, parents, start, stop)

    def save(self, carry):
        return self.inner.save(carry)

    def save_lineages(self, carry):
        return self.inner.save_lineages(carry)

    def load(self, saved, lane):
        return self.inner.load(saved, lane)

    def describe(self):
        return self.inner.describe()  # the same fingerprint as the pack it runs


def pipeline(split: bool, pack: str) -> zj.BatchedDataset:
    """``source(TOKENS).shuffle [.split(8)]`` then ``pack(32, num_bins=2)`` (``"builtin"``)
    or :class:`UserPack` running it (``"declared"``, ``"undeclared"``)."""
    ds = zj.Dataset.source(TOKENS).shuffle(seed=1)
    if split:
        ds = ds.split(8)
    if pack == "builtin":
        ds = ds.pack(32, num_bins=2)
    else:
        ds = ds.apply(UserPack(BinPackOperator(32, num_bins=2), pack == "declared"))
    return ds.batch(2, num_lanes=2)


def test_the_builtins_declare_what_they_can_do():
    pack = BinPackOperator(32, "first_fit", num_bins=3)
    assert pack.rows_list_pieces and pack.fuses_after_split == 32 and pack.may_pack
    assert pack.column_packing == BinPacking(3, False, pack.spec)
    split = SplitOperator(8, key="ids")
    assert (split.cuts_records, split.cut_key, split.may_pack) == (8, "ids", False)
    assert not split.rows_list_pieces and split.column_packing is None
    assert not WindowShuffleOperator(4, seed=0).may_pack
    assert not FlatMapOperator(lambda r: [r]).may_pack
    concat = ConcatPackOperator(32)
    assert (concat.rows_list_pieces, concat.fuses_after_split, concat.column_packing) == (
        False,
        0,
        None,
    )


def test_an_operator_that_declares_nothing_gets_the_safe_defaults():
    class Copy(zj.LineageOperator):
        def step(self, carry, element):
            return carry, [zj.derive(element.data, [element])]

    op = Copy()
    assert (op.cuts_records, op.rows_list_pieces, op.fuses_after_split) == (0, False, 0)
    assert op.column_packing is None and op.may_pack


@pytest.mark.parametrize("split", [False, True])
def test_the_builtins_take_the_fused_column_and_bulk_paths(split):
    plan = LanePlan(pipeline(split, "builtin"))
    assert plan.columnar is not None and plan.columnar.cut == (8 if split else 0)
    assert packed_rows(plan) and not whole_records(plan)
    if split:
        pack, cut, key, compact = plan.fused[0]
        assert (type(pack), cut, key, compact) == (BinPackOperator, 8, "tokens", True)
    else:
        assert plan.fused == [None]


@pytest.mark.parametrize("split", [False, True])
def test_a_user_operator_takes_the_paths_it_declares(split):
    declared = LanePlan(pipeline(split, "declared"))
    assert declared.columnar is not None and packed_rows(declared)
    assert (declared.fused[0] is not None) == split
    undeclared = LanePlan(pipeline(split, "undeclared"))
    assert undeclared.columnar is None and undeclared.fused[0] is None
    assert not packed_rows(undeclared)  # its rows are counted by tracing their lineages
    assert whole_records(undeclared) == (not split)


@pytest.mark.parametrize("split", [False, True])
def test_every_path_gives_the_builtin_batches_states_and_counts(split):
    runs = {}
    for pack in ("builtin", "declared", "undeclared"):
        ds = pipeline(split, pack)
        iterator = iter(zj.Loader(ds))
        batches = [next(iterator) for _ in range(6)]
        state = iterator.get_state()
        lanes = [lane_bytes(state, lane) for lane in range(ds.num_lanes)]
        runs[pack] = (batches, lanes, zj.accounting(state, ds))
    want_batches, want_lanes, want_counts = runs["builtin"]
    assert want_counts["sources"]  # rows were counted
    for pack in ("declared", "undeclared"):
        batches, lanes, counts = runs[pack]
        for got, want in zip(batches, want_batches, strict=True):
            assert got.keys() == want.keys()
            for field in want:
                np.testing.assert_array_equal(got[field], want[field])
        assert lanes == want_lanes, pack
        assert counts == want_counts, pack
