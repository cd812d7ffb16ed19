"""``columnar_plan``: which pipelines a lane reads column-wise (token arrays packed by the
compiled kernels), and what the plan holds. (That the column-wise path gives the general
path's batches and states, byte for byte, is tests/integration/test_token_columns.py.)"""

from __future__ import annotations

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.engine.columns import columnar_plan
from zephon_jax.engine.lane import LanePlan
from zephon_jax.sources import TokenArray

# Documents of 10, 15 and 15 tokens; and of 5 and 15.
A = TokenArray(np.arange(1, 41, dtype=np.int32), [0, 10, 25, 40])
B = TokenArray(np.arange(1, 21, dtype=np.int32), [0, 5, 20])


# A list of one-field records: documents of 3, 0 and 7 tokens.
LIST = [{"tokens": np.arange(n, dtype=np.int32) + 100 * n} for n in (3, 0, 7)]


def plan_of(ds):
    return columnar_plan(LanePlan(ds))


def test_a_packed_token_array_is_read_column_wise():
    plan = plan_of(zj.Dataset.source(A).shuffle(1).pack(32, num_bins=3).batch(4))
    assert plan is not None
    assert (plan.stage, plan.cut, plan.field) == (0, 0, "tokens")
    assert np.shares_memory(plan.tokens[0], A.tokens)  # read in place, not copied
    assert plan.reader.offsets.tolist() == [0, 10, 25, 40] and plan.reader.bases.tolist() == [0]
    assert plan.packing == (3, True, plan.packing.spec) and plan.packing.spec.seq_len == 32


def test_split_before_pack_runs_fused_with_its_cut():
    plan = plan_of(zj.Dataset.source(A).split(8).pack(32).batch(4))
    assert plan is not None and (plan.stage, plan.cut) == (1, 8)


def test_a_mixture_by_records_puts_the_offsets_one_after_the_other():
    mixed = zj.Dataset.mix([zj.Dataset.source(A), zj.Dataset.source(B)], [0.5, 0.5])
    plan = plan_of(mixed.pack(32).batch(4))
    assert plan is not None
    assert plan.reader.offsets.tolist() == [0, 10, 25, 40, 0, 5, 20]
    assert plan.reader.bases.tolist() == [0, 4]  # B's offsets start at entry 4
    assert [len(t) for t in plan.tokens] == [40, 20]


def test_integer_tokens_into_a_narrower_integer_dtype_are_read_column_wise():
    plan = plan_of(zj.Dataset.source(A).pack(32, dtypes={"tokens": np.int16}).batch(4))
    assert plan is not None  # the gather checks every token against int16's bounds


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: zj.Dataset.source(A).map(lambda r: r).pack(32), id="map"),
        pytest.param(lambda: zj.Dataset.source(A).pack(32).map(lambda r: r), id="map after"),
        pytest.param(lambda: zj.Dataset.source(A).pack(8), id="documents longer than rows"),
        pytest.param(lambda: zj.Dataset.source(A).split(4).split(8).pack(32), id="two splits"),
        pytest.param(
            lambda: zj.Dataset.source(TokenArray(np.ones(40, np.float32), [0, 10, 40])).pack(32),
            id="float tokens",
        ),
        pytest.param(
            lambda: zj.Dataset.source(
                tuple({"tokens": np.arange(5, dtype=np.int32)} for _ in range(10))
            ).pack(32),
            id="records in a tuple",
        ),
        pytest.param(
            lambda: zj.Dataset.source(LIST[:3] + [{"tokens": [1, 2]}]).pack(32),
            id="a list record without an array",
        ),  # fmt: skip
        pytest.param(
            lambda: zj.Dataset.source(LIST[:2] + [{"tokens": np.ones(3), "x": 1}]).pack(32),
            id="a list record of two fields",
        ),
        pytest.param(
            lambda: zj.Dataset.source(LIST + [{"tokens": np.ones(3, np.int64)}]).pack(32),
            id="a list record of another dtype",
        ),
        pytest.param(
            lambda: zj.Dataset.source([{"tokens": np.ones(3, np.float32)}]).pack(32),
            id="a list of float tokens",
        ),
        pytest.param(
            lambda: zj.Dataset.source(LIST + [{"tokens": np.arange(8, dtype=np.int32)[::2]}]).pack(
                32
            ),
            id="a list record of a strided array",
        ),
        pytest.param(
            lambda: zj.Dataset.source(TokenArray(np.arange(80, dtype=np.int32)[::2], [0, 40])).pack(
                64
            ),
            id="a strided token array",
        ),
        pytest.param(
            lambda: zj.Dataset.source(TokenArray(np.arange(40, dtype=">i4"), [0, 40])).pack(64),
            id="a big-endian token array",
        ),
        pytest.param(
            lambda: zj.Dataset.source([{"tokens": np.arange(8, dtype=">i4")}]).pack(32),
            id="a list of big-endian tokens",
        ),
    ],
)
def test_other_pipelines_take_the_general_path(build):
    assert plan_of(build().batch(4)) is None


def test_a_list_of_one_field_records_is_read_column_wise_where_it_lies():
    plan = plan_of(zj.Dataset.source(LIST).split(4).pack(8).batch(2))
    assert plan is not None and (plan.stage, plan.cut, plan.field) == (1, 4, "tokens")
    assert plan.reader.offsets.tolist() == [0, 3, 3, 10] and plan.reader.bases.tolist() == [0]
    (flat,), at = plan.reader.materialize([4, 0, 3], [2, 3, 4], None)  # pieces of 7 and 3
    pieces = [flat[a : a + n].tolist() for a, n in zip(at.tolist(), [2, 3, 4])]
    assert pieces == [[701, 702], [300, 301, 302], [700, 701, 702, 703]]


def test_big_endian_tokens_give_the_batches_of_native_ones():
    """Tokens in a non-native byte order (read from a file as ``>i4``, say) take the
    general path and give the same batches as the same tokens in native order."""
    tokens = np.arange(1, 101, dtype=np.int32)

    def first_batches(dtype):
        ta = TokenArray(tokens.astype(dtype), [0, 30, 100])
        listed = [{"tokens": tokens[:30].astype(dtype)}, {"tokens": tokens[30:].astype(dtype)}]
        return [
            next(iter(zj.Loader(zj.Dataset.source(src).shuffle(2).split(16).pack(16).batch(2))))
            for src in (ta, listed)
        ]

    for got, want in zip(first_batches(">i4"), first_batches(np.int32)):
        assert got.keys() == want.keys()
        for key in want:
            assert got[key].dtype == want[key].dtype
            np.testing.assert_array_equal(got[key], want[key])
