"""Block stepping: ``step_block`` is exactly the fold of ``step`` (pack, split, the default
fold), pack's placement follows its rules (checked against a plain reference model), and a
lane pushing blocks of records gives the same bytes as one record at a time, across
resumes, with errors that still name the failing record."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from pipelines import assert_batches_equal, make_docs, resume_across, take

import zephon_jax as zj
import zephon_jax.engine.blocks as lane_blocks
from zephon_jax.core.lineage import Element
from zephon_jax.errors import PipelineError, RecordError
from zephon_jax.operators import BinPackOperator, FlatMapOperator
from zephon_jax.operators.base import StepFailed, fold_steps, step_block_of
from zephon_jax.operators.split import SplitOperator
from zephon_jax.operators.window_shuffle import WindowShuffleOperator

# ----- operators: step_block is the fold of step ------------------------------------


def _elements(n, max_len, seed, fields=("tokens",), empty_every=0):
    rng = np.random.default_rng(seed)
    out = []
    for p in range(n):
        k = 0 if empty_every and p % empty_every == 0 else int(rng.integers(1, max_len + 1))
        data = {f: rng.integers(1, 1000, k).astype(np.int32) for f in fields}
        out.append(Element(data, p))
    return out


def _cuts(n, rng):
    """Random block boundaries over ``n`` elements (blocks of 1 to 40)."""
    cuts, i = [], 0
    while i < n:
        j = min(n, i + int(rng.integers(1, 41)))
        cuts.append((i, j))
        i = j
    return cuts


def _fold(op, elements):
    carry, outputs, saved = op.init(0), [], []
    for element in elements:
        carry, out = op.step(carry, element)
        outputs += out
        saved.append(_saved(op, carry))
    return carry, outputs, saved


def _saved(op, carry):
    held, aux = op.save(carry)
    return tuple(e.lineage for e in held), aux


def _assert_same_outputs(got, want):
    assert [e.lineage for e in got] == [e.lineage for e in want]
    for a, b in zip(got, want):
        da, db = dict(a.data), dict(b.data)
        assert sorted(da) == sorted(db)
        for k in db:
            assert np.asarray(da[k]).tobytes() == np.asarray(db[k]).tobytes()


PACKS = {
    "best_fit": lambda: BinPackOperator(64, "best_fit", num_bins=5),
    "first_fit": lambda: BinPackOperator(64, "first_fit", num_bins=5),
    "best_fit_max_segments": lambda: BinPackOperator(64, "best_fit", num_bins=4, max_segments=3),
    "first_fit_many_bins": lambda: BinPackOperator(64, "first_fit", num_bins=80),
    "best_fit_many_bins": lambda: BinPackOperator(64, "best_fit", num_bins=80),
    "one_bin": lambda: BinPackOperator(64, "best_fit", num_bins=1, max_segments=2),
}


@pytest.mark.parametrize("name", sorted(PACKS))
@pytest.mark.parametrize("fields", [("tokens",), ("tokens", "mask")])
def test_pack_step_block_is_the_fold_of_step(name, fields):
    elements = _elements(700, 64, seed=len(name), fields=fields, empty_every=9)
    op = PACKS[name]()
    _, want, saved_want = _fold(op, elements)
    _, want_left = op.flush(_fold(op, elements)[0])
    rng = np.random.default_rng(1)
    carry, got = op.init(0), []
    for i, j in _cuts(len(elements), rng):
        carry, out = op.step_block(carry, elements[i:j])
        got += out
        assert _saved(op, carry) == saved_want[j - 1]  # the same carry after every block
    _assert_same_outputs(got, want)
    carry, left = op.flush(carry)
    _assert_same_outputs(left, want_left)
    # After a flush, and after a restore, blocks go on as one element at a time.
    more = _elements(200, 64, seed=9, fields=fields)
    flushed = op.flush(_fold(op, elements)[0])[0]
    restored = op.load(op.save(_fold(op, elements)[0]), 0)
    for start in (carry, restored):
        _, got = op.step_block(start, more)
        want = []
        base = flushed if start is carry else _fold(op, elements)[0]
        for e in more:
            base, out = op.step(base, e)
            want += out
        _assert_same_outputs(got, want)


def _reference_pack(lengths, seq_len, num_bins, method, max_segments=None):
    """The packing rules on plain lists: rows as lists of record indices, in emission order."""
    bins = [[] for _ in range(num_bins)]
    fill = [0] * num_bins
    rows = []
    for p, n in enumerate(lengths):
        if n == 0:
            continue
        room = seq_len - n
        fits = [i for i in range(num_bins) if fill[i] <= room]
        if method == "first_fit":
            i = fits[0] if fits else None
        else:  # the fullest bin that fits, the lowest of equals
            i = min(fits, key=lambda j: (-fill[j], j)) if fits else None
        if i is None:  # fits none: the fullest bin goes out
            i = min(range(num_bins), key=lambda j: (-fill[j], j))
            rows.append(bins[i])
            bins[i], fill[i] = [], 0
            if method == "first_fit":  # bins in opening order: the emptied one goes last
                i = _to_end(bins, fill, i)
        bins[i].append(p)
        fill[i] += n
        if fill[i] == seq_len or len(bins[i]) == max_segments:
            rows.append(bins[i])
            bins[i], fill[i] = [], 0
            if method == "first_fit":
                _to_end(bins, fill, i)
    rows += [b for b in bins if b]  # flush, in bin order
    return rows


def _to_end(bins, fill, i):
    bins.append(bins.pop(i))
    fill.append(fill.pop(i))
    return len(bins) - 1


@pytest.mark.parametrize("method", ["best_fit", "first_fit"])
@pytest.mark.parametrize("num_bins,max_segments", [(1, None), (3, None), (8, 2), (70, None)])
def test_pack_places_records_by_its_rules(method, num_bins, max_segments):
    rng = np.random.default_rng(num_bins)
    lengths = [int(n) for n in rng.integers(0, 50, 900)]
    lengths[::17] = [50] * len(lengths[::17])  # full rows at once
    elements = [Element({"tokens": np.full(n, p, np.int32)}, p) for p, n in enumerate(lengths)]
    op = BinPackOperator(50, method, num_bins=num_bins, max_segments=max_segments)
    carry, rows = op.step_block(op.init(0), elements)
    _, left = op.flush(carry)
    got = [list(e.lineage[0]) for e in rows + left]
    assert got == _reference_pack(lengths, 50, num_bins, method, max_segments)


def test_split_step_block_is_the_fold_of_step():
    rng = np.random.default_rng(3)
    elements = []
    for p in range(300):
        n = int(rng.integers(0, 100))
        data = {"tokens": np.arange(n, dtype=np.int32), "id": p}
        if p % 5 == 0:
            data = {"tokens": list(range(n)), "mask": np.ones(n, np.int8)}  # not the fast path
        elements.append(Element(data, p))
    op = SplitOperator(32)
    _, want, _ = _fold(op, elements)
    got = []
    for i, j in _cuts(len(elements), rng):
        got += op.step_block(None, elements[i:j])[1]
    assert [e.lineage for e in got] == [e.lineage for e in want]
    for a, b in zip(got, want):
        assert a.data.keys() == b.data.keys()
        assert np.array_equal(a.data["tokens"], b.data["tokens"])


def _repeat_by_length(record):
    """0, 1 or 2 outputs per record (a flat_map whose output count varies)."""
    k = len(record["tokens"]) % 3
    return [{"tokens": record["tokens"][::-1].copy()} for _ in range(k)]


@pytest.mark.parametrize(
    "make",
    [
        lambda: WindowShuffleOperator(7, seed=2),
        lambda: WindowShuffleOperator(1, seed=5),
        lambda: FlatMapOperator(_repeat_by_length),
    ],
)
def test_contract_operators_step_block_is_the_fold_of_step(make):
    op, rng = make(), np.random.default_rng(9)
    elements = _elements(300, 10, seed=6)
    want_carry, want, _ = _fold(op, elements)
    carry, got = op.init(0), []
    for i, j in _cuts(len(elements), rng):
        carry, out = op.step_block(carry, elements[i:j])
        got += out
    _assert_same_outputs(got, want)
    assert _saved(op, carry) == _saved(op, want_carry)
    _assert_same_outputs(op.flush(carry)[1], op.flush(want_carry)[1])


def test_a_failing_flat_map_element_is_named_with_the_outputs_before_it():
    def fails_on_7(record):
        if record["tokens"][0] == -7:
            raise ValueError("seven")
        return [record]

    elements = _elements(20, 5, seed=1)
    elements[7] = Element({"tokens": np.array([-7], np.int32)}, 7)
    with pytest.raises(StepFailed) as info:
        FlatMapOperator(fails_on_7).step_block(None, elements)
    assert info.value.index == 7 and str(info.value.error) == "seven"
    assert [e.lineage for e in info.value.outputs] == [((p,), 0) for p in range(7)]


def test_operators_without_step_block_are_folded():
    op = WindowShuffleOperator(4, seed=2)
    assert not hasattr(op, "step_block") or step_block_of(op) == op.step_block
    elements = _elements(100, 10, seed=4)
    _, want, _ = _fold(op, elements)
    carry, got = step_block_of(op)(op.init(0), elements)
    assert [e.lineage for e in got] == [e.lineage for e in want]


@pytest.mark.parametrize(
    "bad,error",
    [
        ({"tokens": np.zeros(65, np.int32)}, "seq_len=64"),
        ({"other": np.zeros(3, np.int32)}, "fields"),
        ([1, 2, 3], "dicts of 1-D arrays"),
        ({"tokens": np.zeros((2, 2), np.int32)}, "1-D"),
    ],
)
@pytest.mark.parametrize("method", ["best_fit", "first_fit"])
def test_a_failing_element_is_named_with_the_outputs_before_it(bad, error, method):
    elements = _elements(60, 64, seed=5)
    elements[41] = Element(bad, 41)
    op = BinPackOperator(64, method, num_bins=3)
    _, want, _ = _fold(op, elements[:41])
    with pytest.raises(StepFailed) as info:
        op.step_block(op.init(0), elements)
    assert info.value.index == 41 and error in str(info.value.error)
    assert isinstance(info.value.error, PipelineError)
    _assert_same_outputs(list(info.value.outputs), want)
    with pytest.raises(PipelineError, match=error):  # one at a time: the error itself
        _fold(op, elements)
    with pytest.raises(StepFailed) as info:  # the default fold says the same
        fold_steps(op.step, op.init(0), elements)
    assert info.value.index == 41


# ----- lanes: blocks give the same bytes as one record at a time ----------------------


@pytest.fixture
def one_at_a_time(monkeypatch):
    """Lanes push one record at a time (the per-element path)."""

    def apply():
        for name in ("BLOCK_PER_ROW", "MIN_BLOCK", "MAX_BLOCK"):
            monkeypatch.setattr(lane_blocks, name, 1)

    return apply


def _square_tokens(record):
    return {"tokens": record["tokens"] * 2}


def _long_enough(record):
    return len(record["tokens"]) % 4 != 0


def _pipelines():
    docs = make_docs(300, 300, seed=11)
    docs[7] = {"tokens": np.zeros(0, np.int32)}  # an empty record
    return {
        "split_best_fit": zj.Dataset.source(docs).shuffle(3).split(128).pack(128).batch(8),
        "rows_per_lane": zj.Dataset.source(docs)
        .shuffle(4)
        .split(96)
        .pack(96, method="first_fit", num_bins=6, max_segments=3)
        .batch(12, num_lanes=3),
        "filter_map_after_pack": zj.Dataset.source(docs)
        .filter(_long_enough)
        .split(64)
        .pack(64, num_bins=4)
        .map(_square_tokens)
        .window_shuffle(3, seed=1)
        .batch(4),
        "finite_flush": zj.Dataset.source(docs[:90]).repeat(2).split(100).pack(100).batch(4),
    }


@pytest.mark.parametrize("name", sorted(_pipelines()))
def test_block_lanes_give_the_same_batches_as_one_record_at_a_time(name, one_at_a_time):
    ds = _pipelines()[name]
    steps = 40
    blocks = (
        list(zj.Loader(ds))[:steps] if name == "finite_flush" else take(iter(zj.Loader(ds)), steps)
    )
    resumed = resume_across(ds, min(steps, len(blocks)), 7, 1, 2)
    one_at_a_time()
    ones = (
        list(zj.Loader(ds))[:steps] if name == "finite_flush" else take(iter(zj.Loader(ds)), steps)
    )
    assert_batches_equal(blocks, ones)
    assert_batches_equal(resumed, ones[7 : len(blocks)])


def test_lane_errors_name_the_record_as_one_at_a_time(one_at_a_time):
    docs = make_docs(200, 40, seed=2)
    docs[57] = {"tokens": np.zeros(90, np.int32)}  # too long for pack without split
    ds = zj.Dataset.source(docs).pack(64).batch(2)

    def message():
        with pytest.raises(PipelineError) as info:
            take(iter(zj.Loader(ds)), 200)
        return str(info.value)

    with_blocks = message()
    one_at_a_time()
    assert with_blocks == message()
    assert "record 57" in with_blocks and "90 items" in with_blocks


class _FailsOnSeven(zj.Operator):
    def init(self):
        return 0

    def step(self, carry, record):
        if int(record["tokens"][0]) == 7:
            raise ValueError("seven")
        return carry + 1, [record]


def test_user_operator_errors_name_the_record_as_one_at_a_time(one_at_a_time):
    docs = [{"tokens": np.full(5, i % 50, np.int32)} for i in range(400)]
    ds = zj.Dataset.source(docs).apply(_FailsOnSeven()).split(16).pack(16).batch(2)

    def message():
        with pytest.raises(RecordError) as info:
            take(iter(zj.Loader(ds)), 100)
        assert isinstance(info.value.__cause__, ValueError)
        return str(info.value)

    with_blocks = message()
    one_at_a_time()
    assert with_blocks == message()


def test_block_sizes():
    """8 records per row still needed, at least 32 and at most 128, doubling while blocks
    make no row; a block starts with at most about 32 rows' worth at the lane's rate."""
    assert [lane_blocks.first_block(m) for m in (1, 4, 5, 15, 16, 300)] == [
        32,
        32,
        40,
        120,
        128,
        128,
    ]
    assert lane_blocks.next_block(0, 1, grew=False) == 32  # the first block
    assert lane_blocks.next_block(32, 1, grew=False) == 64
    assert lane_blocks.next_block(64, 1, grew=False) == 128
    assert lane_blocks.next_block(128, 1, grew=False) == 128
    assert lane_blocks.next_block(128, 5, grew=True) == 40
    # The cap: about 32 rows' worth of records at the lane's rate so far.
    assert lane_blocks.block_cap(0, 0) == 2  # before the first row
    assert lane_blocks.block_cap(340, 100) == 109  # 3.4 records a row
    assert lane_blocks.block_cap(10, 500) == 1  # 50 rows a record: one at a time
    assert lane_blocks.block_cap(4000, 10) == 128
    assert lane_blocks.first_block(1, cap=2) == 2
    assert lane_blocks.next_block(0, 1, grew=False, cap=2) == 2
    assert lane_blocks.next_block(2, 1, grew=False, cap=2) == 4  # no row yet: doubling


def test_least_block_grows_with_few_lanes_within_a_bound_for_all_lanes():
    """32 records at least, up to 128 while all lanes' least blocks stay within 8,192."""
    assert [lane_blocks.min_block(n) for n in (1, 8, 64, 65, 128, 256, 1024)] == [
        128,
        128,
        128,
        126,
        64,
        32,
        32,
    ]
    assert lane_blocks.first_block(1, least=128) == 128
    assert lane_blocks.first_block(1, cap=54, least=128) == 54  # the cap still bounds it
    assert lane_blocks.next_block(128, 1, grew=True, least=128) == 128


@pytest.mark.parametrize("num_lanes, least", [(8, 128), (512, 32)])
def test_lanes_read_their_least_block_when_a_take_needs_a_row(monkeypatch, num_lanes, least):
    """A lane that needs one more row reads ``min_block(num_lanes)`` records (here below
    the cap: about 4 records a row), on the column-wise path and the general one."""
    sizes = []
    real = lane_blocks.next_block

    def spy(*args, **kwargs):
        sizes.append(real(*args, **kwargs))
        return sizes[-1]

    monkeypatch.setattr(lane_blocks, "next_block", spy)
    docs = make_docs(6000, 30, seed=5, min_len=2)
    for source in (zj.sources.TokenArray.from_documents([d["tokens"] for d in docs]), docs):
        sizes.clear()
        ds = zj.Dataset.source(source).split(64).pack(64).batch(num_lanes, num_lanes=num_lanes)
        take(iter(zj.Loader(ds)), 30)
        assert max(set(sizes), key=sizes.count) == least


@pytest.mark.parametrize("column_wise", [True, False])
def test_a_state_restores_exactly_under_other_block_sizes(monkeypatch, column_wise):
    """Rows do not depend on the blocks: a state saved with 32-record least blocks (as
    before ``min_block``) restores under 128-record ones, and back, with the
    uninterrupted run's batches."""
    docs = make_docs(3000, 40, seed=9)
    source = (
        zj.sources.TokenArray.from_documents([d["tokens"] for d in docs]) if column_wise else docs
    )
    ds = zj.Dataset.source(source).shuffle(2).split(64).pack(64).batch(8, num_lanes=8)
    expected = take(iter(zj.Loader(ds)), 30)
    for saved_with, restored_with in ((32, 128), (128, 32)):
        monkeypatch.setattr(lane_blocks, "MIN_BLOCK_FEW_LANES", saved_with)
        it = iter(zj.Loader(ds))
        take(it, 11)
        state = it.get_state()
        monkeypatch.setattr(lane_blocks, "MIN_BLOCK_FEW_LANES", restored_with)
        resumed = iter(zj.Loader(ds))
        resumed.set_state(state)
        assert_batches_equal(take(resumed, 19), expected[11:])


def _whole_files(count, seed):
    rng = np.random.default_rng(seed)
    return [
        {"tokens": rng.integers(1, 1000, int(n)).astype(np.int32)}
        for n in rng.integers(3000, 9000, count)
    ]


def _passages(record):
    """A file cut into passages of 20-200 tokens: many records, and rows, per file."""
    tokens = record["tokens"]
    cuts = np.cumsum(np.random.default_rng(len(tokens)).integers(20, 200, len(tokens) // 20))
    return [{"tokens": p} for p in np.split(tokens, cuts[cuts < len(tokens)]) if len(p)]


def test_a_lane_makes_few_rows_ahead_of_records_that_make_many_rows():
    """A file makes about 20 rows here: a lane reads one or two at a time once it has
    made rows (not 32), so its state holds a few dozen rows made ahead, not hundreds;
    the sizes come from the state, so a resumed run has the same batches and states."""
    ds = (
        zj.Dataset.source(_whole_files(300, 4)).shuffle(2).flat_map(_passages).pack(256, num_bins=2)
    )
    ds = ds.batch(4)
    it = iter(zj.Loader(ds))
    batches = take(it, 60)
    lanes = it._producer.lanes.values()
    assert max(len(lane.pending) for lane in lanes) <= 64
    state = it.get_state()
    assert max(v.nbytes for v in state["lanes"].values()) < 4096
    resumed = resume_across(ds, 60, 23, 1, 2)
    assert_batches_equal(resumed, batches[23:])
    again = iter(zj.Loader(ds))
    again.set_state(_state_at(ds, 23))
    take(again, 60 - 23)
    assert {k: v.tobytes() for k, v in again.get_state()["lanes"].items()} == {
        k: v.tobytes() for k, v in state["lanes"].items()
    }


def _state_at(ds, steps):
    it = iter(zj.Loader(ds))
    take(it, steps)
    return it.get_state()


def test_block_cap_rounds_the_rows_worth_up_and_next_block_starts_over_after_a_row():
    """32 rows' worth at 5 records per 3 rows is 53.3 records: 54, never fewer."""
    assert lane_blocks.block_cap(5, 3) == 54
    assert lane_blocks.block_cap(0, 3) == 1  # no record read yet for a row: at least one
    assert lane_blocks.first_block(7, cap=54) == 54  # 56 needed, capped
    # After a block that made a row, the next is a first block again (no doubling).
    assert lane_blocks.next_block(128, 2, grew=True) == 32
    assert lane_blocks.next_block(40, 2, grew=False) == 80


def test_draw_target_holds_whole_steps_of_the_stage_up_to_draw_ahead():
    """Rows a mixture lane holds after a take: its step's, then whole next steps while
    they are in the same stage and the total stays within ``min(ahead, n + step)``."""
    never = sys.maxsize

    def target(step, n, until, rows_at):
        return lane_blocks.draw_target(step, n, until, rows_at, 8)

    assert target(0, 1, never, lambda s: 1) == 1  # a new lane draws only its take
    assert target(3, 1, never, lambda s: 1) == 4
    assert target(20, 1, never, lambda s: 1) == 8
    assert target(20, 1, 23, lambda s: 1) == 3  # steps 20 to 22: a stage starts at 23
    assert target(20, 1, 21, lambda s: 1) == 1
    assert target(20, 3, never, lambda s: 3) == 6  # a third step would make 9
    assert target(20, 16, never, lambda s: 16) == 16
    assert target(20, 1, never, lambda s: 1 if s < 22 else 4) == 6  # 1 + 1 + 4 (ramp)
    assert lane_blocks.draw_target(20, 1, never, lambda s: 1, 16) == 16
    assert lane_blocks.draw_target(10, 1, never, lambda s: 1, 16) == 11  # n + step


def test_draw_target_with_the_same_rows_at_every_step_equals_stepping():
    """Given the rows of every step as an int (no ramp), the target is the one that
    stepping through ``rows_at`` gives."""
    never = sys.maxsize
    for step in range(0, 30):
        for n in (1, 2, 3, 8, 16):
            for until in (step + 1, step + 2, step + 5, never):
                for ahead in (8, 16):
                    stepped = lane_blocks.draw_target(step, n, until, lambda s, n=n: n, ahead)
                    assert lane_blocks.draw_target(step, n, until, n, ahead) == stepped


def test_draw_ahead_is_larger_with_few_lanes_and_bounded_for_all_lanes_together():
    """16 rows a lane up to 128 lanes (2048 rows in all), then fewer, never under 8."""
    ahead = lane_blocks.draw_ahead
    assert (lane_blocks.DRAW_AHEAD, lane_blocks.DRAW_AHEAD_MAX) == (8, 16)
    assert [ahead(n) for n in (1, 8, 64, 128, 200, 256, 1024, 10**6)] == [
        16,
        16,
        16,
        16,
        10,
        8,
        8,
        8,
    ]
