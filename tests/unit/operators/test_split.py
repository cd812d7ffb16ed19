"""``split``: the pieces of a record (bounds by hand), which fields are cut, the fast path
of ``step_block``, ``remake`` and ``trace`` of a piece, and the errors for bad records;
made through the functional contract without carry (saved as ``Saved((), None)``)."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_jax.core.lineage import Element
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.operators.base import Saved, StepFailed, fold_steps
from zephon_jax.operators.contract import ContractOperator
from zephon_jax.operators.split import SplitOperator


def _record(n):
    return {
        "tokens": np.arange(n),
        "mask": [i % 2 for i in range(n)],
        "pairs": np.arange(2 * n).reshape(n, 2),
        "other": np.arange(3) + 100,  # another length: copied
        "name": "doc",
    }


def _plain(piece):
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in piece.items()}


def test_a_record_of_ten_cut_at_four_gives_three_pieces():
    op = SplitOperator(4)
    _, out = op.step(None, Element(_record(10), 5))
    assert [e.lineage for e in out] == [((5,), 0), ((5,), 1), ((5,), 2)]
    bounds = [(0, 4), (4, 8), (8, 10)]
    for element, (start, stop) in zip(out, bounds):
        piece = _plain(element.data)
        assert piece["tokens"] == list(range(start, stop))
        assert piece["mask"] == [i % 2 for i in range(start, stop)]
        assert piece["pairs"] == [[2 * i, 2 * i + 1] for i in range(start, stop)]
        assert piece["other"] == [100, 101, 102]
        assert piece["name"] == "doc"


@pytest.mark.parametrize("n, pieces", [(0, 0), (1, 1), (4, 1), (5, 2), (8, 2), (9, 3)])
def test_a_record_of_n_items_emits_ceil_n_over_max_len_pieces(n, pieces):
    assert len(SplitOperator(4).pieces({"tokens": np.arange(n)})) == pieces


def test_a_record_that_fits_passes_as_it_is():
    data = _record(3)
    op = SplitOperator(4)
    assert op.pieces(data)[0] is data
    _, out = op.step_block(None, [Element(data, 1), Element(_record(6), 2)])
    assert out[0].data is data and out[0].lineage == ((1,), 0)
    assert [e.lineage for e in out[1:]] == [((2,), 0), ((2,), 1)]
    assert out[2].data["tokens"].tolist() == [4, 5]


def test_remake_gives_the_same_piece():
    op = SplitOperator(4)
    data = _record(10)
    for j, piece in enumerate(op.pieces(data)):
        assert _plain(op.remake(j, [data])) == _plain(piece)
    small = _record(2)
    assert op.remake(0, [small]) is small


@pytest.mark.parametrize("recipe", [3, -1, "1", 1.0])
def test_remake_refuses_pieces_the_record_has_not(recipe):
    with pytest.raises(StateError, match="cuts into 3 pieces; the state was altered"):
        SplitOperator(4).remake(recipe, [_record(10)])


def test_trace_maps_a_span_of_a_piece_to_its_record():
    op = SplitOperator(4)
    assert op.trace(2, ("r",), 1, 2) == [("r", 9, 10, None)]
    assert op.trace(1, ("r",), 0, None) == [("r", 4, 8, None)]
    assert op.trace(1, ("r",), None, None) == [("r", None, None, None)]


def test_bad_records_and_arguments_are_refused():
    with pytest.raises(PipelineError, match=r"split\(key='tokens'\) needs records that are dicts"):
        SplitOperator(4).step(None, Element({"text": "a"}, 0))
    with pytest.raises(PipelineError, match="pass key= naming the sequence field"):
        SplitOperator(4).pieces([1, 2])
    with pytest.raises(PipelineError, match=r"needs a 1-D 'tokens'; got shape \(2, 2\)"):
        SplitOperator(4).pieces({"tokens": np.zeros((2, 2))})
    with pytest.raises(PipelineError, match=r"split\(max_len\) needs a positive int"):
        SplitOperator(0)


def test_key_names_the_field_to_cut():
    op = SplitOperator(2, key="ids")
    pieces = op.pieces({"ids": [1, 2, 3], "tokens": np.arange(3)})
    assert [p["ids"] for p in pieces] == [[1, 2], [3]]
    assert [p["tokens"].tolist() for p in pieces] == [[0, 1], [2]]
    assert op.describe() == "split(max_len=2, key='ids')"


def test_split_is_made_through_the_contract_without_carry():
    op = SplitOperator(8, key="ids")
    assert isinstance(op, ContractOperator) and op.name == "split" and not op.user_code
    assert (op.cuts_records, op.cut_key, op.may_pack, op.passthrough) == (8, "ids", False, False)
    assert op.init(3) is None
    assert op.carry_bound() == "none (pieces are emitted at once)"


def test_step_block_is_the_fold_of_step():
    op = SplitOperator(4)
    elements = [Element(_record(n), p) for p, n in enumerate([3, 0, 10, 4, 5, 1])]
    elements.append(Element({"tokens": np.arange(2), "name": "x"}, 6))  # no quick pass
    carry, want = fold_steps(op.step, None, elements)
    got = op.step_block(None, elements)[1]
    assert carry is None and [e.lineage for e in got] == [e.lineage for e in want]
    assert [_plain(e.data) for e in got] == [_plain(e.data) for e in want]
    bad = Element({"text": "a"}, 9)
    with pytest.raises(StepFailed) as failed:
        op.step_block(None, elements[:3] + [bad])
    assert failed.value.index == 3 and len(failed.value.outputs) == 4


def test_the_saved_form_is_no_carry_as_before():
    op = SplitOperator(4)
    assert op.save(op.init(0)) == Saved((), None)
    assert op.load(op.save(None), 2) is None


@pytest.mark.parametrize("saved", [Saved((Element(_record(2), 0),), None), Saved((), 5)])
def test_load_refuses_a_saved_carry_it_cannot_have(saved):
    with pytest.raises(StateError, match="it has no carry: the state was altered"):
        SplitOperator(4).load(saved, 0)
