"""The one placement kernel (``compiled_kernels.place``), compiled and interpreted.

Every ``pack`` places with it: records (``Bins``) and token arrays (``TokenBins``).
Each case is worked by hand from the rules (best_fit: the fullest row with room, the
lowest of equals; first_fit: the first row with room in opening order; none with
room: the fullest row goes out, the lowest of equals; a row goes out once full or at
``max_segments``) and runs twice: compiled by numba, and as the same source
interpreted (every kernel it calls interpreted too).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from zephon_jax.core import compiled_kernels as ck
from zephon_jax.core.compiled_kernels import array_addresses
from zephon_jax.core.lineage import PIECE_BITS
from zephon_jax.operators import pack, token_bins
from zephon_jax.transforms.to_training import shifted

ROOT = Path(__file__).resolve().parents[3]
KERNELS = ("emit", "to_end", "best_row", "first_place", "fullest", "choose", "place_piece",
           "cut_piece", "place", "mix64", "pick_component", "pay_credits", "next_draw",
           "draw_place", "gather", "collect_pieces", "take_front", "span_runs",
           "span_addresses", "add_pieces", "source_epochs", "decode_codes", "prefetch_lane", "ahead_left", "drawable",
           "count_drawn", "kept_draws", "recode_draws", "_drawn_index", "draw_pieces",
           "_after_prefix", "_varint", "draw_rows", "_tuple_of")  # fmt: skip
P = 100  # the first document's lane position (its lineage code when taken whole)


@pytest.fixture(params=["compiled", "interpreted"])
def kernels(request, monkeypatch):
    """The kernels compiled, or all of them as their interpreted source."""
    if request.param == "interpreted":
        for name in KERNELS:
            monkeypatch.setattr(ck, name, ck.interpreted(getattr(ck, name)))
        assert not hasattr(ck.place, "py_func")
    else:
        assert ck.COMPILED and hasattr(ck.place, "py_func")
    return ck


def run(ck, lengths, seq_len, num_bins, best, max_segments=-1, cut=0, dtype=np.int64, cap=8,
        out_cap=64):  # fmt: skip
    """Places documents of ``lengths`` (positions P, P + 1, ...) into empty rows, growing
    as the kernel asks; returns the emitted rows' codes, the open rows' codes in bin
    order, the row each bin is, and the emitted pieces (code, start, length, leaf)."""
    state = SimpleNamespace(
        fill=np.zeros(num_bins, np.int64),
        count=np.zeros(num_bins, np.int64),
        pieces=np.zeros((4, num_bins, cap), np.int64),
        slots=np.arange(num_bins, dtype=np.int64),
        out=np.empty((4, out_cap), np.int64),
        row_end=np.empty(out_cap, np.int64),
    )
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(dtype)
    k = len(lengths)
    docs = (offsets, np.zeros(1, dtype), np.zeros(k, dtype), np.arange(k, dtype=dtype))
    positions = np.arange(P, P + k, dtype=np.int64)
    rows, pieces = [], []
    at = j = 0
    stops = []
    while True:
        at, j, n_out, n_rows, stop = ck.place(
            state.fill, state.count, state.pieces, state.slots, *docs, positions, at, j, cut,
            seq_len, max_segments, best, state.out, state.row_end, 0, 0,
        )  # fmt: skip
        begin = 0
        for end in state.row_end[:n_rows].tolist():
            rows.append(state.out[0, begin:end].tolist())
            pieces += state.out[:, begin:end].T.tolist()
            begin = end
        stops.append(int(stop))
        if stop == ck.DONE:
            break
        if stop == ck.OUT_FULL:
            state.out = np.empty((4, 2 * state.out.shape[1]), np.int64)
            state.row_end = np.empty(2 * state.row_end.shape[0], np.int64)
        else:
            grown = np.zeros((4, num_bins, 2 * state.pieces.shape[2]), np.int64)
            grown[:, :, : state.pieces.shape[2]] = state.pieces
            state.pieces = grown
    open_rows = [state.pieces[0, i, : state.count[i]].tolist() for i in state.slots]
    assert state.fill[state.slots].tolist() == [
        sum(state.pieces[2, i, : state.count[i]]) for i in state.slots
    ]
    return SimpleNamespace(
        rows=rows, open=open_rows, slots=state.slots.tolist(), pieces=pieces, stops=stops
    )


def test_best_fit_takes_the_fullest_row_with_room_first_fit_the_first(kernels):
    # 4 -> row 0; 7 fits only row 1; 2 fits both: best_fit the fuller (row 1), first_fit row 0.
    best = run(kernels, [4, 7, 2], 10, 2, True)
    assert best.rows == [] and best.open == [[P], [P + 1, P + 2]]
    first = run(kernels, [4, 7, 2], 10, 2, False)
    assert first.rows == [] and first.open == [[P, P + 2], [P + 1]]


def test_ties_go_to_the_lowest_row(kernels):
    # 6 -> row 0, 6 -> row 1 (rows 1 and 2 empty: the lower); 3 fits rows 0 and 1,
    # filled alike: best_fit takes row 0.
    got = run(kernels, [6, 6, 3], 10, 3, True)
    assert got.open == [[P, P + 2], [P + 1], []]


def test_a_full_row_goes_out_at_once_and_first_fit_moves_it_last(kernels):
    # 6 + 4 fill row 0 exactly: out. 3 then goes to the first row with room: best_fit
    # row 0 (rows by index), first_fit row 1 (row 0 moved after it).
    best = run(kernels, [6, 4, 3], 10, 2, True)
    assert best.rows == [[P, P + 1]] and best.open == [[P + 2], []] and best.slots == [0, 1]
    first = run(kernels, [6, 4, 3], 10, 2, False)
    assert first.rows == [[P, P + 1]] and first.open == [[P + 2], []] and first.slots == [1, 0]


def test_without_room_the_fullest_row_goes_out_the_lowest_of_equals(kernels):
    # 7, 7 in rows 0, 1; 5 fits neither: row 0 (the lower of two full alike) goes out
    # and 5 starts it again: best_fit in place, first_fit after row 1.
    best = run(kernels, [7, 7, 5], 10, 2, True)
    assert best.rows == [[P]] and best.open == [[P + 2], [P + 1]]
    first = run(kernels, [7, 7, 5], 10, 2, False)
    assert first.rows == [[P]] and first.open == [[P + 1], [P + 2]] and first.slots == [1, 0]
    # The fullest, not the first: 3 then 8 (row 1), 9 fits neither and row 1 goes out.
    fuller = run(kernels, [3, 8, 9], 10, 2, False)
    assert fuller.rows == [[P + 1]] and fuller.open == [[P], [P + 2]]


@pytest.mark.parametrize("best", [True, False])
def test_a_row_goes_out_at_max_segments(kernels, best):
    got = run(kernels, [1, 1, 1, 1, 1], 100, 2, best, max_segments=2)
    assert got.rows == [[P, P + 1], [P + 2, P + 3]] and got.open[0] + got.open[1] == [P + 4]


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
def test_the_document_arrays_may_be_any_integer_dtype(kernels, dtype):
    got = run(kernels, [6, 4, 3, 0, 9, 1], 10, 2, True, dtype=dtype)
    assert got.rows == [[P, P + 1], [P + 4, P + 5]] and got.open == [[P + 2], []]
    assert got.pieces == [[P, 0, 6, 0], [P + 1, 6, 4, 0], [P + 4, 13, 9, 0], [P + 5, 22, 1, 0]]


def test_cut_documents_go_in_pieces_with_their_piece_codes(kernels):
    # 10 tokens cut by 4: pieces 4, 4 (row 0 full: out) and 2.
    got = run(kernels, [10], 8, 2, True, cut=4)
    code = [~((P << PIECE_BITS) | j) for j in range(3)]
    assert got.pieces == [[code[0], 0, 4, 0], [code[1], 4, 4, 0]]
    assert got.open == [[code[2]], []]


def test_full_arrays_stop_the_kernel_and_it_goes_on_from_the_same_piece(kernels):
    want = run(kernels, [2, 2, 2, 6, 6, 2, 2, 2], 8, 1, True)
    grown = run(kernels, [2, 2, 2, 6, 6, 2, 2, 2], 8, 1, True, cap=1, out_cap=1)
    assert ck.ROW_FULL in grown.stops and ck.OUT_FULL in grown.stops
    assert (grown.rows, grown.open, grown.pieces) == (want.rows, want.open, want.pieces)
    assert want.rows == [[P, P + 1, P + 2], [P + 3], [P + 4, P + 5]]


def test_mix64_interpreted_over_arrays_equals_the_kernel_element_by_element(kernels):
    values = np.array([0, 1, 2**63, 2**64 - 1, 0x9E3779B97F4A7C15], np.uint64)
    whole = ck.interpreted(ck.mix64)(values)
    with np.errstate(over="ignore"):  # numpy scalars warn where they wrap, arrays do not
        assert whole.tolist() == [int(kernels.mix64(v)) for v in values]
    assert whole.tolist()[:2] == [0, 0x5692161D100B05E5]


def test_records_and_token_arrays_place_with_this_one_kernel():
    assert pack.place is ck.place
    assert issubclass(token_bins.TokenBins, pack.OpenRows) and issubclass(pack.Bins, pack.OpenRows)


def test_without_numba_the_same_source_runs_interpreted():
    """``ZEPHON_JAX_COMPILED=0``: the kernels are the plain functions, numba is not imported."""
    program = (
        "import sys; from zephon_jax.core import compiled_kernels as ck; "
        "from zephon_jax.operators import pack; "
        "print(ck.COMPILED, pack.place is ck.interpreted(ck.place), 'numba' in sys.modules)"
    )
    env = {**os.environ, "ZEPHON_JAX_COMPILED": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True", "False"]


def _place_all(place, fill, count, slots, lengths, seq_len, best, max_segments, cut):
    """One call of ``place`` over documents of ``lengths`` with room for everything."""
    k = len(lengths)
    pieces = np.zeros((4, len(fill), 64), np.int64)
    out, row_end = np.empty((4, 4096), np.int64), np.empty(4096, np.int64)
    offsets = [0, *np.cumsum(lengths).tolist()]
    docs = (offsets, [0], [0] * k, list(range(k)), list(range(P, P + k)))
    if not isinstance(fill, list):
        docs = tuple(np.array(d, np.int64) for d in docs)
    got = place(fill, count, pieces, slots, *docs, 0, 0, cut, seq_len, max_segments, best, out,
                row_end, 0, 0)  # fmt: skip
    assert got[4] == ck.DONE
    n_out, n_rows = got[2], got[3]
    held = [pieces[:, i, : count[i]].tolist() for i in slots]
    return out[:, :n_out].tolist(), row_end[:n_rows].tolist(), held, list(slots), list(fill)


@pytest.mark.parametrize("best", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_compiled_interpreted_and_interpreted_over_lists_agree(monkeypatch, best, seed):
    """Random documents: the compiled kernel, its source over arrays, and its source over
    lists (the records' path interpreted) leave the same rows and open rows."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 40, 300).tolist()
    args = (lengths, 32, best, int(rng.choice([-1, 3])), int(rng.choice([0, 8])))

    def arrays():
        return np.zeros(5, np.int64), np.zeros(5, np.int64), np.arange(5, dtype=np.int64)

    compiled = _place_all(ck.place, *arrays(), *args)
    for name in KERNELS:
        monkeypatch.setattr(ck, name, ck.interpreted(getattr(ck, name)))
    assert _place_all(ck.place, *arrays(), *args) == compiled
    assert _place_all(ck.place, [0] * 5, [0] * 5, list(range(5)), *args) == compiled
    assert len(compiled[1]) > 20  # rows came out


# ----- the mixture's draws -------------------------------------------------------------


def _arrays(*rows):
    return tuple(np.array(r, np.int64) for r in rows)


def test_the_largest_credit_is_picked_ties_by_rotation_ends_and_zero_weights_skipped(kernels):
    quanta, credits, next_sub, ends = _arrays([1, 1, 1], [5, 7, 7], [0, 0, 0], [-1, -1, -1])
    assert kernels.pick_component(quanta, credits, next_sub, ends, 0) == 1
    assert kernels.pick_component(quanta, credits, next_sub, ends, 2) == 2  # 2 comes first
    ends[1] = 0  # component 1 has no draws left
    assert kernels.pick_component(quanta, credits, next_sub, ends, 0) == 2
    quanta[2] = 0  # and component 2 no weight
    assert kernels.pick_component(quanta, credits, next_sub, ends, 0) == 0
    ends[0] = 0
    assert kernels.pick_component(quanta, credits, next_sub, ends, 0) == -1


def test_a_draw_pays_every_weighted_component_with_draws_left(kernels):
    quanta, credits, next_sub, ends = _arrays([1, 3, 2], [0, 0, 0], [1, 1, 4], [-1, 1, 4])
    # component 1 drew its last record (next_sub reached its end) and is still paid;
    # component 2 is past its end and is not
    kernels.pay_credits(quanta, credits, next_sub, ends, 1, 2)
    assert credits.tolist() == [2, 6 - 8, 0]
    assert int(credits.sum()) == 0


def _draw_case(kernels, lengths, quanta, by_tokens=True, excluded=(), chunk=3, seq_len=8,
               cut=0, wanted=3, drawn_cap=2, bins=2, append=False):  # fmt: skip
    """Runs ``draw_place`` over components whose draw ``s`` is their document ``s`` (of
    ``lengths[c][s]`` tokens, leaf ``c``), reading ``chunk`` draws ahead and growing
    what it asks for; returns the drawn (position, component, sub), the emitted rows'
    codes, the stops and the final credits. ``append``: each call writes after what the
    calls before wrote (the state's ``OUT_AT``, ``ROWS_AT`` and ``DRAWN_AT``), and
    growing keeps it, as a lane's accounting log and drawn roots do."""
    k = len(lengths)
    offsets = np.concatenate([[0], np.cumsum([n for ls in lengths for n in ls])]).astype(np.int64)
    bases = np.cumsum([0] + [len(ls) for ls in lengths[:-1]]).astype(np.int64)
    quanta, credits, next_sub = _arrays(quanta, [0] * k, [0] * k)
    ends = np.array([len(ls) for ls in lengths], np.int64)
    dry, dry_limit = np.zeros(k, np.int64), np.full(k, 100, np.int64)
    first, size = np.zeros(k, np.int64), np.zeros(k, np.int64)
    leaf, record, tokens = (np.zeros((k, 256), np.int64) for _ in range(3))
    fill, count, slots = np.zeros(bins, np.int64), np.zeros(bins, np.int64), np.arange(bins)
    pieces = np.zeros((4, bins, 1), np.int64)
    out, row_end = np.empty((4, 1), np.int64), np.empty(1, np.int64)
    keys = np.array(sorted((c << 40) | s for c, s in excluded), np.int64)
    state = np.zeros(ck.DRAW_STATE, np.int64)
    drawn = np.empty((3, drawn_cap), np.int64)
    log, rows, stops = [], [], []
    while True:
        stop, n_out, n_rows, n_drawn = kernels.draw_place(
            quanta, credits, next_sub, ends, 0, by_tokens, dry, dry_limit, 1 << 40, first, size,
            leaf, record, tokens, keys, offsets, bases, fill, count, pieces, slots, cut, seq_len,
            -1, True, out, row_end, wanted - len(rows), 1000, state, drawn,
        )  # fmt: skip
        stops.append(int(stop))
        at, begin = state[[ck.DRAWN_AT, ck.ROWS_AT]] if append else (0, 0)
        log += drawn[:, at:n_drawn].T.tolist()
        begin = int(row_end[begin - 1]) if begin else 0
        for end in row_end[(state[ck.ROWS_AT] if append else 0) : n_rows].tolist():
            rows.append(out[0, begin:end].tolist())
            begin = end
        if append:
            state[[ck.OUT_AT, ck.ROWS_AT, ck.DRAWN_AT]] = n_out, n_rows, n_drawn
        c = int(state[ck.COMPONENT])
        if stop == ck.NEED_AHEAD:
            s0 = int(next_sub[c])
            subs = np.arange(s0, min(s0 + chunk, ends[c]))
            first[c], size[c] = s0, len(subs)
            leaf[c, : len(subs)], record[c, : len(subs)] = c, subs
            tokens[c, : len(subs)] = [lengths[c][s] if by_tokens else 1 for s in subs]
        elif stop == ck.DRAWN_FULL:
            drawn = _doubled(drawn)
        elif stop == ck.OUT_FULL:
            out, row_end = _doubled(out), _doubled(row_end)
        elif stop == ck.ROW_FULL:
            grown = np.zeros((4, bins, 2 * pieces.shape[2]), np.int64)
            grown[:, :, : pieces.shape[2]] = pieces
            pieces = grown
        else:
            return SimpleNamespace(drawn=log, rows=rows, stops=stops, credits=credits.tolist(),
                                   state=state)  # fmt: skip


def _doubled(array):
    """``array`` with its last axis twice as long, its entries kept."""
    grown = np.empty((*array.shape[:-1], 2 * array.shape[-1]), array.dtype)
    grown[..., : array.shape[-1]] = array
    return grown


def test_draws_by_tokens_are_placed_one_by_one_until_the_rows_wanted(kernels):
    # component 0: documents of 2 tokens, component 1: of 1 token; equal token shares.
    # Credits (units of q = 1): draw 0 takes component 0 (tie, rotation 0): [-2, 2];
    # then 1, 1 ([-1, 1], [0, 0]); then 0 again, and so on: 0, 1, 1, 0, 1, 1, ...
    got = _draw_case(kernels, [[2] * 9, [1] * 9], [1, 1], seq_len=4, wanted=2, drawn_cap=1)
    assert [c for _, c, _ in got.drawn] == [0, 1, 1, 0, 1, 1]
    assert [p for p, _, _ in got.drawn] == list(range(6))
    assert [s for _, c, s in got.drawn if c == 1] == [0, 1, 2, 3]
    # Codes are the draws' indices: row 0 holds draws 0, 1, 2 (2 + 1 + 1 tokens: full),
    # row 1 draws 3, 4, 5.
    assert got.rows == [[0, 1, 2], [3, 4, 5]]
    assert got.stops[-1] == ck.ROWS_MADE
    assert {ck.NEED_AHEAD, ck.DRAWN_FULL, ck.OUT_FULL, ck.ROW_FULL} <= set(got.stops)
    assert got.credits == [0, 0]


def test_an_excluded_draw_moves_the_lane_on_unplaced_and_the_end_is_told(kernels):
    got = _draw_case(kernels, [[2, 2], [1, 1, 1]], [1, 1], excluded=[(1, 1)], wanted=9)
    subs = [(c, s) for _, c, s in got.drawn]
    assert (1, 1) not in subs and len(subs) == 4
    assert [p for p, _, _ in got.drawn] == [0, 1, 3, 4]  # position 2 was the excluded draw
    assert got.stops[-1] == ck.INPUT_END and int(got.state[ck.POSITION]) == 5


def test_by_records_each_draw_counts_one(kernels):
    got = _draw_case(kernels, [[5] * 4, [1] * 4], [1, 1], by_tokens=False, wanted=1, seq_len=8)
    assert [c for _, c, _ in got.drawn][:4] == [0, 1, 0, 1]


@pytest.mark.parametrize("seed", range(3))
def test_draw_place_equals_the_drawer_and_place_one_draw_at_a_time(kernels, seed):
    """The drawer's Python draws placed one by one with ``place`` give the same draws and
    rows as the kernel (split documents included)."""
    rng = np.random.default_rng(seed)
    lengths = [rng.integers(0, 30, 60).tolist(), rng.integers(1, 12, 60).tolist()]
    quanta = [int(q) for q in rng.integers(1, 5, 2)]
    got = _draw_case(kernels, lengths, quanta, seq_len=16, cut=8, wanted=12, bins=3)
    # the reference: pick, pay and place one draw at a time
    q, credits, next_sub = _arrays(quanta, [0, 0], [0, 0])
    ends = np.array([60, 60], np.int64)
    fill, count, slots = np.zeros(3, np.int64), np.zeros(3, np.int64), np.arange(3)
    pieces = np.zeros((4, 3, 64), np.int64)
    out, row_end = np.empty((4, 512), np.int64), np.empty(512, np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths[0] + lengths[1])]).astype(np.int64)
    bases = np.array([0, 60], np.int64)
    rows, drawn, n_out, n_rows = [], [], 0, 0
    while n_rows < 12:
        c = kernels.pick_component(q, credits, next_sub, ends, 0)
        s = int(next_sub[c])
        next_sub[c] += 1
        if lengths[c][s]:
            kernels.pay_credits(q, credits, next_sub, ends, c, lengths[c][s])
        drawn.append([len(drawn), c, s])
        one = np.array([c], np.int64), np.array([s], np.int64), np.array([len(drawn) - 1])
        _, _, n_out, n_rows, stop = kernels.place(
            fill, count, pieces, slots, offsets, bases, *one, 0, 0, 8, 16, -1, True, out,
            row_end, n_out, n_rows,
        )  # fmt: skip
        assert stop == ck.DONE
    begin = 0
    for end in row_end[:n_rows].tolist():
        rows.append(out[0, begin:end].tolist())
        begin = end
    assert got.drawn == drawn and got.rows == rows


@pytest.mark.parametrize("cut", [0, 8])
def test_draw_place_appends_after_the_pieces_rows_and_draws_already_written(kernels, cut):
    """Calls that write after what earlier calls wrote (a lane's accounting log and drawn
    roots) draw and place exactly what calls writing from the start do."""
    rng = np.random.default_rng(cut)
    lengths = [rng.integers(0, 30, 60).tolist(), rng.integers(1, 12, 60).tolist()]
    case = dict(seq_len=16, cut=cut, wanted=2, bins=3)
    fresh = _draw_case(kernels, lengths, [2, 1], **case)
    appended = _draw_case(kernels, lengths, [2, 1], append=True, **case)
    assert appended.drawn == fresh.drawn and appended.rows == fresh.rows
    assert appended.stops[-1] == fresh.stops[-1] == ck.ROWS_MADE and len(appended.rows) == 2
    assert ck.DRAWN_FULL in appended.stops and ck.OUT_FULL in appended.stops


def _gather(ck, pieces, seq_len, pad_id=None):
    """Gathers rows of ``pieces`` (per row, ``(start, length)`` spans of one token array)
    with the kernel: the packed fields, or the fields to_training makes (``pad_id``)."""
    tokens = (np.arange(100, 130, dtype=np.uint16),)
    flat = [p for row in pieces for p in row]
    starts, lengths = (np.array([p[i] for p in flat], np.int64) for i in (0, 1))
    row_end = np.cumsum([len(row) for row in pieces]).astype(np.int64)
    shape = (len(pieces), seq_len)
    dtype = np.int32 if pad_id is not None else np.int64
    values = np.full(shape, -1, dtype)
    segment_ids, positions = np.full(shape, -1, np.int32), np.full(shape, -1, np.int32)
    if pad_id is None:
        targets = loss_mask = np.empty((len(pieces), 0), np.int32)
    else:
        targets, loss_mask = np.full(shape, -1, np.int32), np.full(shape, -1, np.float32)
    addresses, like, _ = array_addresses(tokens, starts, None)
    fits = ck.gather(
        addresses, like, lengths, row_end, np.arange(seq_len, dtype=np.int32), 0, -1, values,
        segment_ids, positions, targets, loss_mask, 0 if pad_id is None else pad_id,
    )  # fmt: skip
    assert fits
    return values, segment_ids, positions, targets, loss_mask


def test_gather_writes_rows_and_fused_to_training_shifts_within_pieces(kernels):
    rows = [[(0, 3), (10, 2)], [(20, 1)]]  # tokens 100.., so span (s, n) is 100+s..
    values, segment_ids, positions, targets, loss_mask = _gather(kernels, rows, 6, pad_id=9)
    assert values.tolist() == [[100, 101, 102, 110, 111, 0], [120, 0, 0, 0, 0, 0]]
    assert segment_ids.tolist() == [[1, 1, 1, 2, 2, 0], [1, 0, 0, 0, 0, 0]]
    assert positions.tolist() == [[0, 1, 2, 0, 1, 0], [0, 0, 0, 0, 0, 0]]
    # A token's target is the next token of its piece; a piece's last token and padding
    # get the pad id and no loss.
    assert targets.tolist() == [[101, 102, 9, 111, 9, 9], [9, 9, 9, 9, 9, 9]]
    assert loss_mask.tolist() == [[1, 1, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0]]


@pytest.mark.parametrize("rows", [2, 3])
def test_collect_pieces_copies_each_rows_columns_from_its_own_array(kernels, rows):
    """Rows ``1..rows`` of columns ``[begins[r], ends[r])`` of the four-row array at
    ``addresses[r]`` (``widths[r]`` columns), one batch row after the other."""
    first = np.arange(4 * 5, dtype=np.int64).reshape(4, 5)  # value 5 * row + column
    second = 100 + np.arange(4 * 3, dtype=np.int64).reshape(4, 3)  # 100 + 3 * row + column
    addresses = np.array([ck.data_address(second), ck.data_address(first), 0], np.int64)
    addresses[2] = addresses[1]
    widths = np.array([3, 5, 5], np.int64)
    begins, ends = np.array([1, 0, 4], np.int64), np.array([3, 2, 4], np.int64)
    out = np.full((rows, 4), -1, np.int64)
    kernels.collect_pieces(addresses, widths, begins, ends, out)
    expected = [[104, 105, 5, 6], [107, 108, 10, 11], [110, 111, 15, 16]]
    assert out.tolist() == expected[:rows]


def test_take_front_takes_from_lanes_with_the_rows_left_and_names_the_others(kernels):
    """Lanes with ``n`` rows left in their first runs give their rows' places and owe
    them; the others are named, and their rows' columns left as they were."""
    first_bounds = np.array([0, 2, 5, 6, 9], np.int64)  # four rows
    second_bounds = np.array([0, 4, 7], np.int64)  # two rows
    table = np.zeros((ck.FRONT_TABLE, 3), np.int64)
    table[:, 0] = (1, 3, 0, 0, 1000, 9, ck.data_address(first_bounds))  # rows 1..3 left
    table[:, 1] = (1, 1, 2, 1, 2000, 7, ck.data_address(second_bounds))  # row 1 left
    table[ck.LEFT, 2] = 0  # nothing noted
    slots, offsets = np.array([1, 0, 2, 0, 2, 1], np.int64), np.array([0, 0, 0, 1, 1, 1])
    out = np.full((5, 6), -1, np.int64)
    slow = np.full(3, -1, np.int64)
    lanes = np.arange(3, dtype=np.int64)
    count = kernels.take_front(2, table, lanes, slots, offsets.astype(np.int64), out, slow)
    assert count == 2 and slow[:count].tolist() == [1, 2]
    # Lane 0's rows 1 and 2 (pieces [2, 5) and [5, 6)); the other lanes' columns untouched.
    assert out[:, 1].tolist() == [1, 2, 5, 1000, 9]
    assert out[:, 3].tolist() == [2, 5, 6, 1000, 9]
    assert (out[:, [0, 2, 4, 5]] == -1).all()
    assert table[:4, 0].tolist() == [3, 1, 2, 1]  # next, left, owed rows, owed steps
    assert table[:4, 1].tolist() == [1, 1, 2, 1] and table[ck.LEFT, 2] == 0
    # A second pass over lanes 1 and 2 alone, lane 1 noted with a new run: lane 0, which
    # took already, is left as it is.
    table[:, 1] = (0, 2, 0, 0, 3000, 7, ck.data_address(second_bounds))
    picked = np.array([0, 2, 4, 5])
    again = np.full((5, 4), -1, np.int64)
    only = np.array([1, 2], np.int64)
    count = kernels.take_front(
        2, table, only, slots[picked], offsets[picked].astype(np.int64), again, slow
    )
    assert count == 1 and slow[0] == 2
    assert again[:, 0].tolist() == [0, 0, 4, 3000, 7]
    assert again[:, 3].tolist() == [1, 4, 7, 3000, 7] and (again[:, 1:3] == -1).all()
    assert table[:4, 0].tolist() == [3, 1, 2, 1] and table[:4, 1].tolist() == [2, 0, 2, 1]


def test_ahead_left_is_the_fewest_draws_read_ahead_of_a_weighted_component_with_draws_left(
    kernels,
):
    """Components without a weight or past their end do not count; a next draw before
    the read-ahead counts as none read."""
    quanta = np.array([3, 0, 2, 5], np.int64)
    ends = np.array([-1, -1, 7, 40], np.int64)
    first, size = np.array([4, 0, 0, 20], np.int64), np.array([10, 0, 9, 16], np.int64)
    next_sub = np.array([10, 5, 7, 30], np.int64)  # 0: 4 left; 1: no weight; 2: ended; 3: 6
    assert kernels.ahead_left(quanta, next_sub, ends, first, size) == 4
    next_sub[3] = 33  # 3 left of component 3
    assert kernels.ahead_left(quanta, next_sub, ends, first, size) == 3
    next_sub[0] = 2  # before component 0's read-ahead
    assert kernels.ahead_left(quanta, next_sub, ends, first, size) == 0
    quanta[:] = 0
    assert kernels.ahead_left(quanta, next_sub, ends, first, size) == 1 << 62


def test_count_drawn_counts_each_piece_by_its_draw_leaf_epoch_and_component(kernels):
    """A mixture lane's logged pieces, coded by their draws' indices (whole, or piece
    ``j`` of one), are counted by the draw's component (its leaf), epoch and length."""
    roots = np.array([[50, 51, 52, 53], [0, 1, 0, 0], [4, 9, 7, 20]], np.int64)  # draws 10..13
    whole_10, first_11, second_11, whole_13 = 10, ck.piece_code(11, 0), ck.piece_code(11, 1), 13
    codes = np.array([whole_10, first_11, second_11, whole_13], np.int64)
    lengths = np.array([5, 7, 3, 2], np.int64)
    counts = np.zeros((3, 4), np.int64)
    counts[0, 3] = 5  # leaf 0 already delivered epoch 4
    stages = np.zeros(2, np.int64)
    leaf_of, sizes = np.array([0, 2], np.int64), np.array([10, 3], np.int64)
    kernels.count_drawn(counts, stages, codes, lengths, roots, 10, leaf_of, sizes, 1, 4)
    # Epochs (sub * 4 + 1) // size: draw 10 -> 1, draw 11 -> 12, draw 13 -> 8.
    assert counts.tolist() == [[7, 2, 2, 9], [0, 0, 0, 0], [10, 2, 1, 13]]
    assert stages.tolist() == [7, 10]
    indices, firsts = kernels.decode_codes(codes)
    assert indices.tolist() == [10, 11, 11, 13] and firsts.tolist() == [True, True, False, True]


def test_kept_draws_are_those_a_held_or_logged_piece_points_to_renumbered_in_order(kernels):
    """A lane's draws 10..15: open row 0 holds a piece of draw 13 (and a stale code past
    its count), row 1 draw 11 whole; the log holds piece 2 of draw 13 and draw 15. Those
    three draws are kept, in order, and the codes pointing to them are renumbered from
    ``first`` (pieces keep their numbers)."""
    pieces = np.zeros((4, 2, 3), np.int64)
    pieces[0, 0, :2] = [ck.piece_code(13, 0), 10]  # (10 is past row 0's count)
    pieces[0, 1, 0] = 11
    count = np.array([1, 1], np.int64)
    logged = np.array([ck.piece_code(13, 2), 15], np.int64)
    kept, rank = kernels.kept_draws(pieces, count, logged, 10, 6)
    assert kept.tolist() == [11, 13, 15]
    assert rank.tolist() == [-1, 0, -1, 1, -1, 2]
    codes = np.array([15, ck.piece_code(13, 2), 11, ck.piece_code(13, 0)], np.int64)
    recoded = kernels.recode_draws(codes, rank, 10, 40)
    assert recoded.tolist() == [42, ck.piece_code(41, 2), 40, ck.piece_code(41, 0)]
    assert codes.tolist()[0] == 15  # (a new array)


def test_draw_pieces_reads_the_codec_s_draw_pieces_until_one_is_not(kernels):
    """Three ``(((a, b, c),), d)`` as the state codec writes them (a negative int, a
    two-byte varint, an eight-byte one), then one whose varint is nine bytes long: the
    kernel reads the three and stops before the fourth, which the codec decodes in
    general. The same bytes cut anywhere: it stops before the piece cut. ``out`` full:
    it stops there."""
    from zephon_jax.state import codec

    values = [(((1, 0, 300),), -2), (((7, 1, 2**55 - 1),), 0), (((-(2**40), 5, 6),), 9)]
    last = (((2**60, 0, 1),), 0)
    data = codec.encode((*values, last))
    ends = np.cumsum([2] + [len(codec.encode(v)) for v in values]).tolist()  # 2: the header
    prefix = np.frombuffer(codec._DRAW_PIECE, np.uint8)
    out = np.zeros((8, 4), np.int64)
    k, pos = kernels.draw_pieces(np.frombuffer(data, np.uint8), 2, prefix, codec._INT, out)
    assert (k, pos) == (3, ends[3])
    assert [(((a, b, c),), d) for a, b, c, d in out[:k].tolist()] == values
    assert codec._value(data, pos)[0] == last
    for cut in range(2, len(data)):
        k, at = kernels.draw_pieces(np.frombuffer(data[:cut], np.uint8), 2, prefix, 3, out)
        assert k == sum(end <= cut for end in ends[1:]) and at == ends[k]
    k, at = kernels.draw_pieces(np.frombuffer(data, np.uint8), 2, prefix, 3, out[:2])
    assert (k, at) == (2, ends[2])
    assert codec.decode(data) == (*values, last)


def test_draw_rows_reads_packed_rows_of_draw_pieces_until_one_is_not(kernels):
    """Rows ``(parents, lengths)`` as the state codec writes them: two of draw pieces with
    as many lengths, then one with a length too few, which stops the kernel (the codec
    decodes it in general). The same bytes cut anywhere: it stops before the row cut;
    ``pieces`` too short for a row: it stops before that row; other forms stop it too."""
    from zephon_jax.state import codec

    p = [(((1, 0, 300),), 0), (((7, 1, 2),), 3), (((-5, 0, 9),), 1), (((4, 4, 4),), 2)]
    rows = [((p[0], p[1]), (5, -7)), ((p[2],), (9,)), ((p[3], p[0]), (1,))]
    data = codec.encode(tuple(rows))
    ends = np.cumsum([2] + [len(codec.encode(r)) for r in rows]).tolist()  # 2: the header
    prefix = np.frombuffer(codec._DRAW_PIECE, np.uint8)

    def read(data, n=3, room=8):
        pieces, lengths = np.zeros((room, 4), np.int64), np.zeros(room, np.int64)
        row_ends = np.zeros(n, np.int64)
        got = kernels.draw_rows(
            np.frombuffer(data, np.uint8), 2, n, prefix, codec._INT, codec._TUPLE, pieces,
            lengths, row_ends,
        )  # fmt: skip
        return (*got, pieces, lengths, row_ends)

    r, pos, pieces, lengths, row_ends = read(data)
    assert (r, pos) == (2, ends[2])
    assert [(((a, b, c),), d) for a, b, c, d in pieces[:3].tolist()] == p[:3]
    assert lengths[:3].tolist() == [5, -7, 9] and row_ends[:2].tolist() == [2, 3]
    for cut in range(2, len(data)):
        r, at = read(data[:cut])[:2]
        assert r == sum(end <= cut for end in ends[1:3]) and at == ends[r]
    assert read(data, room=2)[:2] == (1, ends[1])  # the second row's piece has no room
    assert read(data, n=1)[:2] == (1, ends[1])
    for other in [((p[0],), (5, 6)), ((p[0],), (None,)), ((p[0],), 5), ((p[0], 5),), (5, 6)]:
        assert read(codec.encode((other,)), n=1)[0] == 0, other
    assert read(codec.encode((((), ()),)), n=1)[0] == 0  # a row of no pieces


@pytest.mark.parametrize("high,fits", [(129, True), (119, False)])
def test_gather_checks_every_token_fits_before_writing(kernels, high, fits):
    """With ``low <= high``, a token out of ``[low, high]`` anywhere (here 120, the last
    piece's) makes the gather return False with nothing written."""
    tokens = (np.arange(100, 130, dtype=np.uint16),)
    starts, lengths = np.array([0, 20], np.int64), np.array([3, 1], np.int64)
    values = np.full((2, 4), -1, np.int32)
    segment_ids, positions = np.full((2, 4), -1, np.int32), np.full((2, 4), -1, np.int32)
    no_shift = np.empty((2, 0), np.int32)
    addresses, like, _ = array_addresses(tokens, starts, None)
    got = kernels.gather(
        addresses, like, lengths, np.array([1, 2], np.int64), np.arange(4, dtype=np.int32),
        100, high, values, segment_ids, positions, no_shift, no_shift, 0,
    )  # fmt: skip
    assert got == fits
    if fits:
        assert values.tolist() == [[100, 101, 102, 0], [120, 0, 0, 0]]
    else:
        assert (values == -1).all() and (segment_ids == -1).all() and (positions == -1).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_fused_to_training_equals_shifting_the_gathered_rows(kernels, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(6):
        room, row = 16, []
        while room and rng.random() < 0.8:
            n = int(rng.integers(1, room + 1))
            row.append((int(rng.integers(0, 30 - n + 1)), n))
            room -= n
        rows.append(row)
    packed = _gather(kernels, rows, 16)
    want = shifted(packed[0], packed[1], packed[2], None, 4)
    values, segment_ids, positions, targets, loss_mask = _gather(kernels, rows, 16, pad_id=4)
    got = {"inputs": values, "targets": targets, "loss_mask": loss_mask,
           "segment_ids": segment_ids, "positions": positions}  # fmt: skip
    assert got.keys() == want.keys()
    for name, array in want.items():
        assert got[name].dtype == array.dtype and np.array_equal(got[name], array), name


def _span_runs(ck, starts, stops, where, itemsize=2):
    """span_runs over chunks of 4 tokens, 3 chunks a shard."""
    args = (np.array(starts, np.int64), np.array(stops, np.int64), 4, 3)
    return ck.span_runs(*args, np.array(where, np.int64), itemsize)


def test_spans_become_runs_joined_within_a_shard_file_and_over_unwritten_chunks(kernels):
    # Chunks 0-2 are shard 0 (chunk 1 stored first, chunk 2 never written), 3-5 shard 1.
    where = [8, 0, -1, 0, 8, 16]
    # Tokens 0-3 are bytes 8-15 of shard 0; 4-7 bytes 0-7: not after them, two runs.
    # Tokens 12-23 are all of shard 1 in order: one run; tokens 8-11 unwritten.
    runs, unknown, shard, offset, first_byte, bounds = _span_runs(
        kernels, [1, 9, 12], [6, 11, 24], where
    )
    assert unknown == 0
    assert shard[:runs].tolist() == [0, 0, 0, 1]
    assert offset[:runs].tolist() == [8, 0, -1, 0]
    assert first_byte[[0, 1, 3]].tolist() == [10, 0, 0]
    assert bounds[: runs + 1].tolist() == [0, 3, 5, 7, 19]


def _span_addresses(ck, starts, stops, where, bases, itemsize=2, num_tokens=None):
    """span_addresses over chunks of 4 tokens, 3 chunks a shard (of ``num_tokens``, by
    default all the chunks of ``where``): ``(missing, apart, addresses, shard_of)``."""
    addresses, shard_of = np.full(len(starts), -9, np.int64), np.full(len(starts), -9, np.int64)
    total = 4 * len(where) if num_tokens is None else num_tokens
    args = (np.array(starts, np.int64), np.array(stops, np.int64), total, 4, 3)
    missing, apart = ck.span_addresses(*args, np.array(where, np.int64), itemsize,
                                       np.array(bases, np.int64), addresses, shard_of)  # fmt: skip
    return missing, apart, addresses, shard_of


def test_span_addresses_in_one_run_of_a_mapped_file_and_minus_one_elsewhere(kernels):
    # Chunks 0-2 are shard 0 (chunk 1 stored first, chunk 2 never written), 3-5 shard 1
    # (in order, from byte 8 on).
    where, bases = [8, 0, -1, 8, 16, 24], [1000, 2000]
    spans = [(1, 3), (5, 7), (1, 6), (9, 11), (12, 24), (13, 20), (2, 4)]
    missing, apart, addresses, shard_of = _span_addresses(kernels, *zip(*spans), where, bases)
    assert (missing, apart) == (0, 2)
    assert shard_of.tolist() == [0, 0, 0, 0, 1, 1, 0]
    # token t of chunk c: bases[shard] + where[c] + (t % 4) * 2
    assert addresses.tolist() == [1010, 1002, -1, -1, 2008, 2010, 1012]
    # across chunks 0 and 1 (stored apart), in a chunk never written: -1; chunks 3-5 of
    # shard 1 follow each other: one address
    _, apart, addresses, _ = _span_addresses(kernels, [0, 4], [2, 6], [9, 10, -1], [1000])
    assert addresses.tolist() == [-1, 1010] and apart == 1  # 2-byte tokens from an odd byte


def test_span_addresses_of_empty_spans_are_zero_and_spans_outside_are_refused(kernels):
    where, bases = [8, 0, -1, 8, 16, 24], [1000, 2000]
    # Empty spans anywhere (even past the end) are address 0 of shard -1, not apart.
    missing, apart, addresses, shard_of = _span_addresses(
        kernels, [1, 30, 5, -4], [3, 30, 5, -4], where, bases
    )
    assert (missing, apart) == (0, 0)
    assert addresses.tolist() == [1010, 0, 0, 0] and shard_of.tolist() == [0, -1, -1, -1]
    for starts, stops in (([1, -1], [3, 2]), ([1, 22], [3, 25]), ([0], [21])):
        missing, _, addresses, _ = _span_addresses(
            kernels, starts, stops, where, bases, num_tokens=24 if stops[-1] != 21 else 20
        )
        assert missing == ck.OUTSIDE and (addresses == -9).all()


def test_span_addresses_name_the_chunks_of_unmapped_or_unknown_shards(kernels):
    where, bases = [8, 0, -1, -2, -2, -2, 0, 8, 16], [1000, 0, 0]
    missing, _, addresses, shard_of = _span_addresses(
        kernels, [0, 13, 25, 9], [2, 14, 26, 10], where, bases
    )
    assert missing == 2 and shard_of[:missing].tolist() == [3, 6]  # shard 1 unknown, 2 unmapped
    assert (addresses == -9).all()  # not made
    missing, apart, _, _ = _span_addresses(kernels, [9], [10], where, bases)
    assert missing == 0 and apart == 1  # a chunk never written needs no map


def test_spans_over_shards_whose_index_is_unknown_name_one_chunk_of_each(kernels):
    where = [0, 8, 16, -2, -2, -2, 0, 8, 16, -2, -2, -2]
    runs, unknown, shard, *_ = _span_runs(kernels, [0, 14, 37], [16, 20, 40], where)
    assert unknown == 2 and sorted(shard[:unknown] // 3) == [1, 3]


@pytest.mark.parametrize("seed", range(4))
def test_runs_copy_exactly_the_bytes_of_each_span(kernels, seed):
    """Random chunk tables and spans: copying the runs out of the shard files gives each
    token's bytes (the fill value for unwritten chunks), and no two runs could join."""
    rng = np.random.default_rng(seed)
    chunks, itemsize = 12, 2
    where = []
    for _ in range(4):  # 3 chunks a shard, stored in a random order, some never
        order = rng.permutation(3)
        where += [-1 if rng.random() < 0.2 else 8 * int(order[i]) for i in range(3)]
    files = rng.integers(0, 256, (4, 24), dtype=np.uint8)
    starts = rng.integers(0, 4 * chunks - 1, 10)
    stops = np.minimum(starts + rng.integers(1, 20, 10), 4 * chunks)
    runs, unknown, shard, offset, first_byte, bounds = _span_runs(
        kernels, starts, stops, where, itemsize
    )
    assert unknown == 0
    want = []
    for a, b in zip(starts.tolist(), stops.tolist()):
        for t in range(a, b):
            w = where[t // 4]
            byte = w + (t % 4) * itemsize
            want.append(b"\0\0" if w < 0 else files[t // 12, byte : byte + 2].tobytes())
    got = []
    for r in range(runs):
        n = int(bounds[r + 1] - bounds[r])
        assert n > 0
        if offset[r] < 0:
            got += [b"\0\0"] * n
        else:
            data = files[shard[r], first_byte[r] : first_byte[r] + n * itemsize].tobytes()
            got += [data[2 * i : 2 * i + 2] for i in range(n)]
        if r:  # runs are as long as they can be
            both_unwritten = offset[r] < 0 and offset[r - 1] < 0
            after = (
                offset[r] >= 0
                and offset[r - 1] >= 0
                and shard[r] == shard[r - 1]
                and (first_byte[r] == first_byte[r - 1] + (bounds[r] - bounds[r - 1]) * itemsize)
            )
            assert not (both_unwritten or after)
    assert got == want
