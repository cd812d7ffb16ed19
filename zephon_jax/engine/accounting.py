"""Accounting: what a run has delivered, per source and per mixture stage, kept in the state.

Every lane keeps a few counters, its *tally* ``(skipped, sources, stages)``:
per sampler leaf (source) the real tokens, the segments and the documents
started in the rows it delivered and the highest epoch seen plus one (0: none),
per stage of a mixture by tokens or with weight stages the tokens of each
component, and the number of global steps skipped with
:meth:`~zephon_jax.LoaderIterator.skip`. The tally is part of the lane's state,
so it survives checkpoints and restores on any topology, and its size depends on
the sources and stages, never on the steps trained.

The counters are exactly what summing :meth:`~zephon_jax.LoaderIterator.provenance`
over every delivered step gives, segment by segment:

* ``tokens``: ``stop - start`` of each segment; a segment that holds a whole
  record of unrecorded length (``stop`` is ``None``: an unpacked, unsplit row)
  counts the length of its row's ``"tokens"`` field (or of the row, if it is an
  array);
* ``segments``: one per segment;
* ``documents``: the segments that begin at their record's first token
  (``start`` is 0 or ``None``, and ``output``, after ``flat_map``, absent or 0);
* ``epoch``: the highest epoch among the segments.

Counting is lazy, off the hot path: when a lane makes finished rows (a block at
a time) it appends their lineages (pointers it holds anyway) to a list, or, on
the column path, the placement kernel writes their pieces' codes into an array
log (no Python object per row, so rows held until they are counted give the
garbage collector nothing to walk); rows leave its queue of finished rows in the
order they were made, so all but the last ``len(pending)`` of the log are
delivered. Nothing is done per batch. The
lane counts the delivered ones (in one compiled pass,
:func:`~zephon_jax.core.compiled_kernels.count_drawn`, for a column-wise mixture of
sources; vectorized otherwise) when :data:`FOLD_ROWS` of them wait
(fewer with many lanes: :data:`HELD_ROWS` in all), when a mixture stage ends, and
when a state is encoded (a snapshot, taken every batch, keeps a reference to the
list and the number delivered, and counts only when encoded).
Segments of records made by a user operator that keeps no pointers (``source``
is ``None``) count for no source.
"""

from __future__ import annotations

import operator
import sys
from itertools import chain
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from zephon_jax.core import compiled_kernels as kc
from zephon_jax.core import lineage as lineage_forms
from zephon_jax.core.lineage import Opaque, plain_lineage, root_key
from zephon_jax.engine.provenance import row_pieces
from zephon_jax.errors import StateError
from zephon_jax.operators.pack import EmittedRows
from zephon_jax.sampler.resolve import leaves, resolve
from zephon_jax.sampler.scheduled_mixture import ScheduledMixtureNode, locate_roots
from zephon_jax.sampler.source import SourceNode
from zephon_jax.state.lane_format import TALLY_FIELDS

# Per leaf: tokens, segments, documents, highest epoch + 1 (0: none delivered).
LEAF_FIELDS = TALLY_FIELDS
# Rows a lane keeps delivered and uncounted (their lineages only) before it counts them,
# and the most all lanes of a pipeline keep together (about 200 bytes each).
FOLD_ROWS = 1024
HELD_ROWS = 65536
_lineage = operator.attrgetter("lineage")


def record_tokens(data: Any) -> int:
    """The tokens of a row holding one whole record: its ``"tokens"`` field's length, or
    the row's length if it is an array; 0 for anything else."""
    if isinstance(data, Mapping):
        data = data.get("tokens")
    shape = np.shape(data) if data is not None else ()
    return int(shape[0]) if shape else 0


def packed_rows(plan: Any) -> bool:
    """Whether every row comes out of a last operator that declares ``rows_list_pieces``
    (``pack``) fed through at most one that ``cuts_records`` (``split``) and passthrough
    operators only: each row's lineage then lists its pieces and their lengths, counted
    many rows at once."""
    ops = plan.operators
    if not ops or not ops[-1].rows_list_pieces:
        return False
    splits = [op for op in ops[:-1] if op.cuts_records]
    return len(splits) <= 1 and all(op.passthrough for op in ops[:-1] if op not in splits)


def whole_records(plan: Any) -> bool:
    """Whether rows may hold a whole record of unrecorded length (no operator cuts records
    or lists the pieces of its rows, as ``split`` and ``pack`` do): the lane then notes
    each delivered row's tokens (see :func:`record_tokens`)."""
    return not any(op.cuts_records or op.rows_list_pieces for op in plan.operators)


def empty_tally(plan: Any) -> tuple:
    """The tally of a lane that delivered nothing: ``(0, zeros, zeros)``."""
    stages = 0
    mixture = plan.mixture
    if mixture is not None:
        stages = len(mixture.stages.starts) * len(mixture.children)
    return (0, (0,) * (LEAF_FIELDS * len(plan.leaves)), (0,) * stages)


class Tally:
    """A lane's counters, and what it will count of the rows it made since it last counted.

    The lane's finished rows leave ``pending`` in the order they were made, so of the
    rows in :attr:`made` all but the last ``len(pending)`` are delivered. :attr:`made`
    is a list of blocks, in order: a list of rows' lineages, or, from a column-wise
    lane, an :class:`~zephon_jax.operators.pack.EmittedRows` into which the placement
    kernel writes the rows' pieces as it emits them (no object per row or piece, no
    copy: long-held rows give the garbage collector nothing to walk). A column-wise
    mixture lane's kernel codes pieces by the index of their draw in :attr:`roots`
    (the lane's :class:`~zephon_jax.engine.drawn_roots.DrawnRoots`, which keeps every
    draw an uncounted row points to; None for other lanes). The hot path pays one list
    append per block of rows made (:meth:`made_rows`), or nothing, and nothing per
    batch; ``saved`` (the counted part) is an immutable tuple, and a counted list is
    replaced, never changed, so a :meth:`snapshot` holds a reference.
    """

    __slots__ = (
        "plan", "lane", "saved", "made", "rows", "tokens", "stage", "next_stage_at", "limit",
        "roots", "_parts",
    )  # fmt: skip

    def __init__(self, plan: Any, lane: int):
        self.plan = plan
        self.lane = lane
        self.saved = empty_tally(plan)
        self._parts = _Parts(plan, lane, plan.parts_shape)
        self.made: list = []  # blocks of rows made and not counted yet, in order
        self.rows = 0  # the rows in ``made``
        self.tokens: list | None = [] if whole_records(plan) else None
        self.stage = 0  # the mixture stage of the delivered rows not counted yet
        self.next_stage_at = 0  # the step at which the stage is looked up again
        # Rows held uncounted at most: FOLD_ROWS, less with many lanes (HELD_ROWS in all).
        self.limit = min(FOLD_ROWS, max(64, HELD_ROWS // plan.num_lanes))
        self.roots: Any = None  # a column-wise mixture lane's DrawnRoots (set by the lane)

    def made_rows(self, rows: Sequence[Any], pending: int, logged: bool = False) -> None:
        """Notes ``rows`` (elements) made (``logged``: a column-wise lane's, whose pieces
        the kernel already wrote into :meth:`emitted_log`); ``pending``: the rows now
        waiting, these included."""
        if not logged:
            self.made.append(list(map(_lineage, rows)))
        self.rows += len(rows)
        if self.tokens is not None:
            self.tokens.extend(record_tokens(row.data) for row in rows)
        if self.rows - pending >= self.limit:
            self.fold(pending)

    def emitted_log(self) -> EmittedRows:
        """Where a column-wise lane's placement writes the rows it makes next (see
        :meth:`OpenRows.place <zephon_jax.operators.pack.OpenRows.place>`): the last
        block of :attr:`made`, a new one if that is not such a log."""
        made = self.made
        if not made or type(made[-1]) is not EmittedRows:
            made.append(EmittedRows())
        return made[-1]

    def logged_codes(self) -> np.ndarray:
        """The codes of the pieces of the uncounted rows the placement kernel logged (see
        :meth:`emitted_log`), as one array."""
        logs = [block.out[0, : block.size] for block in self.made if type(block) is EmittedRows]
        return np.concatenate(logs) if logs else np.zeros(0, np.int64)

    def recode_logged(self, recode: Any) -> None:
        """Replaces the logs of the uncounted rows by copies whose pieces' codes are
        ``recode(codes)`` (see :meth:`EmittedRows.recoded
        <zephon_jax.operators.pack.EmittedRows.recoded>`); a snapshot keeps the old ones."""
        self.made = [
            block.recoded(recode) if type(block) is EmittedRows else block for block in self.made
        ]

    def fold(self, pending: int, keep: bool = True) -> None:
        """Counts the delivered rows not counted yet (all made but the last ``pending``);
        ``keep=False`` passes over them (rows of skipped batches)."""
        n = self.rows - pending
        if n <= 0:
            return
        taken, self.made = take_rows(self.made, n)
        self.rows -= n
        if keep:
            tokens = None if self.tokens is None else self.tokens[:n]
            roots = None if self.roots is None else self.roots.view()
            self.saved = self._parts.count(self.saved, taken, tokens, self.stage, roots)
        if self.tokens is not None:
            self.tokens = self.tokens[n:]

    def enter_stage(self, step: int, pending: int) -> None:
        """Before the rows of global step ``step`` are taken: counts those delivered
        before in their stage, and looks up the mixture stage of the next ones."""
        mixture = self.plan.mixture
        if mixture is None:
            self.next_stage_at = sys.maxsize
            return
        self.fold(pending)
        starts = mixture.stages.starts
        self.stage = mixture.stages.index_at(step)
        after = self.stage + 1
        self.next_stage_at = starts[after] if after < len(starts) else sys.maxsize

    def skipped(self, taken: int, pending: int) -> None:
        """After a skipped step took ``taken`` rows: counts the rows delivered before it,
        passes over those, and counts the step as skipped."""
        self.fold(pending + taken)
        self.fold(pending, keep=False)
        self.saved = (self.saved[0] + 1,) + self.saved[1:]

    def undelivered(self, taken: int, pending: int) -> None:
        """After a batch that could not be completed (a finite input ended) took
        ``taken`` rows of this lane: they are not delivered."""
        self.fold(pending + taken)
        self.fold(pending, keep=False)

    def snapshot(self, pending: int) -> Any:
        """The counters as of now, counted only when needed (see :class:`LazyTally`)."""
        n = self.rows - pending
        if n <= 0:
            return self.saved
        roots = None if self.roots is None else self.roots.view()
        counting = (self._parts, self.stage, roots)
        return LazyTally(counting, self.saved, self.made, n, self.tokens)

    def load(self, saved: Any, pending: Iterable[Any]) -> None:
        """Takes the counters of a state's lane (checked against this pipeline), with
        its unbatched rows ``pending`` made and not delivered."""
        pending = list(pending)
        saved = plain_tally(saved)
        empty = empty_tally(self.plan)
        if len(saved[1]) != len(empty[1]) or len(saved[2]) != len(empty[2]):
            raise StateError(
                f"lane {self.lane}: the state's accounting has {len(saved[1]) // LEAF_FIELDS} "
                f"sources and {len(saved[2])} stage counters, this pipeline "
                f"{len(empty[1]) // LEAF_FIELDS} and {len(empty[2])}; the state was altered "
                "or comes from another pipeline"
            )
        self.saved = saved
        self.made = [list(map(_lineage, pending))] if pending else []
        self.rows = len(pending)
        if self.tokens is not None:
            self.tokens = [record_tokens(row.data) for row in pending]
        self.next_stage_at = 0


def stage_check(lanes: Mapping[int, Any], step: int) -> int:
    """Before the rows of global step ``step`` are taken from ``lanes``: each lane's
    :meth:`Tally.enter_stage`; returns the next step at which to call this again."""
    after = sys.maxsize
    for lane in lanes.values():
        lane.tally.enter_stage(step, len(lane.pending))
        after = lane.tally.next_stage_at
    return after


class LazyTally:
    """A snapshot's tally: the counters then, and the rows delivered and not yet counted
    (the first ``n`` of a list the lane only appends to until it counts it and takes a new
    one), counted once, when the saved form is asked for. Pickles as the plain saved
    tuple."""

    __slots__ = ("_counting", "_saved", "_rows", "_n", "_tokens")

    def __init__(self, counting: tuple, saved: tuple, rows: list, n: int, tokens: list | None):
        """``counting``: the lane's ``_Parts``, the rows' mixture stage and a view of the
        lane's drawn roots (or None), as :meth:`_Parts.count` takes them."""
        self._counting = counting
        self._saved = saved
        self._rows: list | None = rows
        self._n = n
        self._tokens = tokens

    def saved(self) -> tuple:
        """The plain saved form ``(skipped, sources, stages)``."""
        if self._rows is not None:
            parts, stage, roots = self._counting
            tokens = None if self._tokens is None else self._tokens[: self._n]
            taken = take_rows(self._rows, self._n)[0]
            self._saved = parts.count(self._saved, taken, tokens, stage, roots)
            self._rows = self._tokens = None
        return self._saved

    def __reduce__(self):
        return (tuple, (self.saved(),))

    def __eq__(self, other: object) -> bool:
        return plain_tally(self) == plain_tally(other)

    __hash__ = None  # type: ignore[assignment]


def plain_tally(saved: Any) -> Any:
    """A snapshot's tally as plain data (a :class:`LazyTally` counted)."""
    return saved.saved() if type(saved) is LazyTally else saved


class PartsShape:
    """What the tally counting of every lane of a plan holds alike (see :class:`_Parts`),
    made once for all the lanes: whether rows are packed of known pieces, each leaf's
    mixture component, the components' first leaves and, where every component is a
    source, each one's size and leaf. Shared by the lanes and never changed."""

    __slots__ = ("packed", "component_of", "components", "bases", "source_sizes", "leaf_of")

    def __init__(self, plan: Any):
        self.packed = packed_rows(plan)
        mixture = plan.mixture
        self.component_of: list[int] | None = None
        self.components = 0
        self.bases: list[int] = []
        self.source_sizes: np.ndarray | None = None
        self.leaf_of: np.ndarray | None = None
        if mixture is not None:
            self.component_of = [
                k for k, child in enumerate(mixture.children) for _ in leaves(child)
            ]
            self.components = len(mixture.children)
            self.bases = np.cumsum([0] + [len(leaves(c)) for c in mixture.children]).tolist()
            if all(isinstance(child, SourceNode) for child in mixture.children):
                self.source_sizes = np.array([c.size for c in mixture.children], np.int64)
                self.leaf_of = np.array(self.bases[:-1], np.int64)


class _Parts:
    """Counts delivered rows of one lane into a tally (a pure function of the rows)."""

    def __init__(self, plan: Any, lane: int, shape: PartsShape | None = None):
        self.plan = plan
        self.lane = lane
        shape = PartsShape(plan) if shape is None else shape
        self.packed = shape.packed
        self.component_of = shape.component_of
        self.components = shape.components
        self.bases = shape.bases
        self.source_sizes = shape.source_sizes
        self.leaf_of = shape.leaf_of

    def count(
        self, saved: tuple, blocks: list, tokens: list | None, stage: int, roots: Any = None
    ) -> tuple:
        """``saved`` plus the rows of ``blocks`` (see :class:`Tally`; ``tokens``: their
        record tokens where rows may be whole records) delivered in mixture stage
        ``stage``; ``roots``: a :class:`~zephon_jax.engine.drawn_roots.RootsView` of the
        draws the logged pieces' codes index (a column-wise mixture lane's), else None."""
        counts = np.array(saved[1], np.int64).reshape(-1, LEAF_FIELDS)
        stages = np.array(saved[2], np.int64)
        arrays = [block for block in blocks if type(block) is tuple and len(block[0])]
        if arrays:  # a column-wise lane's pieces
            codes = np.concatenate([block[0] for block in arrays])
            lengths = np.concatenate([block[1] for block in arrays])
            if roots is not None and self.source_sizes is not None:  # one pass
                k = self.components
                kc.count_drawn(
                    counts, stages[stage * k : (stage + 1) * k], codes, lengths, roots.array,
                    roots.base, self.leaf_of, self.source_sizes, self.lane, self.plan.num_lanes,
                )  # fmt: skip
            else:
                indices, firsts = kc.decode_codes(codes)
                if roots is None:
                    kc.add_pieces(counts, *self._leaf_epoch(indices), lengths, firsts)
                else:
                    drawn = roots.columns(indices)
                    self._add_drawn(counts, stages, stage, drawn[1], drawn[2], lengths, firsts)
        rows = list(chain.from_iterable(block for block in blocks if type(block) is list))
        if rows:
            self._add_rows(counts, stages, rows, tokens, stage)
        return (saved[0], tuple(counts.ravel().tolist()), tuple(stages.tolist()))

    def _add_rows(
        self, counts: np.ndarray, stages: np.ndarray, rows: list, tokens: list | None, stage: int
    ) -> None:
        """Counts rows given by their lineages: vectorized where they are packed rows of
        a known form, else by walking each lineage (see :meth:`_add_traced`)."""
        if self.packed and self.components:
            found = _mixture_roots(rows)
            if found is not None:
                self._add_drawn(counts, stages, stage, *found)
                return
        elif self.packed:
            found = _packed_codes(rows)
            if found is not None:
                indices, firsts = kc.decode_codes(found[0])
                kc.add_pieces(counts, *self._leaf_epoch(indices), found[1], firsts)
                return
        self._add_traced(counts, stages, rows, tokens, stage)

    def _leaf_epoch(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The leaf and epoch of the records at the lane's ``positions``."""
        plan = self.plan
        return _leaf_epoch(plan.sampler, self.lane, positions, plan.num_lanes)

    def _add_drawn(
        self,
        counts: np.ndarray,
        stages: np.ndarray,
        stage: int,
        components: np.ndarray,
        subs: np.ndarray,
        lengths: np.ndarray,
        firsts: np.ndarray,
    ) -> None:
        """Counts pieces of a mixture by tokens or stages given as arrays (each one's
        component, draw in the component, length and whether it starts its document)
        delivered in mixture stage ``stage``."""
        plan = self.plan
        sizes, leaf_of = self.source_sizes, self.leaf_of
        if sizes is not None and leaf_of is not None:  # components all sources: one pass
            leaf = leaf_of[components]
            epoch = kc.source_epochs(subs, self.lane, plan.num_lanes, sizes[components])
        else:
            leaf = np.zeros(len(subs), np.int64)
            epoch = np.zeros(len(subs), np.int64)
            for k in np.unique(components).tolist():
                at = components == k
                child = plan.mixture.children[k]
                leaf[at], epoch[at] = _leaf_epoch(child, self.lane, subs[at], plan.num_lanes)
                leaf[at] += self.bases[k]
        kc.add_pieces(counts, leaf, epoch, lengths, firsts)
        np.add.at(stages, stage * self.components + components, lengths)

    def _add_traced(
        self, counts: np.ndarray, stages: np.ndarray, rows: list, tokens: list | None, stage: int
    ) -> None:
        """Counts rows by walking each one's lineage to its records, as provenance does."""
        plan = self.plan
        pieces_of = [row_pieces(plan.operators, plain_lineage(lineage)) for lineage in rows]
        located = self._locate(pieces_of)
        component_of = self.component_of
        base = stage * self.components
        for r, pieces in enumerate(pieces_of):
            alone = len(pieces) == 1
            for piece in pieces:
                lineage = piece.lineage
                if type(lineage) is Opaque:  # a record of a user operator: no source
                    continue
                leaf, epoch = located[root_key(lineage)]
                start, stop = piece.start, piece.stop
                if stop is not None:
                    n = stop - (start or 0)
                else:
                    n = tokens[r] if alone and tokens is not None else 0
                figures = counts[leaf]
                figures[0] += n
                figures[1] += 1
                if not start and not piece.output:  # starts at its record's first token
                    figures[2] += 1
                figures[3] = max(figures[3], epoch + 1)
                if component_of is not None:
                    stages[base + component_of[leaf]] += n

    def _locate(self, pieces_of: list) -> dict[Any, tuple[int, int]]:
        """``{root: (leaf, epoch)}`` of the roots of the pieces."""
        plan = self.plan
        roots = sorted(
            {root_key(p.lineage) for ps in pieces_of for p in ps if type(p.lineage) is not Opaque}
        )
        if not roots:
            return {}
        if isinstance(plan.sampler, ScheduledMixtureNode):
            found = locate_roots(plan.sampler, self.lane, plan.num_lanes, roots)
            return {root: (leaf, epoch) for root, (leaf, _, epoch) in zip(roots, found)}
        res = resolve(plan.sampler, self.lane, np.array(roots, np.int64), plan.num_lanes)
        return dict(zip(roots, zip(res.leaf.tolist(), res.epoch.tolist())))


def take_rows(blocks: list, n: int) -> tuple[list, list]:
    """The blocks of the first ``n`` rows of ``blocks`` (see :class:`Tally`), and those
    of the rest: new lists and blocks, ``blocks`` is not changed. Taken rows of a
    :class:`EmittedRows` come as arrays ``(codes, lengths, ends)``."""
    first: list = []
    for i, block in enumerate(blocks):
        size = len(block)
        if n >= size:
            first.append(block.head(size) if type(block) is EmittedRows else block)
            n -= size
            if n == 0:
                return first, blocks[i + 1 :]
            continue
        if type(block) is list:
            head, rest = block[:n], block[n:]
        else:
            head, rest = block.split(n)
        return [*first, head], [rest, *blocks[i + 1 :]]
    return first, []


def _leaf_epoch(node: Any, lane: int, draws: np.ndarray, num_lanes: int) -> tuple:
    """The leaf and epoch of ``draws`` of sampler ``node``: for a source, its epochs by
    arithmetic alone (the shuffled record is not needed); else resolved."""
    if isinstance(node, SourceNode):
        return np.zeros(len(draws), np.int64), kc.source_epochs(draws, lane, num_lanes, node.size)
    unique, where = np.unique(draws, return_inverse=True)
    res = resolve(node, lane, unique, num_lanes)
    return res.leaf[where], res.epoch[where]


def _mixture_roots(rows: list) -> tuple | None:
    """The pieces of packed rows of a mixture by tokens or stages as arrays:
    ``(components, component draws, lengths, firsts)``; None where a parent is not a
    root ``(position, component, draw)`` or a piece of split of one."""
    components, subs, firsts = [], [], []
    try:
        for lineage in rows:
            for p in lineage_forms.parents_of(lineage):
                if lineage_forms.is_draw(p):  # a whole record
                    _, component, sub = lineage_forms.draw_parts(p)
                    firsts.append(True)
                else:  # a piece of split of one
                    root, j = lineage_forms.piece_parts(p)
                    _, component, sub = lineage_forms.draw_parts(root)
                    firsts.append(j == 0)
                components.append(component)
                subs.append(sub)
        lengths = np.fromiter(
            chain.from_iterable(map(lineage_forms.recipe_of, rows)), np.int64, len(subs)
        )
        return (
            np.array(components, np.int64),
            np.array(subs, np.int64),
            lengths,
            np.array(firsts, bool),
        )
    except (TypeError, IndexError, ValueError):
        return None


def _packed_codes(rows: list) -> tuple[np.ndarray, np.ndarray] | None:
    """The pieces of rows out of ``pack`` (lineages ``(parents, lengths)``) as two int64
    arrays: a position or a :func:`~zephon_jax.core.lineage.piece_code` per piece, and
    its length; None where a lineage has another form."""
    try:
        flat = list(chain.from_iterable(map(lineage_forms.parents_of, rows)))
        lengths = np.fromiter(
            chain.from_iterable(map(lineage_forms.recipe_of, rows)), np.int64, len(flat)
        )
    except (TypeError, IndexError, ValueError):
        return None
    codes: np.ndarray | None
    try:
        codes = np.array(flat, np.int64)
    except (TypeError, ValueError, OverflowError):
        codes = _piece_codes(flat)
    if codes is None or codes.shape != (len(flat),):
        return None
    return codes, lengths


def _piece_codes(parents: list) -> np.ndarray | None:
    """As :func:`_packed_codes`' codes for parents some of which are pieces of ``split``
    written in full, ``((position,), piece)``; None where one has another form."""
    codes = []
    for p in parents:
        if type(p) is int:
            codes.append(p)
            continue
        if not lineage_forms.is_piece(p):
            return None
        position, j = lineage_forms.piece_parts(p)
        if not (
            lineage_forms.is_position(position)
            and type(j) is int
            and 0 <= j <= lineage_forms.MAX_PIECE
        ):
            return None
        codes.append(lineage_forms.piece_code(position, j))
    try:
        return np.array(codes, np.int64)
    except OverflowError:
        return None
