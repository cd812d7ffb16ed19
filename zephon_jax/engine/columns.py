"""Lanes that read token arrays column-wise and pack with compiled kernels.

A pipeline ``source(TokenArray) [.shuffle] [.repeat] [.split(c)] .pack(S)
[.to_training(...)] .batch(B)``, or one over a mixture by records of such sources
(``Dataset.mix``, fixed weights), with no maps or filters, ``pack`` last, ``c <= S``,
and integer tokens (or tokens the output dtype always holds; always, before
``to_training``), needs no element per document: a
lane resolves its next positions to document ids, and one kernel call per block
cuts the documents into pieces and places them into the lane's
:class:`~zephon_jax.operators.token_bins.TokenBins`, returning the finished rows
as one run (:class:`~zephon_jax.engine.token_rows.TokenRowRun`, rows of
:class:`~zephon_jax.operators.token_bins.TokenRow`). A ``to_training`` after
``pack`` is made by the gather of the batch, or shifts the gathered batch arrays as
a whole (see :meth:`TokenRow.assemble_batch
<zephon_jax.operators.token_bins.TokenRow.assemble_batch>`).

It is the general path's exact twin: the blocks have the same sizes, the
pieces go into the same rows in the same order, rows and held records have the
same lineages, so every batch, state and provenance record is the same
byte for byte (``tests/integration/test_token_columns.py`` checks this against
``ZEPHON_JAX_COMPILED=0``). Without numba, or for any other pipeline, lanes take
the general path.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import sys
from typing import Any, Sequence

import numpy as np

from zephon_jax.core import compiled_kernels as kc
from zephon_jax.core.kernels import kernels
from zephon_jax.core.lineage import (
    MAX_PIECE,
    DrawPieceTable,
    DrawRowTable,
    parents_of,
    recipe_of,
)
from zephon_jax.engine.blocks import fill_pending
from zephon_jax.engine.column_sources import ArrayTokens, RecordTokens, StoreTokens
from zephon_jax.engine.drawn_roots import DrawnRoots
from zephon_jax.engine.exclusion import excluded_columns
from zephon_jax.engine.token_rows import TokenRowRun, lineages_of_draws
from zephon_jax.errors import StateError
from zephon_jax.operators.base import BinPacking
from zephon_jax.operators.token_bins import SavedRows, TokenBins
from zephon_jax.sampler.resolve import resolve, resolve_lanes
from zephon_jax.sampler.scheduled_mixture import locate_draws, read_draws_ahead
from zephon_jax.transforms.to_training import ToTrainingTransform

# Document ids a lane resolves at a time (8 bytes each, plus the 8 bytes per position
# that provenance keeps of its last blocks, see Lane.remember): 256, or more (up to
# 1,024) while all lanes together stay within 65,536 (see documents_ahead).
DOCUMENTS_AHEAD = 256
DOCUMENTS_AHEAD_FEW_LANES = 1024
DOCUMENTS_AHEAD_ALL_LANES = 65536


def documents_ahead(num_lanes: int) -> int:
    """The document ids a lane resolves at a time when the loader has ``num_lanes``
    lanes: fewer resolving calls with few lanes, bounded memory with many."""
    cap = DOCUMENTS_AHEAD_ALL_LANES // max(1, num_lanes)
    return max(DOCUMENTS_AHEAD, min(DOCUMENTS_AHEAD_FEW_LANES, cap))


@dataclasses.dataclass(frozen=True)
class ColumnarPlan:
    """What a column-wise lane needs: the pack stage and what it declares, the cut and
    where the tokens are (``reader``, see :mod:`zephon_jax.engine.column_sources`)."""

    stage: int  # the index of pack among the operators
    packing: BinPacking  # pack's column_packing
    cut: int  # split's max_len, 0 without split
    field: str
    reader: ArrayTokens
    # What each placement needs, at once: the kernel, cut, row length, segments bound
    # (-1: none), best fit, the pack's spec, the field and the to_training after pack
    # (None: none).
    arguments: tuple
    # Whether a mixture by tokens or with stages draws the documents (see _fill_drawn):
    # the kernel's codes are then indices of the lane's drawn roots.
    drawn: bool = False
    ahead: int = DOCUMENTS_AHEAD  # the document ids a lane resolves at a time

    @property
    def tokens(self) -> tuple[np.ndarray, ...]:
        """The token arrays the pieces point into now."""
        return self.reader.tokens

    @functools.cached_property
    def row_kind(self) -> tuple:
        """``(spec, fields, tokens, training)`` of the lanes' rows (see
        :class:`~zephon_jax.engine.token_rows.TokenRowRun`), one tuple for all."""
        _, _, spec, field, training = self.arguments
        return (spec, (field,), self.reader.tokens, training)


def columnar_plan(plan: Any) -> ColumnarPlan | None:
    """The column-wise plan for a lane plan, or None where the general path runs."""
    mixture = plan.mixture
    if any(plan.leaf_transforms) or (mixture is not None and mixture.transforms):
        return None
    found = _token_reader([leaf.source for leaf in plan.leaves])
    if found is None:
        return None
    reader, field, dtype, longest = found
    if mixture is not None and mixture.unit == "tokens" and field != "tokens":
        return None  # the general path raises: a mixture by tokens counts ``tokens``
    ops = plan.operators
    if len(ops) == 1:
        stage, cut, key = 0, 0, field
    elif len(ops) == 2 and plan.fused[0] is not None:
        stage, cut, key = 1, plan.fused[0][1], plan.fused[0][2]
    else:
        return None
    packing = ops[stage].column_packing
    if packing is None:
        return None
    spec = packing.spec
    if key != field or set(spec.dtypes) - {field}:
        return None
    out = spec.dtype(field)
    training = _training_after(plan.post_transforms[stage], field)
    if training is False or (training and not np.can_cast(dtype, out, "safe")):
        return None  # the general path raises, or checks values before the shift
    if not np.can_cast(dtype, out, "safe") and not (
        dtype.kind in "iu" and out.kind in "iu" and dtype != np.uint64
    ):
        return None  # the general path checks every value (gather checks integers)
    if (not cut and longest > spec.seq_len) or (cut and -(-longest // cut) > MAX_PIECE):
        return None  # the general path raises or writes long lineages
    compiled = kernels()
    if compiled is None:
        return None
    arguments = (cut, packing.best, spec, field, training)
    return ColumnarPlan(
        stage,
        packing,
        cut,
        field,
        reader(),
        arguments,
        drawn=mixture is not None,
        ahead=documents_ahead(plan.num_lanes),
    )


def _token_reader(sources: Sequence[Any]) -> tuple | None:
    """``(make the reader, field, token dtype, longest document)`` for sources that are
    all token arrays or all token stores (of one dtype), else None."""
    # Not imported here: importing zephon_jax.sources starts tensorstore. A TokenArray
    # or TokenStore source means its module is loaded.
    token_array = sys.modules.get("zephon_jax.sources.token_array")
    token_store = sys.modules.get("zephon_jax.sources.token_store")
    if token_array is not None and all(type(s) is token_array.TokenArray for s in sources):
        field, dtype = sources[0].field, sources[0].tokens.dtype
        if any(s.field != field or s.tokens.dtype != dtype for s in sources):
            return None
        if not dtype.isnative or not all(s.tokens.flags.c_contiguous for s in sources):
            return None  # the gather kernel reads native tokens from their addresses
        tokens = tuple(np.asarray(s.tokens) for s in sources)  # one array type, memmaps too
        offsets = np.concatenate([s.offsets for s in sources])
        bases = np.cumsum([0] + [len(s.offsets) for s in sources[:-1]]).astype(np.int64)
        longest = max(s.longest for s in sources)
        return functools.partial(ArrayTokens, tokens, offsets, bases), field, dtype, longest
    if token_store is not None and all(type(s) is token_store.TokenStore for s in sources):
        dtype = sources[0].dtype
        if any(s.dtype != dtype for s in sources):
            return None
        longest = max(int(np.diff(s.offsets).max(initial=0)) for s in sources)
        return functools.partial(StoreTokens, sources, dtype), "tokens", dtype, longest
    if all(type(s) is list for s in sources):
        return _record_reader(sources)
    return None


def _record_reader(sources: Sequence[list]) -> tuple | None:
    """:func:`_token_reader` for Python lists whose records are all ``{field: 1-D array}``
    of one integer dtype (one pass over the records, which stay where they are: the
    reader keeps a list of their arrays, a pointer each), else None."""
    first = sources[0][0] if sources[0] else None
    if type(first) is not dict or len(first) != 1:
        return None
    ((field, value),) = first.items()
    if type(value) is not np.ndarray or value.dtype.kind not in "iu" or not value.dtype.isnative:
        return None
    dtype = value.dtype
    offsets, arrays = [], []
    for source in sources:
        lengths = np.empty(len(source), np.int64)
        leaf_arrays = []
        for i, record in enumerate(source):
            if type(record) is not dict or len(record) != 1:
                return None
            array = record.get(field)
            if (
                type(array) is not np.ndarray
                or array.ndim != 1
                or array.dtype != dtype
                or not array.flags.c_contiguous
            ):
                return None
            lengths[i] = array.shape[0]
            leaf_arrays.append(array)
        offsets.append(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        arrays.append(leaf_arrays)
    longest = max(int(np.diff(o).max(initial=0)) for o in offsets)
    return functools.partial(RecordTokens, arrays, offsets, dtype), field, dtype, longest


def _training_after(transforms: Sequence[Any], field: str) -> ToTrainingTransform | None | bool:
    """What follows ``pack``: None (nothing), a ``to_training`` alone over rows of
    ``tokens`` (applied to the batch arrays), or False (any other transform: the
    general path runs)."""
    if not transforms:
        return None
    if len(transforms) == 1 and type(transforms[0]) is ToTrainingTransform and field == "tokens":
        return transforms[0]
    return False


def take_columns(lane: Any, n: int) -> list | None:
    """:meth:`Lane._take <zephon_jax.engine.lane.Lane._take>` for a column-wise lane: the same
    blocks, read as document ids and placed by the kernel."""
    return lane.pending.take(n) if fill_columns(lane, n) else None


def fill_columns(lane: Any, n: int) -> bool:
    """Has a column-wise lane make rows, as its take of ``n`` rows would before taking
    them, until it holds ``n``; False if its input ends first."""
    if len(lane.pending) >= n:  # made ahead
        return True
    if lane.drawer is not None:
        return _fill_drawn(lane, n)
    read = functools.partial(_document_block, lane)
    place = functools.partial(_place, lane, lane.plan.columnar)
    return fill_pending(lane, n, read, place)


def _document_block(lane: Any, size: int) -> tuple[tuple | None, int] | None:
    """:data:`~zephon_jax.engine.blocks.ReadBlock` of a column-wise lane: the positions,
    leaves and document ids of its next ``size`` positions, less those skipped and
    those a state excludes (see :mod:`zephon_jax.engine.exclusion`)."""
    block = _next_documents(lane, size)
    if block is None:
        return None
    positions, leaves, records = block
    counted = len(records)
    excluded = lane.plan.excluded
    if excluded:
        positions, leaves, records = excluded_columns(excluded, positions, leaves, records)
    return ((positions, leaves, records) if len(records) else None), counted


def take_column_lanes(lanes: dict[int, Any], n: int) -> dict:
    """``{l: lane.take(n)}`` for column-wise ``lanes`` (see :func:`fill_column_lanes`)."""
    fill_column_lanes(list(lanes.values()), n)
    return {l: lane.take(n) for l, lane in lanes.items()}


def fill_column_lanes(lanes: Sequence[Any], n: int) -> bool:
    """:func:`fill_columns` of each of column-wise ``lanes`` (lanes are independent: the
    order is free); the document ids of the lanes that must place a block are resolved
    together first (see :func:`read_documents_ahead`). False if a lane's input ended
    before it held ``n`` rows (the others hold theirs)."""
    needy = [lane for lane in lanes if len(lane.pending) < n]
    drawn = bool(needy) and needy[0].drawer is not None
    if len(needy) > 1:
        open_rows_of_lanes(needy)
        if drawn:
            read_draws_ahead([lane.drawer for lane in needy])
        read_documents_ahead(needy, n)
    if drawn:
        return _fill_drawn_lanes(needy, n)
    return all([fill_columns(lane, n) for lane in needy])  # (a list: every lane fills)


def read_documents_ahead(lanes: Sequence[Any], rows: int) -> None:
    """Resolves, all together (one vectorized pass), the next ``ColumnarPlan.ahead``
    document ids of each of ``lanes`` whose next ``take(rows)`` would start by resolving
    on its own (it lacks rows and the ids of its first block). Ids read ahead only
    cache what the sampler gives for the next positions: no row or state depends on it."""
    short, starts = [], []
    if lanes and lanes[0].drawer is not None:
        return  # a mixture drawer reads no ids ahead
    for lane in lanes:
        missing = rows - len(lane.pending)
        if lane.input_done or missing <= 0:
            continue
        start = lane.next_position
        ahead = lane.documents_ahead
        if (
            ahead is not None
            and ahead[0] <= start
            and start + lane.first_block(rows) <= ahead[0] + len(ahead[1])
        ):
            continue
        end = lane.end_position
        stop = start + lane.plan.columnar.ahead
        if end is not None:
            stop = min(stop, end)
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
    lane.remember(positions, res)
    skipped = not res.valid.all()  # a source past its epochs while another is not
    lane.documents_ahead = (int(positions[0]), positions, res.leaf, res.record, skipped, res.valid)


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
    ahead = lane.documents_ahead
    if ahead is None or not ahead[0] <= start <= start + size <= ahead[0] + len(ahead[1]):
        plan = lane.plan
        stop = start + max(size, plan.columnar.ahead)
        if end is not None:
            stop = min(stop, end)
        positions = np.arange(start, stop, dtype=np.int64)
        _keep_ahead(lane, positions, resolve(plan.sampler, lane.lane, positions, plan.num_lanes))
        ahead = lane.documents_ahead
    _, positions, leaves, records, skipped, valid = ahead
    at = start - ahead[0]
    lane.next_position = start + size
    window = slice(at, at + size)
    if skipped:
        kept = valid[window]
        return positions[window][kept], leaves[window][kept], records[window][kept]
    return positions[window], leaves[window], records[window]


def _place(lane: Any, columns: ColumnarPlan, block: tuple) -> None:
    """Places a block of documents, ``(positions, leaves, records)`` (the documents
    ``records`` of ``leaves`` at lane ``positions``), into the lane's open rows;
    finished rows go to ``pending``."""
    positions, leaves, records = block
    carry = _open_rows(lane, columns)
    _place_spans(lane, columns, carry, positions, *columns.reader.block(leaves, records))


def _open_rows(lane: Any, columns: ColumnarPlan) -> TokenBins:
    """The lane's open rows of pack as TokenBins (adopting those a restore made)."""
    carry = lane.carries[columns.stage]
    if type(carry) is not TokenBins:
        open_rows_of_lanes([lane])
        carry = lane.carries[columns.stage]
    return carry


def open_rows_of_lanes(lanes: Sequence[Any]) -> None:
    """Makes the open rows of pack of each of column-wise ``lanes`` (of one plan) TokenBins,
    adopting those a restore made: the documents all the lanes' open rows hold are
    located (or read, one batched read per store) together, not lane by lane."""
    columns = lanes[0].plan.columnar
    stage = columns.stage
    todo = [lane for lane in lanes if type(lane.carries[stage]) is not TokenBins]
    if not todo:
        return
    adopted = TokenBins.adopt_lanes(
        [(lane.carries[stage], lane.lane) for lane in todo],
        columns.packing.num_bins,
        columns,
        functools.partial(_held_records, todo, columns.drawn),
    )
    for lane, carry in zip(todo, adopted, strict=True):
        lane.carries[stage] = carry
        if columns.drawn:
            carry.translate = functools.partial(_drawn_lineages, lane, columns.cut)


def restored_rows(lanes: Sequence[Any], snapshots: Sequence[Any]) -> list[TokenRowRun | None]:
    """The rows made ahead that ``snapshots[i]`` holds for column-wise ``lanes[i]``, as
    the lane makes them: one :class:`TokenRowRun` (None: no row) of pointers into the
    token arrays with the state's lineages, their documents located for all the lanes
    together (as :func:`open_rows_of_lanes` locates open rows), nothing read. Raises a
    StateError where a row's pieces are not those of its documents."""
    columns = lanes[0].plan.columnar
    saved = [_saved_pending(snapshot) for snapshot in snapshots]
    most = max((len(snapshot.pending) for snapshot in snapshots), default=0)
    if not most:
        return [None for _ in lanes]
    located = functools.partial(_held_records, lanes, columns.drawn, register=False)
    adopted = TokenBins.adopt_lanes(
        [(rows, lane.lane) for rows, lane in zip(saved, lanes, strict=True)],
        most,
        columns,
        located,
    )
    return [
        _restored_run(columns, lane.lane, snapshot.pending, carry)
        for lane, snapshot, carry in zip(lanes, snapshots, adopted, strict=True)
    ]


def _saved_pending(snapshot: Any) -> SavedRows | None:
    """The pieces of a snapshot's rows made ahead, as the open rows of a restored ``pack``
    (one row each); None where it has none."""
    pending = snapshot.pending
    if type(pending) is DrawRowTable:  # decoded as arrays
        pieces: Any = DrawPieceTable(pending.pieces)
        counts = tuple(np.diff(pending.ends, prepend=0).tolist())
    else:
        rows = [parents_of(lineage) for lineage in pending]
        pieces = [held for parents in rows for held in parents]
        counts = tuple(map(len, rows))
    return SavedRows(pieces, counts, snapshot.next_position) if len(pieces) else None


def _restored_run(
    columns: ColumnarPlan, lane: int, lineages: Sequence[Any], carry: TokenBins
) -> TokenRowRun | None:
    """The rows ``lineages`` whose pieces ``carry`` (adopted from them) holds in its rows
    ``0, 1, ...``, as one run with these lineages."""
    if not lineages:
        return None
    counts = carry.count[: len(lineages)].tolist()
    pieces = np.concatenate([carry.piece_array[:, i, :c] for i, c in enumerate(counts)], axis=1)
    ends = np.cumsum(counts).tolist()
    if type(lineages) is DrawRowTable:  # the rows' lengths, as their lineages record them
        given, given_ends = lineages.lengths, lineages.ends.tolist()
    else:
        recipes = [recipe_of(lineage) for lineage in lineages]
        given = np.array(list(itertools.chain.from_iterable(recipes)))
        given_ends = np.cumsum(list(map(len, recipes))).tolist()
    if given_ends != ends or not np.array_equal(given, pieces[2]):
        _check_row_lengths(lane, lineages, pieces[2], ends)
    return TokenRowRun(columns.row_kind, pieces, columns.reader.several, ends, None, list(lineages))


def _check_row_lengths(lane: int, lineages: Sequence[Any], lengths: np.ndarray, ends: list) -> None:
    """Raises naming the first of the rows ``lineages`` whose pieces' lengths (as
    recorded) are not ``lengths[begin:end]``, their documents' (the rows end at ``ends``)."""
    begin = 0
    for lineage, end in zip(lineages, ends):
        found = tuple(lengths[begin:end].tolist())
        if found != tuple(recipe_of(lineage)):
            raise StateError(
                f"lane {lane}: the state's row {lineage!r:.200} made ahead holds pieces of "
                f"lengths {recipe_of(lineage)!r:.100}, its documents give {found!r:.100}; "
                "the state was altered or the sources changed"
            )
        begin = end


def _held_records(
    lanes: Sequence[Any], drawn: bool, ks: list[int], held: list, register: bool = True
) -> list[tuple]:
    """``records_of`` of :meth:`TokenBins.adopt_lanes
    <zephon_jax.operators.token_bins.TokenBins.adopt_lanes>` for ``lanes``: the codes,
    leaves and documents of the positions (or drawn roots, registered with their lanes
    now unless ``register`` is False: their codes are then 0, 1, ...; each lane's an
    ``(n, 3)`` array) ``held[i]`` of ``lanes[ks[i]]``, resolved for all the lanes together."""
    chosen = [lanes[k] for k in ks]
    plan = chosen[0].plan
    if not drawn:
        ids = [lane.lane for lane in chosen]
        resolved = resolve_lanes(plan.sampler, ids, held, plan.num_lanes)
        return [(p, res.leaf, res.record) for p, res in zip(held, resolved, strict=True)]
    drawer = chosen[0].drawer
    sizes = [len(roots) for roots in held]
    draws = np.concatenate(held)
    lane_of = np.repeat(np.array([lane.lane for lane in chosen], np.int64), sizes)
    located = locate_draws(drawer.node, lane_of, draws, drawer.num_lanes)
    out = []
    begin = 0
    for lane, end in zip(chosen, np.cumsum(sizes).tolist()):
        index = lane.drawn.end if register else 0
        part = slice(begin, end)
        out.append((index + np.arange(end - begin), located.leaf[part], located.record[part]))
        if register:
            lane.drawn.extend(draws[part])
        begin = end
    return out


def _place_spans(
    lane: Any,
    columns: ColumnarPlan,
    carry: TokenBins,
    positions: np.ndarray,
    offsets: np.ndarray,
    bases: np.ndarray,
    leaves: np.ndarray,
    records: np.ndarray,
    any_tokens: bool | None = None,
) -> None:
    """:func:`_place` of documents already located: the placement kernel's arguments
    (see :meth:`ArrayTokens.block <zephon_jax.engine.column_sources.ArrayTokens.block>`);
    ``any_tokens``: whether any of the documents has tokens, where the caller knows."""
    stage = columns.stage
    cut, best, spec, _, _ = columns.arguments
    # The accounting keeps the rows' pieces as the kernel writes them.
    pieces, ends = carry.place(
        (offsets, bases, leaves, records, positions), cut, spec, best, lane.tally.emitted_log()
    )
    rows = _token_rows(columns, pieces, ends)
    if rows:
        lane.row_reached(rows, logged=True)
    else:  # the stage the records reached, for the no-progress error
        if any_tokens is None:
            index = bases[leaves] + records
            any_tokens = bool((offsets[index + 1] > offsets[index]).any())
        lane.deepest = max(lane.deepest, stage if any_tokens else 0)


def _token_rows(columns: ColumnarPlan, pieces: np.ndarray, ends: list) -> TokenRowRun:
    """The rows the placement emitted, as one run: their pieces as an int64 array of four
    rows (codes, starts, lengths, leaves), which nothing writes to afterwards, and each
    row's end in it; the codes are the pieces' lineages (a mixture lane's index its
    draws: see :func:`_logged_rows`)."""
    return TokenRowRun(columns.row_kind, pieces, columns.reader.several, ends, None)


def _fill_drawn(lane: Any, n: int) -> bool:
    """:func:`fill_columns` where a mixture drawer draws the documents: one at a time and
    placed at once, as the general path pushes each drawn record, until the lane holds
    :meth:`~zephon_jax.engine.lane.Lane.draw_target` rows (the draws depend on the
    step's stage: a take draws for the next steps of its stage too), by one kernel
    (:func:`~zephon_jax.core.compiled_kernels.draw_place`) that returns only to read
    draws ahead, grow an array or stop."""
    return _fill_drawn_lanes([lane], n)


def _fill_drawn_lanes(lanes: Sequence[Any], n: int) -> bool:
    """:func:`_fill_drawn` of each of ``lanes`` (mixture lanes of one plan), in order; what
    a step's draws share is looked up once: the rows a take draws for and the stage are
    functions of the step (see :meth:`~zephon_jax.engine.lane.Lane.draw_target`), which
    lanes taking together share. False if a lane's input ended before it held ``n``
    rows (the others hold theirs)."""
    by_step: dict[int, tuple[int, int]] = {}
    filled = True
    for lane in lanes:
        pending = lane.pending
        if len(pending) < n and not lane.input_done:
            step = lane.step
            drawing = by_step.get(step)
            if drawing is None:
                stage = lane.drawer.node.stages.index_at(step)
                drawing = by_step[step] = (lane.draw_target(n), stage)
            _draw_rows(lane, drawing[0] - len(pending), drawing[1])
        filled = filled and len(pending) >= n
    return filled


def _draw_rows(lane: Any, wanted: int, stage: int) -> None:
    """Draws and places documents in mixture ``stage`` (the stage of the lane's step)
    until the lane has made ``wanted`` more rows or its input ends."""
    compiled = kernels()
    drawer = lane.drawer
    plan = lane.plan
    columns = plan.columnar
    drawer.enter_stage(stage)
    carry = _open_rows(lane, columns)  # (a restored lane adopts its open rows)
    reader = columns.reader
    cut, best, spec, _, _ = columns.arguments
    ahead = drawer.ids_ahead
    roots = lane.drawn
    state = np.zeros(kc.DRAW_STATE, np.int64)
    state[kc.POSITION] = lane.next_position
    state[kc.WITHOUT_ROW] = lane.without_row
    state[kc.NEXT_CODE] = roots.end
    limit = plan.max_records_without_row
    while True:
        # The rows go straight into the accounting's log (see zephon_jax.engine.accounting).
        log = lane.tally.emitted_log()
        state[kc.OUT_AT], state[kc.ROWS_AT], state[kc.DRAWN_AT] = log.size, log.rows, roots.size
        draws = (
            drawer.quanta[stage], drawer.credits, drawer.next_sub, drawer.ends,
            drawer.rotation, drawer.node.unit == "tokens", drawer.dry, drawer.dry_limit,
            drawer.max_tokens, ahead.first, ahead.size, ahead.leaf, ahead.record, ahead.tokens,
            plan.excluded_keys, reader.offsets, reader.bases,
        )  # fmt: skip
        stop, n_out, n_rows, roots.size = carry.place_draws(
            compiled.draw_place, draws, cut, spec, best, log, (wanted, limit, state, roots.array)
        )
        lane.next_position = int(state[kc.POSITION])
        if n_rows > log.rows:
            made = n_rows - log.rows
            rows = _logged_rows(columns, log, n_out, n_rows, roots)
            lane.row_reached(rows, logged=True)
            wanted -= made
        lane.without_row = int(state[kc.WITHOUT_ROW])
        # (Not while the kernel is placing a draw's pieces: that draw may have none held.)
        if roots.size >= roots.limit and not state[kc.PLACING]:
            kept_at = roots_kept(plan.num_lanes)
            if roots.size >= kept_at:
                _prune_roots(lane, kept_at)
        if stop == kc.ROWS_MADE:
            drawer.ahead_left = int(state[kc.AHEAD_LEFT])
            return
        component = int(state[kc.COMPONENT])
        if stop == kc.NEED_AHEAD:
            drawer.read_ids_ahead(component, int(drawer.next_sub[component]))
        elif stop == kc.INPUT_END:
            lane.finish_input()
            return
        elif stop == kc.NO_PROGRESS:
            lane.deepest = max(lane.deepest, stage if state[kc.ANY_TOKENS] else 0)
            lane.raise_no_progress()
        elif stop == kc.DRY:
            drawer.raise_dry(component, int(drawer.next_sub[component]) - 1)
        elif stop == kc.TOO_LONG:
            sub = int(drawer.next_sub[component]) - 1
            tokens = int(ahead.tokens[component, sub - int(ahead.first[component])])
            drawer.raise_too_long(component, sub, tokens)
        elif stop == kc.DRAWN_FULL:
            if roots.size == roots.array.shape[1]:  # (not where the pass above made room)
                roots.grow()
        elif stop == kc.OUT_FULL:
            log.grow_out(carry.piece_array.shape[2] + 1)  # a row's pieces at most, and 1
        else:  # ROW_FULL
            carry.grow_rows()


def _logged_rows(
    columns: ColumnarPlan, log: Any, n_out: int, n_rows: int, roots: DrawnRoots
) -> TokenRowRun:
    """The rows the kernel just wrote into ``log`` after its first ``log.size`` pieces
    and ``log.rows`` rows, as one run (see :func:`_token_rows`) whose codes index the
    lane's draws as of now (``roots``); the log then holds them."""
    size, rows = log.size, log.rows
    pieces = log.out[:, size:n_out].copy()  # (the log is recoded by copying, never in place)
    if rows:  # (the log's pieces are its rows': the last row before ended at ``size``)
        bounds = log.row_end[rows - 1 : n_rows] - size
    else:
        bounds = np.empty(n_rows + 1, np.int64)
        bounds[0] = 0
        np.subtract(log.row_end[:n_rows], size, out=bounds[1:])
    log.size, log.rows = n_out, n_rows
    return TokenRowRun(
        columns.row_kind,
        pieces,
        columns.reader.several,
        None,
        (roots.array, roots.base, columns.cut),
        bounds=bounds,
    )


# Drawn roots a lane holds before it keeps only those its open rows or its
# accounting's uncounted rows point to: 24 bytes each (see zephon_jax.engine.drawn_roots).
# 512 with many lanes, more with fewer (all lanes together up to _ROOTS_ALL_LANES, a
# lane up to 16 times 512): a pass costs about 70 us whatever it keeps. Where more are
# kept, the next pass waits until the roots have doubled (a pass scans the open rows and
# the uncounted rows).
_ROOTS_KEPT = 512
_ROOTS_ALL_LANES = 1 << 19
# A pass leaves room for the draws until the next pass and this many more: the pass
# comes after the kernel returns, which may draw a take's documents past the bound first.
_ROOTS_MARGIN = 64


def roots_kept(num_lanes: int) -> int:
    """The drawn roots a lane of a loader of ``num_lanes`` lanes holds before a pass
    (:func:`_prune_roots`): 512 from 1024 lanes on, 2048 at 256, 8192 up to 64."""
    return max(_ROOTS_KEPT, min(16 * _ROOTS_KEPT, _ROOTS_ALL_LANES // max(num_lanes, 1)))


def _prune_roots(lane: Any, kept_at: int) -> None:
    """Keeps only the lane's drawn roots that a piece in its open rows or in the rows
    its accounting has not counted points to, renumbering those pieces' codes (see
    :meth:`~zephon_jax.engine.drawn_roots.DrawnRoots.keep_only`, and the kernels
    :func:`~zephon_jax.core.compiled_kernels.kept_draws` and
    :func:`~zephon_jax.core.compiled_kernels.recode_draws`), with room for the draws
    until the next pass (at ``kept_at`` held, or twice those kept); rows already made
    keep the roots' array they were made with."""
    carry = lane.carries[lane.plan.columnar.stage]
    tally = lane.tally
    roots = lane.drawn
    base = roots.base
    kept, rank = kc.kept_draws(
        carry.piece_array, carry.count, tally.logged_codes(), base, roots.size
    )
    first = roots.keep_only(kept, max(kept_at, 2 * len(kept)) + _ROOTS_MARGIN)

    def recode(codes: np.ndarray) -> np.ndarray:
        return kc.recode_draws(codes, rank, base, first)

    carry.recode(recode)
    tally.recode_logged(recode)


def _drawn_lineages(lane: Any, cut: int, codes: Sequence[int]) -> tuple:
    """The lineages of pieces coded by indices into the lane's drawn roots (see
    :func:`~zephon_jax.engine.token_rows.lineages_of_draws`)."""
    return lineages_of_draws(lane.drawn.view(), cut, codes)
