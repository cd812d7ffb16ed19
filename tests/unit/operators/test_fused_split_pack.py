"""``split`` right before ``pack`` runs fused (one loop): the same batches and states as the
two operators one after the other, whatever the records (fallbacks mid-block included)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from pipelines import assert_batches_equal, take

import zephon_jax as zj
from zephon_jax.core import lineage as lineage_module
from zephon_jax.core.lineage import held_lineage, piece_code
from zephon_jax.engine import lane as lane_module
from zephon_jax.operators.pack import BinPackOperator
from zephon_jax.state.global_state import lane_bytes


def _corpus(seed: int, odd: bool) -> list:
    """Lognormal-ish lengths, some longer than several rows, some empty; with ``odd``,
    records the fused loop does not take (other mappings) in between."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(400):
        n = int(min(rng.lognormal(3.0, 1.2), 400))
        if i % 37 == 0:
            n = 0
        tokens = rng.integers(1, 900, n).astype(np.int32)
        if odd and i % 7 == 5:
            docs.append(collections.OrderedDict(tokens=tokens))  # not a dict: taken by split
        else:
            docs.append({"tokens": tokens})
    return docs


def _unfused(monkeypatch) -> None:
    monkeypatch.setattr(lane_module, "_fused_with_next", lambda plan, stage: None)


def _pipeline(
    docs, method: str, max_len: int, num_lanes: int, max_segments=None, shuffle=True, num_bins=5
):
    ds = zj.Dataset.source(tuple(docs))  # records in a tuple: the general path, fused
    if shuffle:
        ds = ds.shuffle(seed=4)
    ds = ds.split(max_len)
    return ds.pack(48, method=method, num_bins=num_bins, max_segments=max_segments).batch(
        8, num_lanes=num_lanes
    )


def _run_with_states(ds, steps: int) -> tuple[list, list, object]:
    """Batches, and the bytes of every lane's state and the provenance after each."""
    it = iter(zj.Loader(ds))
    batches, states = [], []
    for _ in range(steps):
        batches.append(next(it))
        state = it.get_state()
        states.append(([lane_bytes(state, lane) for lane in range(ds.num_lanes)], it.provenance()))
    return batches, states, it


def _assert_fused_equals_unfused(monkeypatch, ds, steps: int) -> None:
    """Batches, lane states and provenance of ``steps`` steps are the same fused or not."""
    fused_batches, fused_states, _ = _run_with_states(ds, steps)
    with monkeypatch.context() as m:
        _unfused(m)
        batches, states, _ = _run_with_states(ds, steps)
    assert_batches_equal(fused_batches, batches)
    assert fused_states == states


CASES = [
    ("best_fit", 48, 2, None, 5),
    ("first_fit", 48, 4, None, 5),
    ("best_fit", 20, 8, 3, 5),  # pieces shorter than a row, at most 3 segments a row
    ("first_fit", 7, 1, None, 5),
    ("first_fit", 30, 2, None, 70),  # many bins: a vectorized first-fit scan
    ("best_fit", 48, 1, None, 70),
]


@pytest.mark.parametrize("method,max_len,num_lanes,max_segments,num_bins", CASES)
@pytest.mark.parametrize("odd", [False, True])
def test_fused_rows_and_states_equal_the_two_operators(
    monkeypatch, method, max_len, num_lanes, max_segments, num_bins, odd
):
    docs = _corpus(len(method) + max_len, odd)
    ds = _pipeline(docs, method, max_len, num_lanes, max_segments, num_bins=num_bins)
    assert any(lane_module.LanePlan(ds).fused), "split -> pack runs fused"
    fused_batches, fused_states, _ = _run_with_states(ds, 25)
    saved = _run_with_states(ds, 12)[2].get_state()
    with monkeypatch.context() as m:
        _unfused(m)
        assert not any(lane_module.LanePlan(ds).fused)
        batches, states, _ = _run_with_states(ds, 25)
    assert_batches_equal(fused_batches, batches)
    assert fused_states == states  # byte for byte, and the same provenance

    # A state taken while fused restores to the same batches, fused or not.
    want = batches[12:]
    for patched in (False, True):
        with monkeypatch.context() as m:
            if patched:
                _unfused(m)
            it = iter(zj.Loader(ds))
            it.set_state(saved)
            assert_batches_equal(take(it, 13), want)


def test_pieces_beyond_the_compact_form_keep_their_tuples(monkeypatch):
    """A record cut into more pieces than the compact lineage form holds keeps its pieces'
    lineages as tuples, with the same rows and states."""
    docs = [{"tokens": np.arange(1, n + 1, dtype=np.int32)} for n in (5, 90, 3, 61, 8)]
    ds = _pipeline(docs * 3, "best_fit", 7, 1, shuffle=False)
    monkeypatch.setattr(lineage_module, "PIECE_BITS", 2)
    monkeypatch.setattr(lineage_module, "PIECE_MASK", 3)
    monkeypatch.setattr(lineage_module, "MAX_PIECE", 3)  # at most 3 pieces coded
    _assert_fused_equals_unfused(monkeypatch, ds, 6)


def test_compact_piece_lineages_decode_exactly():
    for position, piece in [(0, 0), (1, 0), (0, 1), (2**40 + 3, 2**24 - 2), (123456789, 77)]:
        code = piece_code(position, piece)
        assert type(code) is int and code < 0
        assert held_lineage(code) == ((position,), piece)
    for lineage in (0, 7, ((3,), 1), (((1,), 0), (4,)), "x"):
        assert held_lineage(lineage) is lineage


def test_place_split_takes_nothing_before_the_carry_knows_its_field():
    op = BinPackOperator(16, "best_fit", num_bins=2)
    elements = [zj.Element({"tokens": np.ones(4, np.int32)}, 0)]
    assert op.place_split(None, elements, 16, "tokens") == (None, [], 0, 0)
    carry, _ = op.step_block(None, elements)
    assert op.place_split(carry, elements, 16, "text") == (carry, [], 0, 0)  # another field
    assert op.place_split(carry, elements, 32, "tokens") == (carry, [], 0, 0)  # too long
    new, rows, taken, empty = op.place_split(carry, elements * 3, 16, "tokens")
    assert (taken, empty) == (3, 0) and len(rows) == 1  # 4 + 4 + 4 + 4 = one full row
    assert new is not carry and op.save_lineages(carry) == ((0,), (1, 0))  # carry unchanged
    assert op.save_lineages(new) == ((), (0, 0))
    assert rows[0].lineage == ((0, ((0,), 0), ((0,), 0), ((0,), 0)), (4, 4, 4, 4))


def test_a_bad_record_fails_as_with_the_two_operators(monkeypatch):
    docs = [{"tokens": np.ones(n, np.int32)} for n in (5, 60, 9, 30)]
    docs[2] = {"tokens": [1, 2, 3]}  # a list: pack refuses it
    ds = _pipeline(docs, "best_fit", 48, 1, shuffle=False)
    errors = []
    for patched in (False, True):
        with monkeypatch.context() as m:
            if patched:
                _unfused(m)
            with pytest.raises(zj.PipelineError) as raised:
                next(iter(zj.Loader(ds)))
            errors.append(str(raised.value))
    assert errors[0] == errors[1] and "1-D numpy array" in errors[0]


def test_plain_lineage_writes_compact_parents_in_full():
    compact = ((piece_code(4, 0), 7, piece_code(9, 2), ((3,), 1)), (5, 6, 7, 8))
    assert lineage_module.plain_lineage(compact) == (
        (((4,), 0), 7, ((9,), 2), ((3,), 1)),
        (5, 6, 7, 8),
    )
    for lineage in (3, ((3,), 1), ((1, 2), (-1,)), (((2,), 0),), "x"):  # any other lineage
        assert lineage_module.plain_lineage(lineage) is lineage


@pytest.mark.parametrize("after", ["window_shuffle", "finite"])
def test_rows_going_on_to_another_operator_or_flushed_have_full_lineages(monkeypatch, after):
    """Rows that pack sends to another operator, and rows flushed when a finite input
    ends, carry their lineages in full: same batches and states as unfused."""
    docs = _corpus(5, odd=False)
    ds = zj.Dataset.source(docs)
    if after == "finite":
        ds = ds.repeat(1)
    ds = ds.shuffle(seed=2).split(30).pack(48, num_bins=4)
    if after == "window_shuffle":
        ds = ds.window_shuffle(3, seed=1)
    ds = ds.batch(4, num_lanes=2)
    # Compact row lineages only where pack is the last operator.
    assert lane_module.LanePlan(ds).fused[0][3] is (after == "finite")

    def run():
        it = iter(zj.Loader(ds))
        out = []
        for batch in it:
            state = it.get_state()
            out.append((batch, [lane_bytes(state, lane) for lane in range(2)], it.provenance()))
            if len(out) == 60:
                break
        return out

    fused = run()
    with monkeypatch.context() as m:
        _unfused(m)
        want = run()
    assert len(fused) == len(want) > 10
    assert_batches_equal([b for b, _, _ in fused], [b for b, _, _ in want])
    assert [s for _, s, _ in fused] == [s for _, s, _ in want]
    assert [p for _, _, p in fused] == [p for _, _, p in want]


def _halves(record):
    """Two records from each: the first and second half of its tokens."""
    tokens = record["tokens"]
    return [{"tokens": tokens[: len(tokens) // 2]}, {"tokens": tokens[len(tokens) // 2 :]}]


def test_pieces_of_derived_records_keep_their_tuples(monkeypatch):
    """Records made by an operator before split have derived lineages, which the fused
    loop keeps as the tuples split makes: same batches, states and provenance."""
    docs = _corpus(11, odd=False)
    ds = zj.Dataset.source(docs).shuffle(seed=1).flat_map(_halves).split(20).pack(48, num_bins=4)
    ds = ds.batch(4, num_lanes=2)
    assert lane_module.LanePlan(ds).fused[1] is not None
    _assert_fused_equals_unfused(monkeypatch, ds, 30)
