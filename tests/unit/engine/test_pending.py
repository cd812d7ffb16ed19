"""A lane's rows made ahead: held as runs (``PendingRows``), made into elements when
taken (``TokenRowRun``), and gathered straight from the runs' arrays (``RunRows``)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from zephon_jax.core.lineage import Element
from zephon_jax.core.packed import PackSpec, assemble_rows
from zephon_jax.engine.pending import PendingRows
from zephon_jax.engine.rows import Picks
from zephon_jax.engine.token_rows import RunRow, RunRows, TokenRowRun, row_lineage
from zephon_jax.operators import token_bins
from zephon_jax.operators.token_bins import TokenRow

TOKENS = (np.arange(1000, 1100, dtype=np.int32), np.arange(2000, 2100, dtype=np.int32))
SPEC = PackSpec(8, {"tokens": np.int32})


def _run(codes, starts, lengths, leaves, ends, roots=None, several=True):
    pieces = np.array([codes, starts, lengths, leaves], np.int64)
    return TokenRowRun((SPEC, ("tokens",), TOKENS, None), pieces, several, ends, roots)


def _elements(n, tag):
    return [Element(f"{tag}{i}", (tag, i)) for i in range(n)]


def test_take_hands_out_rows_in_order_across_runs_of_both_kinds():
    run = _run([7, 8, 9], [0, 5, 9], [2, 3, 1], [0, 1, 0], [1, 3])
    pending = PendingRows(_elements(2, "a"))
    pending.extend(run)
    pending.extend(tuple(_elements(3, "b")))  # (any sequence of elements)
    pending.extend([])
    assert len(pending) == 7
    assert [e.lineage for e in pending.take(1)] == [("a", 0)]
    taken = pending.take(3)  # the last of the list, then both rows of the run
    assert [type(e) for e in taken] == [Element, RunRow, RunRow]
    assert [e.lineage for e in taken[1:]] == [((7,), (2,)), ((8, 9), (3, 1))]
    row = taken[2].data
    assert (row.begin, row.end) == (1, 3) and row.block.base is run.pieces
    assert len(pending) == 3
    assert pending.lineages() == (("b", 0), ("b", 1), ("b", 2))
    assert [e.data for e in pending] == ["b0", "b1", "b2"]  # iterating takes nothing
    assert len(pending.take(3)) == 3 and len(pending) == 0 and pending.take(0) == []
    with pytest.raises(IndexError, match="take\\(1\\) of 0 pending rows"):
        pending.take(1)


def test_drop_removes_rows_across_runs_and_front_names_the_first_left():
    run = _run([7, 8, 9], [0, 5, 9], [2, 3, 1], [0, 1, 0], [1, 2, 3])
    pending = PendingRows(_elements(2, "a"))
    pending.extend(run)
    pending.extend(_elements(1, "b"))
    assert pending.front()[1] == 0
    pending.drop(3)  # both elements, and the run's first row
    assert len(pending) == 3 and pending.front() == (run, 1)
    pending.drop(2)
    assert pending.front()[1] == 0 and [e.lineage for e in pending] == [("b", 0)]
    with pytest.raises(IndexError, match="drop\\(2\\) of 1 pending rows"):
        pending.drop(2)
    pending.drop(1)
    assert len(pending) == 0 and pending.front() == (None, 0)


def test_a_runs_lineages_are_kept_once_made_and_given_to_later_rows():
    """``lineages()`` (what a state saves) makes them once; rows taken after carry
    those same objects. A mixture run's lineages index the drawn roots of the placement."""
    roots = np.array([[40, 41, 42], [0, 1, 0], [5, 6, 7]], np.int64)  # (position, comp, draw)
    run = _run([1, 2, 0], [0, 3, 6], [3, 3, 2], [0, 0, 1], [2, 3], roots=(roots, 0, 0))
    pending = PendingRows()
    pending.extend(run)
    first, second = pending.lineages()
    assert first == (((41, 1, 6), (42, 0, 7)), (3, 3))
    assert second == (((40, 0, 5),), (2,))
    assert first == row_lineage(roots, 0, 0, run.pieces, 0, 2)
    taken = pending.take(2)
    assert taken[0].lineage is first and taken[1].lineage is second
    assert [element.recipe() for element in taken] == [(None, first), (None, second)]


def test_rows_made_ahead_are_one_object_per_run():
    run = _run(list(range(64)), list(range(64)), [1] * 64, [0] * 64, list(range(1, 65)))
    pending = PendingRows()
    gc.collect()
    before = len(gc.get_objects())
    pending.extend(run)
    assert len(pending) == 64 and len(gc.get_objects()) - before <= 2  # the deque's block


@pytest.mark.parametrize("several", [False, True])
def test_a_batch_of_run_rows_gathers_as_its_rows_do(several):
    """``RunRows`` gives the pieces and kind that the row objects give, and the gather
    of both is the same batch; Picks make the same lineages from the runs."""
    one = _run([1, 2, 3, 4], [0, 10, 20, 30], [3, 2, 4, 1], [0, 1, 1, 0], [2, 3, 4], None, several)
    two = _run([5, 6], [50, 60], [4, 4], [1, 0], [1, 2], None, several)
    two.kind = one.kind
    elements = [one.elements(2, 3)[0], two.elements(0, 2)[1], one.elements(0, 1)[0]]
    rows = RunRows.of(elements)
    assert rows is not None and RunRows.of(elements + [Element("x", 0)]) is None
    plain = [element.data for element in elements]
    assert [type(row) for row in rows] == [TokenRow] * 3 and len(rows) == 3
    assert rows.one_kind() and isinstance(rows, token_bins.GatheredRows)
    pieces, ends = rows.pieces()
    columns = [row.block[:, row.begin : row.end] for row in plain]
    assert pieces.tolist() == np.concatenate(columns, axis=1).tolist()
    assert ends.tolist() == [1, 2, 4]
    batch = TokenRow.assemble_batch(rows)  # by the kernel
    assert TokenRow.assemble_batch(plain) is None  # (a list: row by row)
    expected = assemble_rows(plain)  # the general assembly, row by row
    assert batch is not None and batch.keys() == expected.keys()
    for name, values in expected.items():
        np.testing.assert_array_equal(batch[name], values)
    picks = Picks([0, 1, 2], elements, rows)
    assert list(picks) == [
        (0, elements[0].lineage),
        (1, elements[1].lineage),
        (2, elements[2].lineage),
    ]
    assert picks[1] == (1, ((6,), (4,)))


def test_rows_of_other_kinds_are_not_gathered_as_one():
    one = _run([1], [0], [3], [0], [1])
    other = TokenRowRun(
        (PackSpec(8, {"tokens": np.int32}), ("tokens",), TOKENS, None), one.pieces, True, [1], None
    )
    rows = RunRows.of(one.elements(0, 1) + other.elements(0, 1))
    assert rows is not None and not rows.one_kind()
    assert TokenRow.gather_batch(rows) is None
