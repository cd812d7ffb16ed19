"""``pack(method="concat")``: rows of exactly ``seq_len`` cut across records (contents
and lineages by hand), ``max_segments``, the last row on flush, the saved carry and its
checks, ``remake`` and ``trace`` of a row; made through the functional contract, its
``step`` leaves the carry it was given as it was and ``step_block`` is the fold of it."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_jax.core.lineage import Element
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.operators import ConcatPackOperator
from zephon_jax.operators.base import Saved, StepFailed, fold_steps
from zephon_jax.operators.concat import ConcatRow
from zephon_jax.operators.contract import ContractOperator, check_carry

A = {"tokens": np.array([1, 2, 3], np.int32)}
B = {"tokens": np.array([4, 5, 6, 7, 8, 9], np.int32)}


def _row(element):
    return {k: np.asarray(v).tolist() for k, v in dict(element.data).items()}


def _feed(op, records):
    carry, rows = op.init(0), []
    for position, data in enumerate(records):
        carry, out = op.step(carry, Element(data, position))
        rows += out
    return carry, rows


def test_rows_are_cut_across_records_at_seq_len():
    op = ConcatPackOperator(4)
    carry, rows = _feed(op, [A, B])
    assert [_row(r) for r in rows] == [
        {
            "tokens": [1, 2, 3, 4],
            "tokens_segment_ids": [1, 1, 1, 2],
            "tokens_positions": [0, 1, 2, 0],
        },
        {
            "tokens": [5, 6, 7, 8],
            "tokens_segment_ids": [1, 1, 1, 1],
            "tokens_positions": [0, 1, 2, 3],  # positions restart at 0 for each piece
        },
    ]
    # each row is derived from its records with their (start, stop) bounds as recipe
    assert [r.lineage for r in rows] == [((0, 1), ((0, 3), (0, 1))), ((1,), ((1, 5),))]
    # the tail [9] stays open; flush pads it to seq_len
    flushed, last = op.flush(carry)
    assert [_row(r) for r in last] == [
        {
            "tokens": [9, 0, 0, 0],
            "tokens_segment_ids": [1, 0, 0, 0],
            "tokens_positions": [0, 0, 0, 0],
        }
    ]
    assert last[0].lineage == ((1,), ((5, 6),))
    assert op.flush(flushed)[1] == []  # emptied
    assert op.save(carry).aux == ((5, 6),)  # the carry flushed is left as it was


def test_max_segments_closes_a_row_early():
    op = ConcatPackOperator(8, max_segments=2)
    one = {"tokens": np.array([7], np.int32)}
    _, rows = _feed(op, [one, one, one])
    assert len(rows) == 1
    assert _row(rows[0])["tokens"] == [7, 7, 0, 0, 0, 0, 0, 0]
    assert _row(rows[0])["tokens_segment_ids"] == [1, 2, 0, 0, 0, 0, 0, 0]


def test_empty_records_emit_nothing_and_leave_no_carry():
    op = ConcatPackOperator(4)
    empty = op.init(0)
    carry, out = op.step(empty, Element({"tokens": np.zeros(0, np.int32)}, 0))
    assert carry is empty and out == []
    assert op.save(carry) == Saved()
    assert op.flush(carry) == (carry, [])


def test_records_with_other_fields_are_refused():
    op = ConcatPackOperator(8)
    carry, _ = op.step(op.init(0), Element(A, 0))
    with pytest.raises(PipelineError, match="every record must have the same fields"):
        op.step(carry, Element({"tokens": A["tokens"], "loss": A["tokens"]}, 1))


def test_saved_carry_loads_to_the_same_open_row():
    op = ConcatPackOperator(4)
    carry, _ = _feed(op, [A, B])
    saved = op.save(carry)
    assert [e.lineage for e in saved.held] == [1] and saved.aux == ((5, 6),)
    restored = op.load(Saved(saved.held, saved.aux), 0)
    _, rows = op.step(restored, Element({"tokens": np.array([10, 11, 12], np.int32)}, 2))
    assert _row(rows[0])["tokens"] == [9, 10, 11, 12]
    assert rows[0].lineage == ((1, 2), ((5, 6), (0, 3)))
    assert op.load(Saved(), 0) == op.init(0)


@pytest.mark.parametrize(
    "bounds", [((5,),), ((3, 3),), ((-1, 2),), ((0, 1), (1, 2)), [(5, 6)], None, ((5, "6"),)]
)
def test_load_refuses_altered_bounds(bounds):
    op = ConcatPackOperator(4)
    with pytest.raises(StateError, match="the state was altered"):
        op.load(Saved((Element(B, 1),), bounds), 3)


def test_recut_cuts_the_given_pieces_as_one_stream():
    op = ConcatPackOperator(4)
    c = Element({"tokens": np.array([10, 11, 12], np.int32)}, 2)
    pieces = [(Element(B, 1), 4, 6), (Element(A, 0), 1, 3), (c, 0, 3)]
    carry, rows = op.recut(op.init(0), pieces)
    assert [_row(r)["tokens"] for r in rows] == [[8, 9, 2, 3]]
    assert rows[0].lineage == ((1, 0), ((4, 6), (1, 3)))
    assert op.save(carry) == Saved((pieces[2][0],), ((0, 3),))
    # The open row continues after the pieces, as after any record.
    _, rows = op.step(carry, Element(A, 3))
    assert _row(rows[0])["tokens"] == [10, 11, 12, 1]
    # Recutting whole records is stepping over them.
    stepped = _feed(op, [A, B])
    recut = op.recut(op.init(0), [(Element(A, 0), 0, 3), (Element(B, 1), 0, 6)])
    assert [_row(r) for r in recut[1]] == [_row(r) for r in stepped[1]]
    saved, want = op.save(recut[0]), op.save(stepped[0])
    assert [e.lineage for e in saved.held] == [e.lineage for e in want.held] == [1]
    assert saved.aux == want.aux == ((5, 6),)


@pytest.mark.parametrize("span", [(0, 7), (3, 3), (-1, 2)])
def test_recut_refuses_pieces_outside_their_record(span):
    op = ConcatPackOperator(4)
    with pytest.raises(StateError, match="packed row piece"):
        op.recut(op.init(0), [(Element(B, 1), *span)])


def test_remake_rebuilds_a_row_from_its_records_and_bounds():
    op = ConcatPackOperator(4)
    _, rows = _feed(op, [A, B])
    recipe = rows[0].lineage[1]
    assert _row(Element(op.remake(recipe, [A, B]), None)) == _row(rows[0])
    with pytest.raises(StateError, match=r"packed row piece \(0, 7\) of a record of 6 items"):
        op.remake(((0, 7),), [B])


def test_trace_gives_each_piece_of_a_row():
    op = ConcatPackOperator(4)
    assert op.trace(((0, 3), (0, 1)), ("p", "q"), None, None) == [
        ("p", 0, 3, None),
        ("q", 0, 1, None),
    ]


def test_describe_and_carry_bound():
    op = ConcatPackOperator(4)
    assert op.describe().startswith("pack(seq_len=4, method='concat'")
    assert "1 open row of 4" in op.carry_bound()
    assert op.max_held == 4
    assert ConcatPackOperator(16, max_segments=3).max_held == 3


def _stream(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return [
        Element({"tokens": rng.integers(1, 100, int(k)).astype(np.int32)}, p)
        for p, k in enumerate(rng.integers(0, 11, n))
    ]


def _saved(op, carry):
    """The saved form with the held elements as lineages (what a state stores)."""
    held, aux = op.save(carry)
    return [e.lineage for e in held], aux


def _same_rows(got, want):
    assert [r.lineage for r in got] == [r.lineage for r in want]
    assert [_row(r) for r in got] == [_row(r) for r in want]


def test_concat_is_made_through_the_contract_with_an_immutable_carry():
    op = ConcatPackOperator(4)
    assert isinstance(op, ContractOperator) and op.name == "pack" and not op.user_code
    assert op.init(0) == ConcatRow(None, (), (), (), 0)
    carry, _ = _feed(op, [A, B])
    assert type(carry) is ConcatRow and carry.fill == 1 and carry.bounds == ((5, 6),)
    assert [e.lineage for e in carry.held] == [1] and carry.fields == ("tokens",)


@pytest.mark.parametrize("max_segments", [None, 2])
def test_step_leaves_the_carry_it_was_given_as_it_was(max_segments):
    op = ConcatPackOperator(8, max_segments=max_segments)
    carry = op.init(0)
    for element in _stream():
        before = _saved(op, carry)
        new, rows = op.step(carry, element)
        assert _saved(op, carry) == before  # the old carry did not change
        again, rows_again = op.step(carry, element)  # and steps the same way again
        _same_rows(rows_again, rows)
        assert _saved(op, again) == _saved(op, new)
        check_carry(new, op.template(), op.name)  # plain data the contract accepts
        carry = new
    before = _saved(op, carry)
    _, last = op.flush(carry)
    assert last and _saved(op, carry) == before
    _same_rows(op.flush(carry)[1], last)


@pytest.mark.parametrize("max_segments", [None, 3])
def test_step_block_is_the_fold_of_step(max_segments):
    op = ConcatPackOperator(8, max_segments=max_segments)
    elements = _stream()
    start, _ = _feed(op, [A])
    folded, want = fold_steps(op.step, start, elements)
    before = _saved(op, start)
    carry, got = op.step_block(start, elements)
    assert _saved(op, start) == before
    _same_rows(got, want)
    assert _saved(op, carry) == _saved(op, folded) and carry.fill == folded.fill


def test_step_block_names_the_failing_element_with_the_rows_before_it():
    op = ConcatPackOperator(4)
    bad = Element({"tokens": A["tokens"], "loss": A["tokens"]}, 2)
    with pytest.raises(StepFailed) as failed:
        op.step_block(op.init(0), [Element(A, 0), Element(B, 1), bad])
    assert failed.value.index == 2 and isinstance(failed.value.error, PipelineError)
    assert [r.lineage for r in failed.value.outputs] == [
        ((0, 1), ((0, 3), (0, 1))),
        ((1,), ((1, 5),)),
    ]
    assert _saved(op, failed.value.carry) == ([1], ((5, 6),))


def test_the_saved_form_round_trips_to_a_carry_that_steps_the_same():
    op = ConcatPackOperator(8, max_segments=3)
    elements = _stream()
    carry, _ = _feed(op, [e.data for e in elements[:7]])
    saved = op.save(carry)
    assert saved.held and len(saved.aux) == len(saved.held)
    loaded = op.load(Saved(saved.held, saved.aux), 5)
    assert op.save(loaded) == saved and loaded.fill == carry.fill
    _same_rows(fold_steps(op.step, loaded, elements[7:])[1], op.step_block(carry, elements[7:])[1])
    assert op.save(op.load(op.save(op.init(0)), 0)) == Saved()
