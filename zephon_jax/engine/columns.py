"""Lanes that read token arrays column-wise and pack with compiled kernels.

A pipeline ``source(TokenArray) [.shuffle] [.repeat] [.split(c)] .pack(S) .batch(B)``,
or one over a mixture by records of such sources (``Dataset.mix``, fixed
weights), with no maps or filters, ``pack`` last, ``c <= S``, and integer tokens
(or tokens the output dtype always holds), needs no element per document: a
lane resolves its next positions to document ids, and one kernel call per block
cuts the documents into pieces and places them into the lane's
:class:`~zephon_jax.operators.token_bins.TokenBins`, returning the finished rows
as :class:`~zephon_jax.operators.token_bins.TokenRow`.

It is the general path's exact twin: the blocks have the same sizes, the
pieces go into the same rows in the same order, rows and held records have the
same lineages, so every batch, state and provenance record is the same
byte for byte (``tests/test_token_columns.py`` checks this against
``ZEPHON_JAX_COMPILED=0``). Without numba, or for any other pipeline, lanes take
the general path.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Sequence

import numpy as np

from zephon_jax.core.kernels import DONE, OUT_FULL, kernels
from zephon_jax.core.lineage import PIECE_MASK, Element
from zephon_jax.engine.blocks import first_block, next_block
from zephon_jax.engine.exclusion import excluded_columns
from zephon_jax.operators.pack import BinPackOperator
from zephon_jax.operators.token_bins import TokenBins, TokenRow
from zephon_jax.sampler.resolve import resolve, resolve_lanes

# Document ids a lane resolves at a time (8 bytes each, plus the 8 bytes per position
# that provenance keeps of its last blocks, see Lane._remember).
DOCUMENTS_AHEAD = 256


@dataclasses.dataclass(frozen=True)
class ColumnarPlan:
    """What a column-wise lane needs: the pack stage, the cut and the token arrays.

    ``tokens[l]`` is leaf ``l``'s token array; ``offsets`` all leaves' offsets one after
    the other, leaf ``l``'s from ``bases[l]``.
    """

    stage: int  # the index of pack among the operators
    pack: BinPackOperator
    cut: int  # split's max_len, 0 without split
    field: str
    tokens: tuple[np.ndarray, ...]
    offsets: np.ndarray
    bases: np.ndarray
    # What each placement needs, at once: the kernel, offsets, bases, cut, row length,
    # segments bound (-1: none), best fit, the pack's spec, the field and the tokens.
    arguments: tuple


def columnar_plan(plan: Any) -> ColumnarPlan | None:
    """The column-wise plan for a lane plan, or None where the general path runs."""
    if plan.mixture is not None or any(plan.leaf_transforms):
        return None
    sources = [leaf.source for leaf in plan.leaves]
    # Not imported here: importing zephon_jax.sources starts tensorstore. A TokenArray
    # source means its module is loaded.
    token_array = sys.modules.get("zephon_jax.sources.token_array")
    if token_array is None or any(type(s) is not token_array.TokenArray for s in sources):
        return None
    field, dtype = sources[0].field, sources[0].tokens.dtype
    if any(s.field != field or s.tokens.dtype != dtype for s in sources):
        return None
    if len(sources) > 1 and not all(s.tokens.flags.c_contiguous for s in sources):
        return None  # the kernels take the token arrays as one tuple of one array type
    ops = plan.operators
    if len(ops) == 1 and type(ops[0]) is BinPackOperator and not plan.post_transforms[0]:
        stage, cut, key = 0, 0, field
    elif len(ops) == 2 and plan.fused[0] is not None and not plan.post_transforms[1]:
        stage, cut, key = 1, plan.fused[0][1], plan.fused[0][2]
    else:
        return None
    pack = ops[stage]
    spec = pack.spec
    if key != field or set(spec.dtypes) - {field}:
        return None
    out = spec.dtype(field)
    if not np.can_cast(dtype, out, "safe") and not (
        dtype.kind in "iu" and out.kind in "iu" and dtype != np.uint64
    ):
        return None  # the general path checks every value (gather checks integers)
    longest = max(s.longest for s in sources)
    if (not cut and longest > spec.seq_len) or (cut and -(-longest // cut) > PIECE_MASK):
        return None  # the general path raises or writes long lineages
    compiled = kernels()
    if compiled is None:
        return None
    tokens = tuple(np.asarray(s.tokens) for s in sources)  # one array type, memmaps too
    offsets = np.concatenate([s.offsets for s in sources])
    bases = np.cumsum([0] + [len(s.offsets) for s in sources[:-1]]).astype(np.int64)
    arguments = (
        compiled.place, offsets, bases, cut, spec.seq_len, spec.max_segments or -1,
        pack.method == "best_fit", spec, field, tokens,
    )  # fmt: skip
    return ColumnarPlan(stage, pack, cut, field, tokens, offsets, bases, arguments)


def take_columns(lane: Any, n: int) -> list | None:
    """:meth:`Lane._take <zephon_jax.engine.lane.Lane._take>` for a column-wise lane: the same
    blocks, read as document ids and placed by the kernel."""
    pending = lane.pending
    if n == 1 and pending:  # the common case with one lane per row
        return [pending.popleft()]
    if len(pending) < n:
        plan = lane.plan
        columns = plan.columnar
        limit = plan.max_records_without_row
        size = 0
        had = -1
        while len(pending) < n:
            if lane.input_done:
                return None
            size = next_block(size, n - len(pending), len(pending) != had, lane.block_cap(n))
            had = len(pending)
            block = _next_documents(lane, min(size, limit + 1 - lane._without_row))
            if block is None:
                lane._finish_input()
                continue
            positions, leaves, records = block
            lane._without_row += len(records)  # reset when a row reaches ``pending``
            if plan.excluded:  # records a state excludes (see zephon_jax.engine.exclusion)
                positions, leaves, records = excluded_columns(
                    plan.excluded, positions, leaves, records
                )
            if len(records):
                _place(lane, columns, positions, leaves, records)
            if lane._without_row > limit:
                lane._raise_no_progress()
    return [pending.popleft() for _ in range(n)]


def take_column_lanes(lanes: dict[int, Any], n: int) -> dict:
    """``{l: lane.take(n)}`` for column-wise ``lanes``: the document ids of the lanes
    that must place a block are resolved together first (see
    :func:`read_documents_ahead`), and lanes holding ``n`` finished rows hand them over
    at once."""
    needy = [lane for lane in lanes.values() if len(lane.pending) < n]
    if len(needy) > 1:
        read_documents_ahead(needy, n)
    taken = {}
    for l, lane in lanes.items():
        pending = lane.pending
        if len(pending) >= n:
            taken[l] = [pending.popleft()] if n == 1 else [pending.popleft() for _ in range(n)]
            lane.step += 1
        else:
            taken[l] = lane.take(n)
    return taken


def read_documents_ahead(lanes: Sequence[Any], rows: int) -> None:
    """Resolves, all together (one vectorized pass), the next ``DOCUMENTS_AHEAD``
    document ids of each of ``lanes`` whose next ``take(rows)`` would start by resolving
    on its own (it lacks rows and the ids of its first block). Ids read ahead only
    cache what the sampler gives for the next positions: no row or state depends on it."""
    short, starts = [], []
    for lane in lanes:
        missing = rows - len(lane.pending)
        if lane.input_done or missing <= 0:
            continue
        start = lane.next_position
        ahead = lane._documents_ahead
        if (
            ahead is not None
            and ahead[0] <= start
            and start + first_block(missing, lane.block_cap(rows)) <= ahead[0] + len(ahead[1])
        ):
            continue
        end = lane.end_position
        stop = start + DOCUMENTS_AHEAD if end is None else min(start + DOCUMENTS_AHEAD, end)
        if stop > start:
            short.append(lane)
            starts.append(np.arange(start, stop, dtype=np.int64))
    if len(short) > 1:
        plan = short[0].plan
        ids = [lane.lane for lane in short]
        for lane, positions, res in zip(
            short, starts, resolve_lanes(plan.sampler, ids, starts, plan.num_lanes)
        ):
            _keep_ahead(lane, positions, res)


def _keep_ahead(lane: Any, positions: np.ndarray, res: Any) -> None:
    lane._remember(positions, res)
    skipped = not res.valid.all()  # a source past its epochs while another is not
    lane._documents_ahead = (int(positions[0]), positions, res.leaf, res.record, skipped, res.valid)


def _next_documents(lane: Any, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The positions, leaves and document ids of the lane's next ``size`` positions
    (fewer at the end of the input, those skipped left out; None past the end); the lane
    moves past them."""
    start = lane.next_position
    end = lane.end_position
    if end is not None:
        if start >= end:
            return None
        size = min(size, end - start)
    ahead = lane._documents_ahead
    if ahead is None or not ahead[0] <= start <= start + size <= ahead[0] + len(ahead[1]):
        plan = lane.plan
        stop = start + max(size, DOCUMENTS_AHEAD)
        if end is not None:
            stop = min(stop, end)
        positions = np.arange(start, stop, dtype=np.int64)
        _keep_ahead(lane, positions, resolve(plan.sampler, lane.lane, positions, plan.num_lanes))
        ahead = lane._documents_ahead
    _, positions, leaves, records, skipped, valid = ahead
    at = start - ahead[0]
    lane.next_position = start + size
    window = slice(at, at + size)
    if skipped:
        kept = valid[window]
        return positions[window][kept], leaves[window][kept], records[window][kept]
    return positions[window], leaves[window], records[window]


def _place(
    lane: Any, columns: ColumnarPlan, positions: np.ndarray, leaves: np.ndarray, records: np.ndarray
) -> None:
    """Places the documents ``records`` of ``leaves`` (at lane ``positions``) into the
    lane's open rows; finished rows go to ``pending``."""
    stage = columns.stage
    carry = lane.carries[stage]
    if type(carry) is not TokenBins:
        carry = lane.carries[stage] = TokenBins.adopt(
            carry, columns.pack.num_bins, columns, lane.lane, lambda p: _documents_of(lane, p)
        )
    carry._form = None  # the rows change (as carry.changed())
    place, offsets, bases, cut, seq_len, max_segments, best, spec, field, tokens = columns.arguments
    several = len(tokens) > 1
    rows: list[Element] = []
    # The rows' pieces (codes, lengths, row ends), for the lane's accounting.
    counted: tuple[list, list, list] = ([], [], [])
    k = j = 0
    while True:
        out, row_end = carry.out, carry.row_end
        k, j, n_out, n_rows, stop = place(
            carry.fill, carry.count, carry.pieces, carry.slots, offsets, bases, leaves, records,
            positions, k, j, cut, seq_len, max_segments, best, out, row_end,
        )  # fmt: skip
        if n_rows:
            codes, starts, lengths, sources = out[:, :n_out].tolist()
            ends = row_end[:n_rows].tolist()
            shift = len(counted[0])
            counted[0].extend(codes)
            counted[1].extend(lengths)
            counted[2].extend([end + shift for end in ends] if shift else ends)
            begin = 0
            for end in ends:
                held = tuple(lengths[begin:end])
                row = TokenRow(
                    spec,
                    field,
                    tokens,
                    starts[begin:end],
                    held,
                    sources[begin:end] if several else None,
                )
                rows.append(Element(row, (tuple(codes[begin:end]), held)))
                begin = end
        if stop == DONE:
            break
        if stop == OUT_FULL:
            carry.grow_out()
        else:
            carry.grow_rows()
    if rows:
        lane._row_reached(rows, counted)
    else:  # the stage the records reached, for the no-progress error
        index = bases[leaves] + records
        placed = bool((offsets[index + 1] > offsets[index]).any())
        lane._deepest = max(lane._deepest, stage if placed else 0)


def _documents_of(lane: Any, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The leaves and document ids of lane ``positions``."""
    plan = lane.plan
    res = resolve(plan.sampler, lane.lane, positions, plan.num_lanes)
    return res.leaf, res.record
