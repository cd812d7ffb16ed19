"""``TokenBins`` and ``TokenRow``: pack's open rows over token arrays, as int64 arrays, that
read back as the ``Bins`` of the general path (the same pieces, lineages and fills)."""

from __future__ import annotations

import pickle
import re
from types import SimpleNamespace

import numpy as np
import pytest

from zephon_jax.core import lineage
from zephon_jax.core.lineage import DrawPieceTable, piece_code
from zephon_jax.core.packed import PackSpec, assemble_rows
from zephon_jax.engine.column_sources import ArrayTokens
from zephon_jax.errors import StateError
from zephon_jax.operators.pack import Bins
from zephon_jax.operators.token_bins import (
    HeldPieces,
    SavedRows,
    TokenBins,
    TokenRow,
    value_bounds,
)

TOKENS = (np.arange(100, dtype=np.int32), np.arange(1000, 1050, dtype=np.int32))


def put(carry, row, pieces):
    """Puts ``pieces`` (code, start, length, leaf) into open row ``row``."""
    for m, piece in enumerate(pieces):
        carry.piece_array[:, row, m] = piece
    carry.count[row] = len(pieces)
    carry.fill[row] = sum(p[2] for p in pieces)


def test_a_new_carry_has_empty_rows_in_order():
    carry = TokenBins(3, TOKENS, "tokens", 0)
    assert carry.fill.tolist() == [0, 0, 0] and carry.count.tolist() == [0, 0, 0]
    assert carry.slots.tolist() == [0, 1, 2]
    assert carry.piece_array.shape == (4, 3, 8)


def test_growing_keeps_the_pieces():
    carry = TokenBins(2, TOKENS, "tokens", 0)
    put(carry, 1, [(7, 10, 3, 0)])
    carry.grow_rows()
    assert carry.piece_array.shape == (4, 2, 16)
    assert carry.piece_array[:, 1, 0].tolist() == [7, 10, 3, 0]
    carry.grow_out()
    assert carry.out.shape == (4, 64) and carry.row_end.shape == (64,)


def test_to_bins_gives_the_same_rows_in_the_order_bins_keeps_them():
    carry = TokenBins(3, TOKENS, "tokens", 0)
    put(carry, 0, [(5, 10, 3, 0)])
    put(carry, 2, [(7, 20, 2, 0), (9, 4, 4, 1)])
    carry.slots[:] = [2, 0, 1]  # row 2 first (first_fit moved the others' places)
    bins = carry.to_bins()
    assert isinstance(bins, Bins) and bins.fields == ("tokens",) and not bins.compact
    assert bins.lineages == ((7, 9), (5,), ())
    assert [bins.fill[i] for i in bins.slots] == [6, 3, 0]
    assert [p.tolist() for p in bins.pieces[0]] == [[20, 21], [1004, 1005, 1006, 1007]]
    assert [p.tolist() for p in bins.pieces[1]] == [[10, 11, 12]]
    assert bins.pieces[2] == []


def test_lineage_form_is_by_row_in_bins_order_and_cached_until_a_row_changes():
    carry = TokenBins(2, TOKENS, "tokens", 16)
    code = piece_code(4, 1)  # the second piece of the record at position 4
    put(carry, 1, [(code, 16, 5, 0)])
    carry.slots[:] = [1, 0]
    held, counts = carry.lineage_form()
    assert counts == (1, 0)
    assert tuple(held) == (((4,), 1),)  # decoded when read
    assert carry.lineage_form()[0] is held
    carry.put(1, piece_code(7, 0), 3)  # bin 1: row 0 here; putting drops the cached form
    held, counts = carry.lineage_form()
    assert counts == (1, 1) and tuple(held) == (((4,), 1), ((7,), 0))


def columnar_plan(cut):
    """A plan over one token array of documents [0, 10), [10, 25), [25, 40), [40, 100)."""
    offsets = np.array([0, 10, 25, 40, 100], np.int64)
    reader = ArrayTokens(TOKENS[:1], offsets, np.array([0], np.int64))
    packing = SimpleNamespace(spec=SimpleNamespace(seq_len=32))
    return SimpleNamespace(
        tokens=TOKENS[:1], field="tokens", cut=cut, reader=reader, drawn=False, packing=packing
    )


def records_of(positions):
    """Lane position p holds document p of the one leaf."""
    return np.zeros(len(positions), np.int64), np.asarray(positions, np.int64)


def test_adopt_turns_restored_bins_into_arrays_and_back():
    bins = Bins(2)
    bins.add(1, TOKENS[0][10:25], 1, 15)
    bins.add(1, TOKENS[0][25:40], 2, 15)
    carry = TokenBins.adopt(bins, 2, columnar_plan(0), 0, records_of)
    assert carry.count.tolist() == [0, 2] and carry.fill.tolist() == [0, 30]
    assert carry.piece_array[:, 1, :2].tolist() == [[1, 2], [10, 25], [15, 15], [0, 0]]
    back = carry.to_bins()
    assert back.lineages == ((), (1, 2)) and [back.fill[i] for i in back.slots] == [0, 30]


def test_adopt_places_split_pieces_at_their_cut():
    bins = Bins(1)
    bins.add(0, TOKENS[0][72:88], ((3,), 2), 16)  # piece 2 of document 3, cut every 16 tokens
    carry = TokenBins.adopt(bins, 1, columnar_plan(16), 0, records_of)
    code, start, length, leaf = carry.piece_array[:, 0, 0].tolist()
    assert (code, start, length, leaf) == (piece_code(3, 2), 40 + 2 * 16, 16, 0)


def test_adopt_of_nothing_is_empty_and_of_a_foreign_lineage_is_a_state_error():
    assert TokenBins.adopt(None, 2, columnar_plan(0), 0, records_of).count.tolist() == [0, 0]
    bins = Bins(1)
    bins.add(0, TOKENS[0][:4], ((3,), 2), 4)  # a split piece, in a pipeline without split
    with pytest.raises(StateError, match="lane 5: the state holds .* which this pipeline never"):
        TokenBins.adopt(bins, 1, columnar_plan(0), 5, records_of)


def test_a_token_row_reads_its_pieces_from_the_arrays():
    block = np.array([[3, 1], [2, 3], [0, 1]], np.int64)  # starts, lengths, leaves
    row = TokenRow(None, ("tokens",), TOKENS, block, 0, 2)
    assert [p.tolist() for p in row.pieces] == [[3, 4], [1001, 1002, 1003]]
    first_only = TokenRow(None, ("tokens",), TOKENS, block[:2], 0, 1)  # (no leaves)
    assert [p.tolist() for p in first_only.pieces] == [[3, 4]]


def test_rows_of_one_block_read_their_own_pieces_and_pickle_alone():
    block = np.array([[1, 3, 10, 20], [5, 2, 3, 4], [0, 1, 0, 1]])  # two rows of two pieces
    spec = PackSpec(16, "pack")
    first, second = (TokenRow(spec, ("tokens",), TOKENS, block, b, b + 2) for b in (0, 2))
    assert (first.starts, first.lengths, first.leaves) == ([1, 3], (5, 2), [0, 1])
    assert (second.starts, second.lengths, second.leaves) == ([10, 20], (3, 4), [0, 1])
    assert [p.tolist() for p in second.pieces] == [[10, 11, 12], [1020, 1021, 1022, 1023]]
    batch = assemble_rows([first, second])
    assert batch["tokens"][1, :7].tolist() == [10, 11, 12, 1020, 1021, 1022, 1023]
    assert batch["tokens_segment_ids"][0, :8].tolist() == [1] * 5 + [2] * 2 + [0]
    again = pickle.loads(pickle.dumps(second))
    assert again.block.tolist() == [[10, 20], [3, 4], [0, 1]] and (again.begin, again.end) == (0, 2)
    assert all(np.array_equal(again[k], second[k]) for k in second)


@pytest.mark.parametrize(
    "source, out, bounds",
    [
        (np.int32, np.int32, (0, -1)),  # always fits: no check
        (np.uint16, np.int32, (0, -1)),
        (np.int64, np.int32, (-(2**31), 2**31 - 1)),
        (np.int32, np.uint16, (0, 65535)),
        (np.uint32, np.int32, (-(2**31), 2**31 - 1)),
    ],
)
def test_value_bounds(source, out, bounds):
    assert value_bounds(np.dtype(source), np.dtype(out)) == bounds


def test_adopt_of_saved_rows_takes_lengths_from_the_documents_and_reads_nothing():
    # row 0: document 1 whole; row 1: piece 3 of document 3 (cut 16: tokens 88..100) and
    # piece 0 of document 2
    saved = SavedRows((((1,), 0), ((3,), 3), ((2,), 0)), (1, 2), 4)
    carry = TokenBins.adopt(saved, 2, columnar_plan(16), 0, records_of)
    assert carry.count.tolist() == [1, 2] and carry.fill.tolist() == [15, 12 + 15]
    assert carry.piece_array[1:3, 1, :2].tolist() == [[40 + 48, 25], [12, 15]]
    bins = Bins(2)  # what a restore that regenerates the records makes
    bins.add(0, TOKENS[0][10:25], ((1,), 0), 15)
    bins.add(1, TOKENS[0][88:100], ((3,), 3), 12)
    bins.add(1, TOKENS[0][25:40], ((2,), 0), 15)
    same = TokenBins.adopt(bins, 2, columnar_plan(16), 0, records_of)
    assert same.piece_array.tolist() == carry.piece_array.tolist()
    assert carry.lineage_form()[1] == same.lineage_form()[1] == (1, 2)


@pytest.mark.parametrize(
    "saved, error",
    [
        # piece 4 of a document of 60 tokens cut every 16: it has pieces 0..3
        (SavedRows((((3,), 4),), (1,), 9), "piece 4 of a document of 60 tokens"),
        (SavedRows((((3,), 0),), (1,), 3), "position 3, but the lane has read only"),
        # pieces 0 and 1 of document 3 (16 tokens each) and document 2 (15) in one row of 32
        (SavedRows((((3,), 0), ((3,), 1), ((2,), 0)), (3,), 4), "holds 47 tokens, more than"),
    ],
)
def test_adopt_of_saved_rows_refuses_what_the_pipeline_never_makes(saved, error):
    with pytest.raises(StateError, match=error):
        TokenBins.adopt(saved, 1, columnar_plan(16), 7, records_of)


@pytest.mark.parametrize(
    "cut, good, bad",
    [
        (16, ((1,), 0), ((3,), -1)),  # a negative piece number
        (16, ((1,), 0), ((3,), 1.5)),
        (16, ((1,), 0), ((True,), 0)),  # a bool is no position
        (16, ((1,), 0), ((3, 2), 0)),  # two parents
        (16, ((1,), 0), (3, 0)),
        (0, 1, 2.0),
        (0, 1, True),
        (0, 1, ((1,), 0)),  # a piece, in a pipeline without split
    ],
)
def test_adopt_names_the_one_foreign_lineage_among_many_checked_together(cut, good, bad):
    # The lineages are checked in passes over all of them; the error still names the one.
    saved = SavedRows((good,) * 40 + (bad,) + (good,) * 9, (50,), 9)
    with pytest.raises(StateError, match=r"lane 7: the state holds " + re.escape(repr(bad))):
        TokenBins.adopt(saved, 1, columnar_plan(cut), 7, records_of)


def drawn_records_of(roots):
    """A drawn root ``(p, component, draw)`` holds document p of the one leaf; the lane
    codes the roots 0, 1, ..."""
    assert roots.dtype == np.int64 and roots.shape == (len(roots), 3)
    return np.arange(len(roots)), np.zeros(len(roots), np.int64), roots[:, 0].copy()


DRAWN_ROWS = [[1, 0, 0, 0], [3, 1, 0, 3], [2, 0, 1, 0]]  # position, component, draw, piece


def test_adopt_of_saved_draw_pieces_as_a_table_equals_adopting_their_tuple():
    plan = SimpleNamespace(**{**vars(columnar_plan(16)), "drawn": True})
    table = DrawPieceTable(np.array(DRAWN_ROWS, np.int64))
    lineages = tuple(lineage.piece(lineage.draw(a, b, c), d) for a, b, c, d in DRAWN_ROWS)
    carry = TokenBins.adopt(SavedRows(table, (1, 2), 4), 2, plan, 0, drawn_records_of)
    same = TokenBins.adopt(SavedRows(lineages, (1, 2), 4), 2, plan, 0, drawn_records_of)
    assert carry.count.tolist() == [1, 2] and carry.fill.tolist() == [15, 12 + 15]
    assert carry.piece_array.tolist() == same.piece_array.tolist()


@pytest.mark.parametrize(
    "rows, next_position, error",
    [
        ([[1, 0, 0, 0], [3, 1, 0, -1]], 4, re.escape("holds (((3, 1, 0),), -1) in an open row")),
        ([[1, 0, 0, 0], [3, 1, 0, 3]], 3, "position 3, but the lane has read only"),
    ],
)
def test_adopt_of_a_table_refuses_what_its_tuple_is_refused_for(rows, next_position, error):
    plan = SimpleNamespace(**{**vars(columnar_plan(16)), "drawn": True})
    lineages = tuple(lineage.piece(lineage.draw(a, b, c), d) for a, b, c, d in rows)
    table = DrawPieceTable(np.array(rows, np.int64))
    for held in (table, lineages):
        with pytest.raises(StateError, match=error):
            TokenBins.adopt(SavedRows(held, (2,), next_position), 1, plan, 7, drawn_records_of)


def test_held_pieces_count_the_rows_of_all_lanes_at_once():
    # lane 0: row 0 holds pieces of 5 and 7 tokens, row 2 one of 4; lane 1: row 1 one of 9
    lane = np.array([0, 0, 0, 1])
    held = HeldPieces(lane, np.array([0, 0, 2, 1]), np.array([5, 7, 4, 9]), 3)
    assert held.counts.tolist() == [[2, 0, 1], [0, 1, 0]]
    assert held.fill.tolist() == [[12, 0, 4], [0, 9, 0]]
    assert held.slot.tolist() == [0, 1, 0, 0] and [held.most(0), held.most(1)] == [2, 1]
    assert held.parts([3, 1]) == [slice(0, 3), slice(3, 4)]
    held.check_fill(np.array([True, True]), 12, [4, 9])
    held.check_fill(np.array([False, True]), 10, [4, 9])  # lane 4's rows are not checked
    held.check_fill(np.array([False, False]), 1, [4, 9])
    with pytest.raises(StateError, match="lane 4: the state's open row 0 of pack holds 12 "):
        held.check_fill(np.array([True, True]), 8, [4, 9])
    with pytest.raises(StateError, match="lane 9: the state's open row 1 of pack holds 9 "):
        held.check_fill(np.array([False, True]), 8, [4, 9])
    with pytest.raises(StateError, match="open rows beyond the 2 of pack"):
        HeldPieces(lane, np.array([0, 0, 2, 1]), np.array([5, 7, 4, 9]), 2)
