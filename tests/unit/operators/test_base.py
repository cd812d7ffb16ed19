"""The operator contract, operator by operator: init/step/flush, remake, and the saved form.

Every operator runs over the same synthetic input stream, once straight through
and once with its carry taken through the saved form (encoded with the codec,
decoded, held elements rebuilt from their lineages) at several cut points. The
outputs must be the same, derived outputs must equal ``remake`` of their inputs,
and a saved form must not change when the carry is stepped further.
"""

from __future__ import annotations

import functools
import signal
from contextlib import contextmanager

import numpy as np
import pytest
from pipelines import join_flush, join_init, join_make, join_step

import zephon_jax as zj
from zephon_jax.core.lineage import Element, Opaque, is_derived
from zephon_jax.engine.restore import set_lane_state
from zephon_jax.operators import (
    BinPackOperator,
    ConcatPackOperator,
    FlatMapOperator,
    SplitOperator,
    UserOperator,
    WindowShuffleOperator,
)
from zephon_jax.operators.base import Saved
from zephon_jax.operators.contract import lineage_operator, stateless
from zephon_jax.state import codec

# ----- operators under test -----------------------------------------------------------


def halves(record):
    tokens = record["tokens"]
    return [{"tokens": tokens[: len(tokens) // 2]}, {"tokens": tokens[len(tokens) // 2 :]}]


class RunningSum(zj.Operator):
    """A record-level user operator with a carry (stored by value)."""

    def init(self):
        return {"total": 0, "held": []}

    def step(self, carry, record):
        carry = {"total": carry["total"] + len(record["tokens"]), "held": carry["held"] + [record]}
        if len(carry["held"]) < 3:
            return carry, []
        out = {"tokens": np.concatenate([r["tokens"] for r in carry["held"]])}
        return {"total": carry["total"], "held": []}, [out]

    def flush(self, carry):
        if not carry["held"]:
            return carry, []
        return {"total": carry["total"], "held": []}, [
            {"tokens": np.concatenate([r["tokens"] for r in carry["held"]])}
        ]


class JoinShort(zj.LineageOperator):
    """A pointer-keeping user operator: joins records until ``min_len`` tokens."""

    def __init__(self, min_len: int):
        self.min_len = min_len
        self.max_held = min_len

    def init(self, lane):
        return ()

    def step(self, carry, element):
        carry = carry + (element,)
        if sum(len(e.data["tokens"]) for e in carry) < self.min_len:
            return carry, []
        return (), [zj.derive(self.remake(None, [e.data for e in carry]), carry)]

    def flush(self, carry):
        if not carry:
            return carry, []
        return (), [zj.derive(self.remake(None, [e.data for e in carry]), carry)]

    def remake(self, recipe, inputs):
        return {"tokens": np.concatenate([r["tokens"] for r in inputs])}

    def save(self, carry):
        return zj.Saved(held=carry)

    def load(self, saved, lane):
        return saved.held

    def describe(self):
        return f"JoinShort(min_len={self.min_len})"


class PointerIdentity(zj.LineageOperator):
    """A pointer-keeping user operator that passes every element through."""

    passthrough = True

    def step(self, carry, element):
        return carry, [element]


OPERATORS = {
    "split": lambda: SplitOperator(8),
    "flat_map": lambda: FlatMapOperator(halves),
    "stateless": lambda: stateless(halves),
    "pack_best_fit": lambda: BinPackOperator(48, "best_fit", 4),
    "pack_first_fit": lambda: BinPackOperator(48, "first_fit", 4),
    "pack_concat": lambda: ConcatPackOperator(32),
    "window_shuffle": lambda: WindowShuffleOperator(5, seed=3),
    "user_by_value": lambda: UserOperator(RunningSum()),
    "user_pointers": lambda: JoinShort(40),
    "user_passthrough": lambda: PointerIdentity(),
    "user_contract": lambda: lineage_operator(
        "join", join_init, functools.partial(join_step, 40), join_flush, join_make
    ),
}


def inputs(n: int = 60, seed: int = 0) -> list[Element]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 30, n)
    return [
        Element({"tokens": rng.integers(1, 1000, int(k)).astype(np.int32)}, p)
        for p, k in enumerate(lengths)
    ]


def run(op, elements, lane=0, cuts=()):
    """Outputs of ``op`` over ``elements``, restoring from the saved form before each cut."""
    by_lineage = {e.lineage: e for e in elements}
    carry, outputs = op.init(lane), []
    for i, element in enumerate(elements):
        if i in cuts:
            carry = round_trip(op, carry, by_lineage, lane)
        carry, out = op.step(carry, element)
        outputs += out
    carry, out = op.flush(carry)
    return outputs + list(out)


def round_trip(op, carry, by_lineage, lane):
    """The carry after its saved form went through bytes, as on a restore."""
    held, aux = op.save(carry)
    data = codec.encode((tuple(e.lineage for e in held), aux))
    lineages, aux = codec.decode(data)
    return op.load(Saved(tuple(by_lineage[lin] for lin in lineages), aux), lane)


def assert_same_element(a: Element, b: Element) -> None:
    if isinstance(b.lineage, Opaque):
        assert isinstance(a.lineage, Opaque)
    else:
        assert a.lineage == b.lineage
    assert_same_data(a.data, b.data)


def assert_same_data(a, b) -> None:
    assert sorted(a) == sorted(b)
    for key in b:
        assert a[key].dtype == b[key].dtype and a[key].tobytes() == b[key].tobytes(), key


@pytest.fixture(params=sorted(OPERATORS))
def op(request):
    return OPERATORS[request.param]()


# ----- the contract, per operator ----------------------------------------------------


def test_operator_follows_the_contract(op):
    assert isinstance(op, zj.LineageOperator)
    assert isinstance(op.describe(), str) and op.describe()
    assert isinstance(op.carry_bound(), str)


def test_outputs_survive_a_round_trip_of_the_carry_through_its_saved_form(op):
    elements = inputs()
    expected = run(op, elements)
    assert expected, "the stream must produce outputs for the test to mean anything"
    for cuts in [(1,), (7, 23), tuple(range(0, 60, 5)), tuple(range(60))]:
        got = run(op, elements, cuts=cuts)
        assert len(got) == len(expected), cuts
        for a, b in zip(got, expected):
            assert_same_element(a, b)


def test_derived_outputs_equal_remake_of_their_inputs(op):
    elements = inputs()
    by_lineage = {e.lineage: e.data for e in elements}
    derived = 0
    for out in run(op, elements):
        if op.passthrough:
            assert out.lineage in by_lineage
            assert out.data is not None
        elif not isinstance(out.lineage, Opaque):
            assert is_derived(out.lineage)
            parents, recipe = out.lineage
            assert_same_data(op.remake(recipe, [by_lineage[p] for p in parents]), out.data)
            derived += 1
    if not (op.passthrough or isinstance(op, UserOperator)):
        assert derived


def test_saved_form_is_plain_and_does_not_change_when_the_carry_steps_on(op):
    elements = inputs()
    carry = op.init(0)
    for element in elements[:17]:
        carry, _ = op.step(carry, element)
    held, aux = op.save(carry)
    before = codec.encode((tuple(e.lineage for e in held), aux))  # plain data, or it raises
    for element in elements[17:40]:
        carry, _ = op.step(carry, element)
    assert codec.encode((tuple(e.lineage for e in held), aux)) == before


def test_an_empty_carry_saves_and_loads(op):
    elements = inputs(seed=4)
    expected = run(op, elements, lane=2)
    carry = op.load(Saved(*codec.decode(codec.encode(tuple(op.save(op.init(2)))))), 2)
    got = []
    for element in elements:
        carry, out = op.step(carry, element)
        got += out
    got += op.flush(carry)[1]
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert_same_element(a, b)


# ----- pointers in lane states --------------------------------------------------------


def _docs(n=400, seed=0):
    rng = np.random.default_rng(seed)
    return [
        {"tokens": rng.integers(1, 50_000, int(k)).astype(np.int32)}
        for k in rng.integers(1, 500, n)
    ]


class ByValueIdentity(zj.Operator):
    def init(self):
        return None

    def step(self, carry, record):
        return carry, [record]


def _max_lane_state(ds, steps=12) -> int:
    it = iter(zj.Loader(ds))
    for _ in range(steps):
        next(it)
    return max(len(blob) for blob in it.get_state()["lanes"].values())


def test_pointer_keeping_identity_before_pack_keeps_lane_state_small():
    base = zj.Dataset.source(_docs()).shuffle(seed=1).repeat()
    plain = _max_lane_state(base.pack(512).batch(4))
    pointers = _max_lane_state(base.apply(PointerIdentity()).pack(512).batch(4))
    by_value = _max_lane_state(base.apply(ByValueIdentity()).pack(512).batch(4))
    assert pointers <= 2048
    assert pointers <= plain + 64  # a few bytes per operator, nothing per token
    assert by_value > 20 * pointers  # the documented by-value fallback stores records


def test_pointer_keeping_user_operator_resumes_bit_for_bit_on_other_topologies():
    from pipelines import assert_batches_equal, run_topology, take

    ds = (
        zj.Dataset.source(_docs(300))
        .shuffle(seed=2)
        .apply(JoinShort(300))
        .split(256)
        .pack(256, num_bins=4)
        .batch(8, num_lanes=4)
    )
    expected = take(iter(zj.Loader(ds)), 10)
    assert_batches_equal(run_topology(ds, 2, 10), expected)
    states = []
    for process in range(2):
        it = iter(zj.Loader(ds, process_index=process, process_count=2))
        take(it, 4)
        states.append(it.get_state())
    assert max(len(b) for b in states[0]["lanes"].values()) < 2048
    resumed = iter(zj.Loader(ds))
    resumed.set_state(zj.merge_states(states))
    assert_batches_equal(take(resumed, 6), expected[4:])


# ----- lanes that cannot make progress raise instead of hanging ---------------------


@contextmanager
def time_limit(seconds: int):
    """Fails the test instead of hanging the suite if the code under test loops."""

    def fail(signum, frame):
        raise TimeoutError(f"no error within {seconds} s: the lane loops forever")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _docs_of(lengths):
    return [{"tokens": np.arange(n, dtype=np.int32)} for n in lengths]


HANGS = {
    "filter_after_split": (
        lambda: zj.Dataset.source(_docs_of([10] * 8)).split(4).filter(lambda r: False),
        r"None got past operator 0 \(split",
    ),
    "flat_map_to_nothing": (
        lambda: zj.Dataset.source(_docs_of([10] * 8)).flat_map(lambda r: []),
        r"None got past operator 0 \(flat_map",
    ),
    "empty_tokens_into_pack": (
        lambda: zj.Dataset.source(_docs_of([0] * 8)).pack(16),
        r"None got past operator 0 \(pack",
    ),
    "empty_tokens_into_concat": (
        lambda: zj.Dataset.source(_docs_of([0] * 8)).pack(16, method="concat"),
        r"None got past operator 0 \(pack",
    ),
    "filter_after_pack": (
        lambda: zj.Dataset.source(_docs_of([3] * 8)).pack(4).filter(lambda r: False),
        r"None got past operator 0 \(pack",
    ),
}


@pytest.mark.parametrize("name", sorted(HANGS))
def test_a_lane_that_cannot_make_progress_raises(name):
    make, match = HANGS[name]
    with time_limit(60), pytest.raises(zj.RecordError, match="produced no row") as info:
        next(iter(zj.Loader(make().batch(2))))
    assert info.match(match)
    assert "wait forever" in str(info.value)


def test_a_slow_but_progressing_lane_does_not_raise():
    # Only the first piece of each record survives the filter after split: rows keep coming.
    ds = (
        zj.Dataset.source(_docs_of([8] * 100))
        .split(4)
        .filter(lambda r: int(r["tokens"][0]) == 0)
        .pack(4)
        .window_shuffle(3, seed=1)
        .batch(2)
    )
    with time_limit(60):
        batches = [b for b, _ in zip(zj.Loader(ds), range(5))]
    assert len(batches) == 5


# ----- the lane state is the saved form ------------------------------------------------


def test_a_restored_lane_saves_exactly_the_state_it_was_restored_from():
    from pipelines import full_pipeline

    from zephon_jax.engine.lane import Lane, LanePlan

    ds = (
        zj.Dataset.source(_docs(200))
        .shuffle(seed=5)
        .apply(JoinShort(200))
        .apply(RunningSum())
        .split(128)
        .pack(128, num_bins=3)
        .window_shuffle(3, seed=1)
        .batch(4, num_lanes=2)
    )
    for batched in (full_pipeline(), ds):
        plan = LanePlan(batched)
        lane = Lane(plan, 1)
        for _ in range(7):
            lane.take(batched.rows_per_lane)
        state = lane.get_state()
        restored = Lane(plan, 1)
        set_lane_state(restored, state)
        assert restored.get_state() == state
        for _ in range(5):
            assert_rows_equal(
                restored.take(batched.rows_per_lane), lane.take(batched.rows_per_lane)
            )


def assert_rows_equal(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert_same_data(a.data, b.data)
