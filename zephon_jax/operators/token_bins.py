"""``pack``'s open rows over a :class:`~zephon_jax.sources.TokenArray`, as arrays.

A lane that reads a token array column-wise (see :mod:`zephon_jax.engine.columns`)
keeps its open rows as :class:`TokenBins`: per row its fill and piece count, per
piece its lineage code, token start, length and source, in int64 arrays that compiled
kernels (:mod:`zephon_jax.core.compiled_kernels`) update. It saves exactly what
:class:`~zephon_jax.operators.pack.Bins` saves (the same lineages, the same
counts), so states do not tell the two apart; a restored lane's ``Bins`` is
adopted as ``TokenBins`` on its first block, and ``flush`` or ``save`` read it
back as ``Bins``. Rows are :class:`TokenRow`: starts and lengths in the token
arrays, gathered into the batch by one kernel call per batch.
"""

from __future__ import annotations

import functools
import operator
from typing import (
    Any,
    Callable,
    Iterator,
    NamedTuple,
    Protocol,
    Sequence,
    TypeGuard,
    runtime_checkable,
)

import numpy as np

from zephon_jax.core.compiled_kernels import array_addresses
from zephon_jax.core.kernels import kernels
from zephon_jax.core.lineage import (
    DrawPieceTable,
    HeldLineages,
    held_lineage,
    is_draw,
    is_piece,
    is_position,
    piece_code,
    piece_parts,
)
from zephon_jax.core.packed import (
    POSITIONS,
    SEGMENT_DTYPE,
    SEGMENT_IDS,
    PackedRow,
    PackSpec,
    assemble_rows,
)
from zephon_jax.errors import StateError
from zephon_jax.operators.pack import Bins, OpenRows
from zephon_jax.transforms.to_training import ToTrainingTransform, fresh


class TokenBins(OpenRows):
    """The open rows of one lane as arrays (see the module docstring and
    :class:`~zephon_jax.operators.pack.OpenRows`).

    A piece's leaf says which of the token arrays ``tokens`` it is in; its lineage
    code is :func:`~zephon_jax.core.lineage.piece_code` for a piece cut by ``split``
    (``cut`` > 0), else the document's position.
    """

    __slots__ = (
        "tokens",
        "field",
        "cut",
        "fill",
        "count",
        "pieces",
        "slots",
        "out",
        "row_end",
        "translate",
        "_translated",
    )

    def __init__(self, num_bins: int, tokens: tuple[np.ndarray, ...], field: str, cut: int):
        super().__init__(num_bins)
        self.tokens = tokens
        self.field = field
        self.cut = cut
        # Where the codes index a lane's drawn roots: codes -> their lineages (set by
        # the lane), and the rows' lineages translated so far.
        self.translate: Callable[[Sequence[int]], tuple] | None = None
        self._translated: dict[tuple, tuple] = {}

    def lineage_form(self) -> tuple[HeldLineages, tuple]:
        """As :meth:`Bins.lineage_form <zephon_jax.operators.pack.Bins.lineage_form>`: the
        held lineages by row (their codes, decoded when read) and each row's count."""
        form = self._form
        if form is None:
            slots = self.slots.tolist()
            counts = tuple(self.count[slots].tolist())
            codes = self.piece_array[0]
            groups = tuple(tuple(codes[i, :c].tolist()) if c else () for i, c in zip(slots, counts))
            if self.translate is None:
                form = self._form = (HeldLineages(groups, held_lineage), counts)
            else:
                form = self._form = (HeldLineages(self._translate(groups)), counts)
        return form

    def _translate(self, groups: tuple[tuple, ...]) -> tuple[tuple, ...]:
        """The rows' codes as lineages, rows unchanged since the last call read back."""
        translate, done = self.translate, self._translated
        assert translate is not None
        out = tuple(done.get(g) or translate(list(g)) if g else () for g in groups)
        self._translated = dict(zip(groups, out))
        return out

    def held_codes(self) -> tuple[np.ndarray, np.ndarray]:
        """The codes of the pieces the open rows hold, as one array, and where they are
        in ``piece_array[0]`` (a boolean mask)."""
        held = np.arange(self.piece_array.shape[2]) < np.asarray(self.count)[:, None]
        return self.piece_array[0][held], held

    def recode(self, recode: Callable[[np.ndarray], np.ndarray]) -> None:
        """Replaces the held pieces' codes by ``recode(codes)`` (the lane renumbered what
        they index, see :meth:`DrawnRoots.keep_only
        <zephon_jax.engine.drawn_roots.DrawnRoots.keep_only>`)."""
        self._changed()
        codes, held = self.held_codes()
        self.piece_array[0][held] = recode(codes)
        self._translated = {}  # keyed by the old codes

    def to_bins(self) -> Any:
        """The same open rows as :class:`~zephon_jax.operators.pack.Bins` (tokens not in
        memory are read, once for all the rows)."""

        num_bins = len(self.fill)
        bins = Bins(num_bins)
        bins.fields = (self.field,)
        bins.compact = self.cut > 0 and self.translate is None
        order = self.slots.tolist()  # row a of the Bins: row i here
        held = [self.piece_array[:, i, : int(self.count[i])] for i in order]
        codes, starts, lengths, leaves = np.concatenate(held, axis=1) if held else ((),) * 4
        tokens, starts, leaves = concrete(self.tokens, starts, lengths, leaves)
        at = 0
        for a, pieces in enumerate(held):
            c = pieces.shape[1]
            part = slice(at, at + c)
            at += c
            if not c:
                continue
            row_codes = codes[part].tolist()
            lineages = row_codes if self.translate is None else self.translate(row_codes)
            for lineage, s, n, l in zip(
                lineages, starts[part].tolist(), lengths[part].tolist(), leaves[part].tolist()
            ):
                bins.add(a, tokens[l][s : s + n], lineage, n)
        return bins

    @classmethod
    def adopt(
        cls, bins: Any, num_bins: int, plan: Any, lane: int, records_of: Callable
    ) -> TokenBins:
        """``bins`` (a :class:`~zephon_jax.operators.pack.Bins` restored from a state, or
        None) as TokenBins; ``plan``: the lane's
        :class:`~zephon_jax.engine.columns.ColumnarPlan`, whose ``reader`` locates (or
        reads) the documents, ``records_of(positions)``: the leaves and documents at lane
        positions (with ``plan.drawn``, ``records_of(roots)``, the drawn roots as the rows
        of an ``(n, 3)`` array: the indices the lane codes them by, their leaves and
        documents)."""

        def of_lanes(_: list[int], held: list) -> list[tuple]:
            if plan.drawn:
                return [records_of(roots) for roots in held]
            return [(positions, *records_of(positions)) for positions in held]

        return cls.adopt_lanes([(bins, lane)], num_bins, plan, of_lanes)[0]

    @classmethod
    def adopt_lanes(
        cls, lanes: Sequence[tuple[Any, int]], num_bins: int, plan: Any, records_of: Callable
    ) -> list[TokenBins]:
        """:meth:`adopt` of ``(bins, lane)`` for each of ``lanes`` (lanes of one ``plan``):
        ``records_of(ks, held)`` gives, for each ``lanes[ks[i]]``, whose open rows hold
        ``held[i]`` (lane positions, an int64 array; with ``plan.drawn``, drawn roots as
        the rows of an ``(n, 3)`` int64 array), the codes the lane gives them, their
        leaves and documents. The documents all the lanes' open rows hold are located by
        one ``plan.reader.starts`` call, and the rows counted for all the lanes at once
        (:class:`HeldPieces`): the same TokenBins as adopting them one by one.

        ``bins`` may also be a lane state's :class:`SavedRows` (its lineages not
        regenerated): the pieces' lengths then come from the documents' lengths, and
        nothing is read."""
        pieces = [_held_pieces_of(bins, plan, lane) for bins, lane in lanes]
        carries = [cls(num_bins, plan.tokens, plan.field, plan.cut) for _ in lanes]
        ks = [k for k, p in enumerate(pieces) if p is not None]
        parts: list[tuple] = [p for p in pieces if p is not None]
        if not parts:
            return carries
        numbers = [lanes[k][1] for k in ks]
        codes, leaves, records = map(np.concatenate, zip(*records_of(ks, [p[3] for p in parts])))
        starts, where = _starts_once(plan.reader, leaves, records)
        sizes = [len(p[0]) for p in parts]
        rows, js = (np.concatenate([p[i] for p in parts]) for i in (0, 1))
        found = _held_lengths([p[2] for p in parts], sizes, plan, (leaves, records, js), numbers)
        lengths, checked = found
        held = HeldPieces(np.repeat(np.arange(len(parts)), sizes), rows, lengths, num_bins)
        held.check_fill(checked, plan.packing.spec.seq_len, numbers)
        if plan.cut:
            codes = piece_code(codes, js)
        block = np.stack([codes, starts + js * plan.cut, lengths, where])
        for i, (k, part) in enumerate(zip(ks, held.parts(sizes), strict=True)):
            carries[k]._fill_held(rows[part], held.slot[part], block[:, part], held, i)
        return carries

    def _fill_held(
        self, rows: np.ndarray, slots: np.ndarray, block: np.ndarray, held: HeldPieces, i: int
    ) -> None:
        """Sets the open rows to the held pieces ``block`` (their codes, starts, lengths
        and leaves as rows), in open rows ``rows`` at places ``slots``: those of lane
        ``i`` of ``held``."""
        self._changed()
        while held.most(i) > self.piece_array.shape[2]:
            self.grow_rows()
        self.piece_array[:, rows, slots] = block
        self.count[:] = held.counts[i]
        self.fill[:] = held.fill[i]


class HeldPieces:
    """The pieces the open rows of several lanes hold, row by row and lane after lane,
    counted for all the lanes at once: each row's count and fill (``counts[i]``,
    ``fill[i]``: lane ``i``'s rows) and each piece's place in its row (``slot``)."""

    def __init__(self, lane: np.ndarray, rows: np.ndarray, lengths: np.ndarray, num_bins: int):
        """``lane``, ``rows``, ``lengths``: each piece's lane (0, 1, ...), row (ascending
        within a lane) and length; ``num_bins``: the rows of each lane."""
        if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= num_bins):
            raise StateError(f"the state holds open rows beyond the {num_bins} of pack")
        num_lanes = int(lane[-1]) + 1 if len(lane) else 0
        key = lane * num_bins + rows
        counts = np.bincount(key, minlength=num_lanes * num_bins)
        self.slot = np.arange(len(key)) - (np.cumsum(counts) - counts)[key]
        self.counts = counts.reshape(num_lanes, num_bins)
        fill = np.bincount(key, weights=lengths, minlength=num_lanes * num_bins)
        self.fill = fill.astype(np.int64).reshape(num_lanes, num_bins)
        self._most = self.counts.max(axis=1).tolist() if num_lanes else []

    def most(self, i: int) -> int:
        """The most pieces a row of lane ``i`` holds."""
        return self._most[i]

    @staticmethod
    def parts(sizes: Sequence[int]) -> list[slice]:
        """Each lane's slice of the pieces, given each one's number of pieces."""
        ends = np.cumsum(sizes).tolist()
        return [slice(end - size, end) for size, end in zip(sizes, ends)]

    def check_fill(self, checked: np.ndarray, seq_len: int, lane_ids: Sequence[int]) -> None:
        """Raises unless each open row of the lanes ``checked`` marks fits in a row of
        ``seq_len``; names the first lane with a row over (``lane_ids[i]``: lane ``i``'s
        number), and its fullest row."""
        over = np.flatnonzero((self.fill > seq_len).any(axis=1) & checked)
        if over.size:
            i = int(over[0])
            row = int(self.fill[i].argmax())
            raise StateError(
                f"lane {lane_ids[i]}: the state's open row {row} of pack holds "
                f"{int(self.fill[i, row])} tokens, more than a row of {seq_len}; the state "
                "was altered or the sources changed"
            )


class SavedRows(NamedTuple):
    """A lane state's open rows of ``pack``, as it holds them: the lineages of the held
    pieces, row after row, and each row's piece count (its ``Saved`` form, lineages not
    regenerated); ``next_position``: the lane's, which every piece's must precede."""

    lineages: Sequence[Any]
    counts: tuple[int, ...]
    next_position: int


def _held_lengths(
    given: list, sizes: list[int], plan: Any, pieces: tuple, numbers: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """The lengths of the held pieces of several lanes, lane after lane: lane ``i``'s
    ``given[i]``, or where that is None (a state's open rows) its documents' lengths
    cut as ``plan`` cuts them, checked (see :func:`_piece_lengths`); and which lanes'
    came from their documents. ``sizes``: each lane's number of pieces; ``pieces``:
    their leaves, records and piece numbers; ``numbers``: the lanes' numbers."""
    leaves, records, js = pieces
    checked = np.array([g is None for g in given])
    from_documents = np.repeat(checked, sizes)
    lengths = np.zeros(len(js), np.int64)
    if not checked.all():
        lengths[~from_documents] = np.concatenate([g for g in given if g is not None])
    if checked.any():
        documents = plan.reader.lengths(leaves[from_documents], records[from_documents])
        lanes = np.repeat(np.array(numbers, np.int64), sizes)[from_documents]
        lengths[from_documents] = _piece_lengths(documents, js[from_documents], plan, lanes)
    return lengths, checked


def _piece_lengths(
    documents: np.ndarray, js: np.ndarray, plan: Any, lanes: np.ndarray
) -> np.ndarray:
    """The lengths of pieces ``js`` of documents of ``documents`` tokens (the documents
    themselves without a cut); raises if a piece is not one of its document's, naming
    its lane (``lanes``: each piece's)."""
    cut = plan.cut
    lengths = np.minimum(documents - js * cut, cut) if cut else documents
    bad = np.flatnonzero(lengths <= 0)
    if bad.size:
        k = int(bad[0])
        raise StateError(
            f"lane {int(lanes[k])}: the state holds piece {int(js[k])} of a document of "
            f"{int(documents[k])} tokens in an open row of pack, which this pipeline never "
            "makes; the state was altered or the sources changed"
        )
    return lengths


def _starts_once(
    reader: Any, leaves: np.ndarray, records: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``reader.starts(leaves, records)``, each distinct document located once."""
    span = int(records.max()) + 1
    distinct, inverse = np.unique(leaves * span + records, return_inverse=True)
    starts, where = reader.starts(distinct // span, distinct % span)
    inverse = inverse.reshape(-1)
    return starts[inverse], where[inverse]


def _held_pieces_of(bins: Any, plan: Any, lane: int) -> tuple | None:
    """``(rows, pieces, lengths, roots)`` of the pieces ``bins`` (a Bins, a
    :class:`SavedRows` or None) hold, by row (arrays; ``lengths`` None for a
    ``SavedRows``; ``roots``: their lane positions, or with ``plan.drawn`` their drawn
    roots as the rows of an ``(n, 3)`` array); None if they hold none."""
    if bins is None:
        return None
    if type(bins) is SavedRows:
        return _saved_pieces(bins, plan, lane)
    columns = list(zip(*_contents(bins)))
    if not columns:
        return None
    rows, lineages, lengths = columns
    roots, js = _roots_and_pieces(lineages, plan.cut, plan.drawn, lane)
    return (
        np.array(rows, np.int64),
        np.array(js, np.int64),
        np.array(lengths, np.int64),
        _root_array(roots, plan.drawn),
    )


def _saved_pieces(saved: SavedRows, plan: Any, lane: int) -> tuple | None:
    """:func:`_held_pieces_of` of a lane state's open rows (their lengths None); raises
    where a piece points past the positions the lane has read."""
    if not saved.lineages:
        return None
    table = _table_pieces(saved.lineages, plan)
    if table is None:
        lineages = list(map(held_lineage, saved.lineages))
        found = _roots_and_pieces(lineages, plan.cut, plan.drawn, lane)
        roots, js = _root_array(found[0], plan.drawn), np.array(found[1], np.int64)
    else:
        roots, js = table
    furthest = int((roots[:, 0] if plan.drawn else roots).max())
    if furthest >= saved.next_position:
        raise StateError(
            f"lane {lane}: the state points to lane-local position {furthest}, but the "
            f"lane has read only positions before {saved.next_position}; the state was "
            "altered"
        )
    rows = np.repeat(np.arange(len(saved.counts), dtype=np.int64), saved.counts)
    return rows, js, None, roots


def _table_pieces(lineages: Any, plan: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """The drawn roots and piece numbers of held pieces given as a
    :class:`~zephon_jax.core.lineage.DrawPieceTable`, as arrays; None where they are
    not one, or hold a negative piece number (:func:`_roots_and_pieces` then says which)."""
    if type(lineages) is not DrawPieceTable or not (plan.drawn and plan.cut):
        return None
    array = lineages.array
    js = array[:, 3]
    if int(js.min()) < 0:
        return None
    return array[:, :3], js


def _root_array(roots: list, drawn: bool) -> np.ndarray:
    """Roots as :func:`_held_pieces_of` gives them: an array of positions, or of drawn
    roots, one row each."""
    return np.array(roots, np.int64).reshape(-1, 3) if drawn else np.array(roots, np.int64)


def _contents(bins: Any) -> Iterator[tuple[int, Any, int]]:
    """``(row, lineage, length)`` of each piece a Bins holds, row by row."""
    for i in range(len(bins.fill)):
        for _, lineage, n in bins.contents(i):
            yield i, held_lineage(lineage), n


def _roots_and_pieces(lineages: Sequence, cut: int, drawn: bool, lane: int) -> tuple[list, list]:
    """The position or drawn root and the piece number of each of the held pieces
    ``lineages``; raises if one is not a lineage this pipeline makes. The lineages are
    checked in passes over all of them (a restore with many lanes checks some 100 a
    lane), one by one only where a pass finds one of another form, to name it."""
    found = _pieces_of_pointers(lineages, cut, drawn)
    return _pieces_one_by_one(lineages, cut, drawn, lane) if found is None else found


def _pieces_of_pointers(lineages: Sequence, cut: int, drawn: bool) -> tuple[list, list] | None:
    """``(roots, pieces)`` of ``lineages`` where every one is a piece of a root (``cut``)
    or a root, each root a draw (``drawn``) or a position, checked in passes over all;
    None where one is of another form (:func:`_pieces_one_by_one` then says which)."""
    if cut:
        if set(map(type, lineages)) != {tuple} or set(map(len, lineages)) != {2}:
            return None
        parents, js = list(map(_first, lineages)), list(map(_second, lineages))
        if set(map(type, parents)) != {tuple} or set(map(len, parents)) != {1}:
            return None
        if set(map(type, js)) != {int} or min(js) < 0:
            return None
        roots = list(map(_first, parents))
    else:
        roots, js = list(lineages), [0] * len(lineages)
    if drawn:
        fits = set(map(type, roots)) == {tuple} and set(map(len, roots)) == {3}
    else:
        fits = set(map(type, roots)) == {int} and min(roots) >= 0
    return (roots, js) if fits else None


def _pieces_one_by_one(lineages: Sequence, cut: int, drawn: bool, lane: int) -> tuple[list, list]:
    """:func:`_pieces_of_pointers`, one lineage at a time: raises naming the first
    lineage that is not one this pipeline makes."""
    roots, js = [], []
    for lineage in lineages:
        root: Any = None
        j = 0
        if cut and is_piece(lineage):
            root, j = piece_parts(lineage)
        elif not cut:
            root = lineage
        piece_number = type(j) is int and j >= 0  # (1.5, None, -1: an altered state)
        if not piece_number or not (is_draw(root) if drawn else is_position(root)):
            raise StateError(
                f"lane {lane}: the state holds {lineage!r} in an open row of "
                f"pack, which this pipeline never makes; the state was altered"
            )
        roots.append(root)
        js.append(j)
    return roots, js


_first = operator.itemgetter(0)
_second = operator.itemgetter(1)


@runtime_checkable
class GatheredRows(Protocol):
    """Rows that :meth:`TokenRow.gather_batch` gathers by one kernel call: a sequence of
    :class:`TokenRow` that gives its pieces itself, read from the arrays its rows point
    into (see :class:`~zephon_jax.engine.token_rows.RunRows`, the rows of a batch of a
    column-wise lane); any other sequence is assembled row by row."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> TokenRow: ...

    def one_kind(self) -> bool:
        """Whether the rows have one spec, one set of token arrays and one
        ``to_training`` (the same objects)."""
        ...

    def pieces(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows' pieces one after the other, as one int64 array of their starts,
        lengths and (with several token arrays) leaves, and each row's end in it."""
        ...


_GATHERED_TYPES: dict[type, bool] = {}


def _is_gathered(rows: Sequence[Any]) -> TypeGuard[GatheredRows]:
    """Whether ``rows`` are :class:`GatheredRows`, checked once per type (a protocol
    check costs microseconds; its members are the class's methods)."""
    kind = type(rows)
    known = _GATHERED_TYPES.get(kind)
    if known is None:
        known = _GATHERED_TYPES[kind] = isinstance(rows, GatheredRows)
    return known


class TokenRow(PackedRow):
    """A packed row of pieces of token arrays: their starts and lengths, and which of
    ``tokens`` each is in (``leaves``; None: all in the first).

    The pieces are columns ``[begin, end)`` of ``block``, an int64 array of their
    starts, their lengths and, where the pieces are in several arrays (three rows),
    their leaves (two rows: all in the first), which the rows of one placement share: a
    row waiting to be batched is then one object pointing into an array, which the
    garbage collector does not walk, not a list or tuple of ints per column (see
    :meth:`of` for a row of its own pieces). Nothing writes to a block after its rows
    are made.

    With ``training`` (a :class:`~zephon_jax.transforms.to_training.ToTrainingTransform`
    that follows ``pack``), the row reads as that transform's output fields, and a
    batch of such rows is shifted as a whole after the gather (the same bytes as the
    transform row by row)."""

    __slots__ = ("tokens", "block", "begin", "end", "training")

    def __init__(
        self,
        spec: PackSpec,
        fields: tuple[str],
        tokens: tuple[np.ndarray, ...],
        block: np.ndarray,
        begin: int,
        end: int,
        training: ToTrainingTransform | None = None,
    ):
        self.spec = spec
        self.fields = fields
        self.tokens = tokens
        self.block = block
        self.begin = begin
        self.end = end
        self.training = training
        self._data = None

    def __reduce__(self) -> tuple:
        """Pickles the row with its own pieces only (not its whole block)."""
        own = self.block[:, self.begin : self.end].copy()
        arguments = (self.spec, self.fields, self.tokens, own, 0, own.shape[1])
        return (TokenRow, (*arguments, self.training))

    @property
    def starts(self) -> list[int]:
        """The pieces' starts in their token arrays."""
        return self.block[0, self.begin : self.end].tolist()

    @property
    def lengths(self) -> tuple[int, ...]:  # type: ignore[override]
        """The pieces' lengths."""
        return tuple(self.block[1, self.begin : self.end].tolist())

    @property
    def leaves(self) -> list[int] | None:
        """Which token array each piece is in (None: all in the first)."""
        if self.block.shape[0] < 3:
            return None
        return self.block[2, self.begin : self.end].tolist()

    def keys(self):  # noqa: D102 - output names, without assembling
        training = self.training
        return super().keys() if training is None else list(training.output_names())

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    @property
    def pieces(self) -> tuple:  # type: ignore[override]
        """The pieces as views of the token arrays (for the general assembly)."""
        lengths = self.lengths or ()
        tokens, starts, leaves = concrete(self.tokens, self.starts, lengths, self.leaves)
        if leaves is None:
            return tuple(tokens[0][s : s + n] for s, n in zip(starts, lengths))
        return tuple(tokens[l][s : s + n] for s, n, l in zip(starts, lengths, leaves))

    @staticmethod
    def assemble_batch(rows: Sequence[Any], pool: Any = None) -> dict[str, np.ndarray] | None:
        """``rows`` as a batch by one compiled gather, or None where they are not
        :class:`GatheredRows` of one kind (the general assembly then runs).
        Rows with ``training`` are shifted in the gather where the transform can be fused
        into it (see :meth:`~zephon_jax.transforms.to_training.ToTrainingTransform.fused_pad`),
        else after it (after the general assembly where the gather does not take them)."""
        training = rows[0].training
        packed = TokenRow.gather_batch(rows, pool)
        if training is None:
            return packed
        empty = fresh if pool is None else pool.empty
        if packed is None:
            plain = [PackedRow(row.spec, row.fields, row.pieces, row.lengths) for row in rows]
            return training.apply_batch(assemble_rows(plain), empty)
        if _fused(rows[0]) is not None:
            return training.named_batch(packed)
        return training.apply_batch(packed, empty)

    @staticmethod
    def gather_batch(rows: Sequence[Any], pool: Any = None) -> dict[str, np.ndarray] | None:
        """The packed fields of ``rows`` by one compiled gather, or None (see
        :meth:`assemble_batch`); where ``to_training`` is fused into the gather, its fields
        under the default names instead (see
        :func:`~zephon_jax.transforms.to_training.shifted`)."""
        compiled = kernels()
        if compiled is None or not _is_gathered(rows) or not rows.one_kind():
            return None
        first = rows[0]
        tokens, spec, fields = first.tokens, first.spec, first.fields
        pieces, ends = rows.pieces()
        pad_id = _fused(first)
        lengths = np.ascontiguousarray(pieces[1])
        leaves = np.ascontiguousarray(pieces[2]) if pieces.shape[0] > 2 else None
        starts = np.ascontiguousarray(pieces[0])
        addresses, like, held = piece_addresses(tokens, starts, lengths, leaves)
        (field,) = fields
        shape = (len(rows), spec.seq_len)

        def empty(name: str, dtype: Any) -> np.ndarray:
            return np.empty(shape, dtype) if pool is None else pool.empty(name, shape, dtype)

        if pad_id is None:
            dtype = spec.dtype(field)
            names = (field, field + SEGMENT_IDS, field + POSITIONS)
            targets = loss_mask = np.empty((len(rows), 0), np.int32)  # no shift
        else:
            dtype = np.dtype(np.int32)
            names = ("inputs", "segment_ids", "positions")
            targets, loss_mask = empty("targets", np.int32), empty("loss_mask", np.float32)
        low, high = value_bounds(like.dtype, dtype)
        values = empty(names[0], dtype)
        segment_ids = empty(names[1], SEGMENT_DTYPE)
        positions = empty(names[2], SEGMENT_DTYPE)
        fits = compiled.gather(
            addresses,
            like,
            lengths,
            ends,
            spec.counting(),
            low,
            high,
            values,
            segment_ids,
            positions,
            targets,
            loss_mask,
            0 if pad_id is None else pad_id,
        )
        del held  # the memory the addresses are in, held until the gather returned
        if not fits:  # a token the output dtype cannot hold: the general assembly says which
            return None
        if pad_id is None:
            return dict(zip(names, (values, segment_ids, positions)))
        return {
            "inputs": values,
            "targets": targets,
            "loss_mask": loss_mask,
            "segment_ids": segment_ids,
            "positions": positions,
        }


def _fused(row: TokenRow) -> int | None:
    """The pad id where ``row``'s ``to_training`` is fused into the gather, else None."""
    training = row.training
    if training is None:
        return None
    tokens: Any = row.tokens  # the token arrays, or a reader of them (see concrete)
    return training.fused_pad(tokens[0].dtype if type(tokens) is tuple else tokens.dtype)


def concrete(
    tokens: Any, starts: Any, lengths: Any, leaves: Any
) -> tuple[tuple[np.ndarray, ...], Any, Any]:
    """``(tokens, starts, leaves)`` of pieces ``[starts[k], starts[k] + lengths[k])`` of
    ``tokens[leaves[k]]`` (``leaves`` None: all of ``tokens[0]``), with the token arrays
    in memory: as given where ``tokens`` is a tuple of arrays, else read now by
    ``tokens.materialize`` (a reader whose pieces are read when rows are gathered, see
    :mod:`zephon_jax.engine.column_sources`), which gives new starts into one array
    per leaf."""
    if type(tokens) is tuple:
        return tokens, starts, leaves
    tokens, at = tokens.materialize(starts, lengths, leaves)
    return tokens, at, leaves


def piece_addresses(
    tokens: Any, starts: np.ndarray, lengths: np.ndarray, leaves: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, Any]:
    """For the gather kernel: ``(addresses, like, held)``, the byte address of each piece
    ``[starts[k], starts[k] + lengths[k])`` of ``tokens[leaves[k]]`` (``leaves`` None:
    of ``tokens[0]``), an empty array of the tokens' dtype, and what holds the memory the
    addresses point into (keep it until the gather returns). ``tokens`` is a tuple of
    token arrays, or a reader (see :func:`concrete`) that gives them itself, reading the
    pieces first where they are not in memory."""
    if type(tokens) is tuple:
        return array_addresses(tokens, starts, leaves)
    return tokens.piece_addresses(starts, lengths, leaves)


@functools.lru_cache(maxsize=64)  # (asked at every batch, of a few pairs of dtypes)
def value_bounds(source: np.dtype, out: np.dtype) -> tuple[int, int]:
    """``(low, high)``: the values of integer dtype ``out`` that tokens of integer dtype
    ``source`` must stay within when ``source`` does not always fit; ``(0, -1)`` (no
    check) when it does."""
    if np.can_cast(source, out, "safe"):
        return 0, -1
    info = np.iinfo(out)
    return int(info.min), int(info.max)
